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

from .targets import LEVELS, UnknownIsaError, target as preset
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


class UnsupportedModel(ValueError):
    """A valid TFLite model that TVM's TFLite frontend cannot import (a tensor type or an
    operator it has no conversion for); the message names the model and what is at fault."""


# Tensor types TVM 0.27's TFLite frontend imports (tflite.TensorType names). int16
# activations (TFLite's 16x8 quantization) and the rest stop it with a bare TypeError.
IMPORTABLE_TYPES = ("FLOAT32", "INT8", "UINT8", "INT32", "INT64", "BOOL")


def _unsupported_tensor(m: TFLiteModel) -> str | None:
    """What TVM's frontend would choke on among the model's tensor types, said plainly."""
    import tflite

    names = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}
    fb = m.flatbuffer()
    for g in range(fb.SubgraphsLength()):
        graph = fb.Subgraphs(g)
        for i in range(graph.TensorsLength()):
            t = graph.Tensors(i)
            kind = names.get(t.Type(), str(t.Type()))
            if kind not in IMPORTABLE_TYPES:
                hint = (" (16x8 quantization: int16 activations, int8 weights)"
                        if kind == "INT16" else "")
                return (f"tensor {i} ({(t.Name() or b'').decode(errors='replace')!r}) is "
                        f"{kind.lower()}{hint}; TVM's TFLite frontend imports "
                        f"{', '.join(k.lower() for k in IMPORTABLE_TYPES)} tensors: convert "
                        "the model with int8 quantization")
    return None


def _dynamic_range_op(m: TFLiteModel) -> str | None:
    """The first operator of a dynamic-range quantized model (float32 activations, int8
    weights quantized offline, requantized at run time by TFLite), said plainly."""
    import tflite

    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    fb = m.flatbuffer()
    graph = fb.Subgraphs(0)
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        tensors = [graph.Tensors(t) if t >= 0 else None for t in op.InputsAsNumpy()]
        if not tensors or tensors[0] is None:
            continue
        first = tensors[0]
        weights = [t for t in tensors[1:] if t is not None and t.Type() == tflite.TensorType.INT8
                   and t.Quantization() is not None and t.Quantization().ScaleLength() > 0]
        if first.Type() == tflite.TensorType.FLOAT32 and weights:
            code = fb.OperatorCodes(op.OpcodeIndex())
            kind = names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "?")
            return (f"operator {i} ({kind}) is dynamic-range quantized (float32 activations, "
                    "int8 weights): tvm_armq compiles full-integer models; convert the model "
                    "with a representative dataset (TFLite's full integer quantization)")
    return None


def import_tflite(model) -> "tvm.IRModule":
    """The Relax module of a TFLite model, as TVM's TFLite frontend imports it.

    Raises ``UnsupportedModel`` naming the tensor or operator when the frontend cannot
    import the model (it would otherwise fail with a bare TypeError or KeyError)."""
    from tvm.relax.frontend.tflite import from_tflite

    m = TFLiteModel.load(model)
    problem = _unsupported_tensor(m) or _dynamic_range_op(m)
    if problem:
        raise UnsupportedModel(f"{m.label}: {problem}")
    try:
        mod = from_tflite(m.flatbuffer())
    except Exception as e:  # noqa: BLE001 - whatever the frontend trips on, it is the model
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UnsupportedModel(f"{m.label}: TVM's TFLite frontend cannot import it "
                               f"({type(e).__name__}: {first})") from e
    return mod[0] if isinstance(mod, tuple) else mod


PRECISIONS = ("int8", "bf16")


class UnsupportedTarget(ValueError):
    """A tvm_armq-only option was asked of a target tvm_armq does not compile for."""


class MissingFeature(UnsupportedTarget):
    """The target lacks an instruction set extension the request needs (bf16 on neon)."""


class OutputError(OSError):
    """The compiled library cannot be written where asked; the message says why."""


class TuningTargetMismatch(ValueError):
    """A tuning database was tuned for another target than the one being compiled for."""


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
    if strict and not hooks.applies_to(tgt):
        raise UnsupportedTarget(
            f"strict: {describe_target(tgt)} is not a target tvm_armq compiles for (an "
            "aarch64 LLVM target: neon, dotprod, i8mm or an aarch64 core), so no layer would "
            "run on tvm_armq kernels")
    if precision == "bf16" and hooks.applies_to(tgt):
        from .intrinsics import kernels

        if not kernels.target_has(tgt, "has_bf16"):
            raise MissingFeature(
                f"precision bf16 runs bfmmla, which needs the bf16 extension (+bf16); "
                f"{describe_target(tgt)} lacks it: use the i8mm level (--isa i8mm) or "
                "precision int8")
    mod = import_tflite(model)
    if not hooks.applies_to(tgt):
        if tuning_database is not None or precision != "int8":
            raise UnsupportedTarget(
                f"tuning databases and precision={precision!r} need an aarch64 LLVM target "
                f"(tvm_armq's kernels); {describe_target(tgt)} compiles with stock TVM only")
        return tvm.compile(mod, target=tgt)
    layers = [] if report is None else report
    mod = lower(mod, tgt, database=_load_database(tuning_database, tgt), precision=precision,
                report=layers)
    fallbacks = [r for r in layers if isinstance(r, integrate.Fallback)]
    if strict and fallbacks:
        raise tvm.error.OpNotImplemented(
            f"{len(fallbacks)} quantized layer(s) have no tvm_armq integer kernel for "
            f"{describe_target(tgt)}:\n"
            + "\n".join("  " + r.line() for r in fallbacks))
    if strict and not layers:
        raise tvm.error.OpNotImplemented(
            f"strict: {TFLiteModel.load(model).label} has no quantized layer, so nothing "
            "would run on tvm_armq's integer kernels (a float model: quantize it to int8, "
            "or compile it with precision bf16 at the i8mm level)")
    return tvm.compile(mod, target=tgt, relax_pipeline=hooks.stock_pipeline())


