"""tvm_armq: quantized TFLite models compiled by Apache TVM into integer aarch64 code.

Importing the package is cheap: it loads neither TVM nor TensorFlow. Submodules
(``device``, ``build``, ``zoo``, ``tflite_model``, ``intrinsics``, ``schedules``)
load on first use.
"""

import importlib

from .targets import LEVELS, IsaLevel, level, target

__version__ = "0.1.0"
__all__ = ["LEVELS", "IsaLevel", "level", "target"]

_LAZY = {"device", "build", "zoo", "tflite_model", "intrinsics", "schedules", "cli"}


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tvm_armq' has no attribute {name!r}")
