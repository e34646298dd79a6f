"""Compile a TFLite model for aarch64 and run it on a device.

The path a model takes, in order:

    .tflite --import_tflite--> Relax IRModule (QDQ: dequantize -> float op -> quantize)
            --compile_tflite--> Relax VM executable for an aarch64 target
            --export_aarch64--> shared library cross-linked with aarch64-linux-gnu-g++
            --run_on_device--> outputs, from the Relax VM on an RPC device

Everything here is plain TVM 0.27 API; what tvm_armq changes about the code
that ``tvm.compile`` produces for aarch64 comes from its hooks, not from here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .targets import UnknownIsaError, target as preset
from .tflite_model import TFLiteModel

CROSS_CXX = "aarch64-linux-gnu-g++"


def resolve_target(target):
    """A ``tvm.target.Target`` from a preset name, a JSON dict, or a Target."""
    import tvm

    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and not target.lstrip().startswith("{"):
        try:
            return tvm.target.Target(preset(target))
        except UnknownIsaError:
            if " " not in target and target not in ("llvm", "c"):
                raise
    return tvm.target.Target(target)


def describe_target(target) -> str:
    """A short label of a target for messages: kind, triple, cpu and features."""
    attrs = target.attrs
    parts = [target.kind.name] + [str(attrs[k]) for k in ("mtriple", "mcpu") if k in attrs]
    if "mattr" in attrs and len(attrs["mattr"]):
        parts.append(",".join(str(m) for m in attrs["mattr"]))
    return " ".join(parts)


def import_tflite(model) -> "tvm.IRModule":
    """The Relax module of a TFLite model, as TVM's TFLite frontend imports it."""
    from tvm.relax.frontend.tflite import from_tflite

    m = TFLiteModel.load(model)
    mod = from_tflite(m.flatbuffer())
    return mod[0] if isinstance(mod, tuple) else mod


PRECISIONS = ("int8", "bf16")


class UnsupportedTarget(ValueError):
    """A tvm_armq-only option was asked of a target tvm_armq does not compile for."""


def compile_tflite(model, target, *, tuning_database=None, precision: str = "int8",
                   report: list | None = None, strict: bool = False):
    """Import a TFLite model and compile it for ``target``; returns the executable.

    For an aarch64 LLVM target (a preset name such as "i8mm" or "cortex-a76", a JSON
    dict, or a Target) quantized conv2d / depthwise / dense layers run tvm_armq's integer
    kernels, scheduled from ``tuning_database`` (a ``tune`` work directory) where it has
    them and with default knobs elsewhere. ``report`` (a list) receives what each
    quantized layer became (``integrate.Lowered`` / ``integrate.Fallback``); a layer with
    no integer kernel stays float (QDQ) and runs correctly, unless ``strict``, which raises
    ``tvm.error.OpNotImplemented`` naming every such layer, its op and why.
    ``precision="bf16"`` also runs the fp32 conv2d / dense of a float model as bf16 GEMMs
    (``bfmmla``, weights rounded to bf16 at compile time; needs +bf16, the i8mm level). Any other
    target compiles with stock TVM, exactly as ``tvm.compile`` would.
    """
    import tvm

    from . import hooks, integrate

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    tgt = resolve_target(target)
    mod = import_tflite(model)
    if not hooks.applies_to(tgt):
        if tuning_database is not None or precision != "int8":
            raise UnsupportedTarget(
                f"tuning databases and precision={precision!r} need an aarch64 LLVM target "
                f"(tvm_armq's kernels); {describe_target(tgt)} compiles with stock TVM only")
        return tvm.compile(mod, target=tgt)
    database = _load_database(tuning_database)
    layers = [] if report is None else report
    with tgt:
        mod = integrate.quantized_to_integer(tgt, database=database, report=layers)(mod)
        if precision == "bf16":  # float conv2d / dense of a float model -> bfmmla GEMMs
            from . import integrate_bf16

            mod = integrate_bf16.float_to_bf16(tgt, report=layers)(mod)
    fallbacks = [r for r in layers if isinstance(r, integrate.Fallback)]
    if strict and fallbacks:
        raise tvm.error.OpNotImplemented(
            f"{len(fallbacks)} quantized layer(s) have no tvm_armq integer kernel for "
            f"{describe_target(tgt)}:\n"
            + "\n".join("  " + r.line() for r in fallbacks))
    return tvm.compile(mod, target=tgt, relax_pipeline=hooks.stock_pipeline())


def _load_database(tuning_database):
    """The MetaSchedule database of a ``tune`` work directory, or None without one."""
    if tuning_database is None:
        return None
    from . import tuning

    return tuning.load_database(tuning_database)


def inspect(model, target, *, tuning_database=None) -> list:
    """What each quantized layer of ``model`` becomes for ``target``, in model order:
    ``integrate.Lowered`` (op, shapes, the kernel's name in the selection table, tuned or
    not) or ``integrate.Fallback`` (op and why it stays float). Nothing is built."""
    from . import hooks, integrate

    tgt = resolve_target(target)
    if not hooks.applies_to(tgt):
        raise UnsupportedTarget(f"{describe_target(tgt)} is not an aarch64 LLVM target: "
                                "tvm_armq leaves the "
                                "whole model to stock TVM")
    database = _load_database(tuning_database)
    report: list = []
    with tgt:
        integrate.quantized_to_integer(tgt, database=database, report=report,
                                       schedule=False)(import_tflite(model))
    return report


def export_aarch64(executable, path: str | os.PathLike) -> Path:
    """Write ``executable`` as an aarch64 shared library, cross-linked, loadable on a board."""
    from tvm.support import cc

    if not shutil.which(CROSS_CXX):
        raise RuntimeError(f"{CROSS_CXX} not found: install Debian's g++-aarch64-linux-gnu "
                           "(or run `python -m tvm_armq device provision`)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(path), fcompile=cc.cross_compiler(CROSS_CXX))
    return path


def _to_numpy(value) -> list[np.ndarray]:
    """The VM's result (one tensor or a tuple of them) as a flat list of arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out = []
    for v in value:
        out += _to_numpy(v)
    return out


class DeviceModel:
    """A model library loaded once into the Relax VM of an RPC session; call it per input."""

    def __init__(self, session, library: str | os.PathLike, entry: str = "main"):
        from tvm.runtime.vm import VirtualMachine

        library = Path(library)
        # Upload once: overwriting a library the device process has loaded crashes it.
        session.upload(str(library))
        self.dev = session.cpu(0)
        self.vm = VirtualMachine(session.load_module(library.name), self.dev)
        self.entry = entry

    def __call__(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        import tvm

        args = [tvm.runtime.tensor(np.ascontiguousarray(x), self.dev) for x in inputs]
        return _to_numpy(self.vm[self.entry](*args))


def run_on_device(session, library: str | os.PathLike, inputs: list[np.ndarray],
                  entry: str = "main") -> list[np.ndarray]:
    """Upload ``library`` to an RPC ``session``, run ``entry`` in the Relax VM, fetch outputs."""
    return DeviceModel(session, library, entry)(inputs)


def compile_and_run(model, level: str, session, inputs: list[np.ndarray] | None = None,
                    workdir: str | os.PathLike | None = None,
                    report: list | None = None) -> list[np.ndarray]:
    """Compile ``model`` for ISA ``level``, run it on ``session``, return the outputs
    (``report`` as for ``compile_tflite``)."""
    m = TFLiteModel.load(model)
    if inputs is None:
        inputs = m.random_inputs()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        lib = export_aarch64(compile_tflite(m, level, report=report), Path(tmp) / "model.so")
        return run_on_device(session, lib, inputs)