def lower(mod, target, *, database=None, precision: str = "int8", report: list | None = None):
    """``mod`` (an imported TFLite model) with tvm_armq's passes applied for the aarch64
    ``target``: quantized layers on integer kernels (scheduled from ``database`` where it
    has them), and with ``precision="bf16"`` float conv2d / dense as bfmmla GEMMs.
    ``report`` receives a record per layer. ``tvm.compile(mod, target=target,
    relax_pipeline=hooks.stock_pipeline())`` then builds it (the pass has already run)."""
    from . import integrate

    with target:
        mod = integrate.quantized_to_integer(target, database=database, report=report)(mod)
        if precision == "bf16":  # float conv2d / dense of a float model -> bfmmla GEMMs
            from . import integrate_bf16

            mod = integrate_bf16.float_to_bf16(target, report=report)(mod)
    return mod


def _load_database(tuning_database, target):
    """The MetaSchedule database of a ``tune`` work directory, or None without one.

    A database tuned for another target would silently give every layer its default
    schedule (records are looked up per target): that is a ``TuningTargetMismatch``."""
    if tuning_database is None:
        return None
    import tvm

    from . import tuning

    database = tuning.load_database(tuning_database)
    tuned = tuning.read_summary(tuning_database).target
    if tuned:
        tuned_tgt = tvm.target.Target(tuned)
        if tuning.target_key(tuned_tgt) != tuning.target_key(target):
            level = next((name for name in LEVELS if tuning.target_key(
                tvm.target.Target(preset(name))) == tuning.target_key(tuned_tgt)), None)
            fix = (f"compile with --isa {level}" if level else
                   f"compile for {describe_target(tuned_tgt)}")
            raise TuningTargetMismatch(
                f"tuning database {tuning_database} was tuned for "
                f"{describe_target(tuned_tgt)}, not {describe_target(target)}: none of its "
                f"schedules would apply; {fix}, or tune again for this target")
    return database


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
    database = _load_database(tuning_database, tgt)
    report: list = []
    with tgt:
        integrate.quantized_to_integer(tgt, database=database, report=report,
                                       schedule=False)(import_tflite(model))
    return report


def export_aarch64(executable, path: str | os.PathLike) -> Path:
    """Write ``executable`` as an aarch64 shared library, cross-linked, loadable on a board.

    The library is linked beside ``path`` under a temporary name and renamed over it only
    when complete: a failed link never leaves half a file, nor destroys the one there.
    Raises ``OutputError`` when ``path`` cannot be written."""
    from tvm.support import cc

    if not shutil.which(CROSS_CXX):
        raise RuntimeError(f"{CROSS_CXX} not found: install Debian's g++-aarch64-linux-gnu "
                           "(or run `python -m tvm_armq device provision`)")
    path = Path(path)
    existing = next(p for p in path.parents if p.exists())
    if not existing.is_dir():  # mkdir would say "File exists", which misleads
        raise OutputError(f"cannot write {path}: {existing} is a file, not a directory "
                          "(choose another -o)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".so", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e} (choose another -o)") from None
    try:
        executable.export_library(tmp, fcompile=cc.cross_compiler(CROSS_CXX))
        os.chmod(tmp, LIBRARY_MODE & ~_umask())  # mkstemp's file is private; a library is not
        os.replace(tmp, path)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e} (choose another -o)") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


LIBRARY_MODE = 0o755  # what the linker gives a new shared library, before the umask


def _umask() -> int:
    """The process's umask, read without changing it (os.umask can only set it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022  # the usual default


ELF_MAGIC = b"\x7fELF"
ELF_HEADER = slice(0, 20)  # magic and ident (16 bytes), e_type, e_machine (2 bytes each)
ET_DYN, EM_AARCH64 = 3, 0xB7  # a shared object, for aarch64


def is_compiled_module(path: str | os.PathLike) -> bool:
    """True when ``path`` is an aarch64 shared library (what ``export_aarch64`` writes), so
    replacing it with a new build loses nothing that cannot be rebuilt; any other file,
    an x86 program or another ELF included, is not."""
    try:
        with open(path, "rb") as f:
            head = f.read(ELF_HEADER.stop)
    except OSError:
        return False
    if len(head) < ELF_HEADER.stop or head[:len(ELF_MAGIC)] != ELF_MAGIC:
        return False
    little = head[5] == 1  # EI_DATA: 1 little-endian, 2 big-endian
    order = "little" if little else "big"
    return (int.from_bytes(head[16:18], order) == ET_DYN
            and int.from_bytes(head[18:20], order) == EM_AARCH64)


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
        # The stateful calls, not vm[entry](*args): over RPC a tuple of outputs comes back
        # from a plain call as one opaque remote object; get_outputs fetches each field.
        self.vm.set_input(self.entry, *args)
        self.vm.invoke_stateful(self.entry)
        return _to_numpy(self.vm.get_outputs(self.entry))


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
