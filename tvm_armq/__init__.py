"""tvm_armq: quantized TFLite models compiled by Apache TVM into integer aarch64 code.

Importing the package installs its hook into ``tvm.compile`` (``hooks.py``): from then
on, a quantized model compiled for an aarch64 LLVM target runs tvm_armq's integer
kernels; every other target compiles exactly as before. The import loads TVM but not
TensorFlow; submodules (``device``, ``build``, ``zoo``, ...) load on first use.

    import tvm_armq
    exe = tvm_armq.compile_tflite("model.tflite", tvm_armq.target("i8mm"))
    for layer in tvm_armq.inspect("model.tflite", "i8mm"): print(layer.line())
"""

import importlib

from . import hooks as _hooks
from .targets import LEVELS, IsaLevel, level, target

__version__ = "0.1.0"
__all__ = ["LEVELS", "IsaLevel", "level", "target", "compile_tflite", "inspect"]

_LAZY = {"device", "build", "zoo", "frontend", "intrinsics", "schedules", "cli",
         "passes", "tuning"}
_LAZY_FUNCS = {"compile_tflite": "build", "inspect": "build"}

_hooks.install()


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY_FUNCS:
        return getattr(importlib.import_module(f".{_LAZY_FUNCS[name]}", __name__), name)
    raise AttributeError(f"module 'tvm_armq' has no attribute {name!r}")
