"""Compile a TFLite model for aarch64 and run it on a device.

The path a model takes, in order:

    .tflite --import_tflite--> Relax IRModule (QDQ: dequantize -> float op -> quantize)
            --compile_tflite--> Relax VM executable for an aarch64 target
            --export_aarch64--> shared library cross-linked with aarch64-linux-gnu-g++
            --run_on_device--> outputs, from the Relax VM on an RPC device

Everything here is plain TVM 0.27 API; what tvm_armq changes about the code
that ``tvm.compile`` produces for aarch64 comes from its hooks, not from here. One
choice is made here: ``compile_tflite`` builds the VM program as compiled code
(``EXEC_MODE``), which ``tvm.compile`` has no argument for.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import numpy as np

from . import targets
from . import threads as pool
from .device import cycles
from .export import export_aarch64
from .frontend.importer import import_tflite
from .frontend.model import TFLiteModel
from .passes import call_sequence
from .portable import SELECTOR, level_name
from .report import Fallback
from .targets import LEVELS

PRECISIONS = ("int8", "bf16")

# How the Relax VM runs ``main`` (``tvm.relax.build``'s exec_mode): "compiled" makes the
# sequence of kernel calls, allocations and reshapes one TIR function of the library
# (``__vmtir__main``) where "bytecode" interprets it an instruction at a time. Per kernel
# call the interpreter decoded an instruction and moved its operands through registers:
# EfficientNet-B1 (340 calls per run) at dotprod, armperf 3, 4.649e6 -> 4.504e6 est.
# cycles, its runtime share 0.426e6 -> 0.265e6.
EXEC_MODE = "compiled"
# "bytecode" remains for what needs the interpreter: its per-call hook (the ``estimate``
# command's per-layer breakdown, ``cycles.estimate(layers=True)``)
EXEC_MODES = ("compiled", "bytecode")
# What ``compile_tflite`` builds: a Relax VM executable, or a C library with no runtime
EMITS = ("vm", "c")


class UnsupportedTarget(ValueError):
    """A tvm_armq-only option was asked of a target tvm_armq does not compile for."""


class MissingFeature(UnsupportedTarget):
    """The target lacks an instruction set extension the request needs (bf16 on neon)."""


class TuningTargetMismatch(ValueError):
    """A tuning database was tuned for another target than the one being compiled for."""


def compile_tflite(model, target, *, tuning_database=None, precision: str = "int8",
                   report: list | None = None, strict: bool = False,
                   kernels: dict | None = None, threads: int | None = None,
                   cores: str = "big", exec_mode: str = EXEC_MODE, emit: str = "vm"):
    """Import a TFLite model and compile it for ``target``; returns the executable
    (``emit="vm"``: a Relax VM executable, written by ``export.export_aarch64``) or, with
    ``emit="c"``, a ``clib.CModel``: the model as one C function, written as a header and
    libraries that need libc alone by ``clib.write`` (``clib.py``; one thread).

    For an aarch64 LLVM target (a preset name such as "i8mm" or "cortex-a76", a JSON
    dict, or a Target) quantized conv2d / depthwise / dense layers run tvm_armq's integer
    kernels, scheduled from ``tuning_database`` (a ``tune`` work directory) where it has
    them and with default knobs elsewhere. ``report`` (a list) receives what each
    quantized layer became (``report.Lowered`` / ``report.Fallback``); a layer with
    no integer kernel stays float (QDQ) and runs correctly, unless ``strict``, which raises
    ``tvm.error.OpNotImplemented`` naming every such layer, its op and why. ``kernels`` (a
    dict) receives, per kernel PrimFunc of the library, (op, kernel) from its attributes
    (``tvm_armq.kernel``, and ``tvm_armq.op`` or ``tvm_armq.layer_op``): what a
    per-function profile names layers by.
    ``precision="bf16"`` also runs the fp32 conv2d / dense of a float model as bf16 GEMMs
    (``bfmmla``, weights rounded to bf16 at compile time; needs +bf16, the i8mm level).
    ``threads``: the library sets the runtime's thread pool of the thread that runs it to
    that many threads on the fastest cores, or with ``cores="little"`` the slowest
    (``threads.py``); None leaves the pool as TVM's runtime sizes it; 1 also makes the
    kernels' parallel loops serial. ``exec_mode``: how the VM runs ``main`` (``EXEC_MODE``,
    compiled; "bytecode" for a per-call profile). Any other target compiles with stock
    TVM, exactly as ``tvm.compile`` would.
    """
    import tvm

    from . import hooks

    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    pool.check(threads, cores)
    if exec_mode not in EXEC_MODES:
        raise ValueError(f"exec_mode {exec_mode!r}: expected one of {', '.join(EXEC_MODES)}")
    if emit not in EMITS:
        raise ValueError(f"emit {emit!r}: expected one of {', '.join(EMITS)}")
    tgt = targets.resolve(target)
    if emit == "c":
        _check_c(tgt, threads, exec_mode)
    if strict and not hooks.applies_to(tgt):
        raise UnsupportedTarget(
            f"strict: {targets.describe(tgt)} is not a target tvm_armq compiles for (an "
            "aarch64 LLVM target: neon, dotprod, i8mm or an aarch64 core), so no layer would "
            "run on tvm_armq kernels")
    if precision == "bf16" and hooks.applies_to(tgt):
        from .intrinsics import kernels as kernel_table

        if not kernel_table.target_has(tgt, "has_bf16"):
            raise MissingFeature(
                f"precision bf16 runs bfmmla, which needs the bf16 extension (+bf16); "
                f"{targets.describe(tgt)} lacks it: use the i8mm level (--isa i8mm) or "
                "precision int8")
    model = TFLiteModel.load(model)  # read once: the import, the strict message, a C library
    mod = import_tflite(model)
    if not hooks.applies_to(tgt):
        if tuning_database is not None or precision != "int8" or threads is not None:
            raise UnsupportedTarget(
                f"tuning databases, threads and precision={precision!r} need an aarch64 LLVM "
                "target "
                f"(tvm_armq's kernels); {targets.describe(tgt)} compiles with stock TVM only")
        return tvm.compile(mod, target=tgt)
    mod, variants = lowered(mod, tgt, label=model.label, tuning_database=tuning_database,
                            precision=precision, report=report, strict=strict, kernels=kernels)
    if threads == 1 or emit == "c":  # one thread (a C library's always): every loop serial
        mod = pool.run_serially(mod)
        if variants is not None:
            variants.run_serially()
    if emit == "c":  # the C library's own build (clib.py): no VM
        from . import clib

        return clib.build(mod, tgt, variants, model)
    if exec_mode == "compiled" and variants is None:  # (passes/call_sequence.py)
        mod = call_sequence.as_one_function(mod, tgt, serial_twins=threads is None)
    if threads is not None:
        mod = pool.configure_pool(mod, threads, cores)
    executable = tvm.relax.build(mod, tgt, relax_pipeline=relax_pipeline(), exec_mode=exec_mode)
    if variants is not None:
        variants.link(executable)
    return executable


def _check_c(tgt, threads: int | None, exec_mode: str) -> None:
    """Refuse what a C library (``emit="c"``) cannot be, naming the option at fault."""
    from . import hooks

    if not hooks.applies_to(tgt):
        raise UnsupportedTarget(
            f"emit c writes a library of tvm_armq's aarch64 kernels; {targets.describe(tgt)} "
            "is not an aarch64 LLVM target (use neon, dotprod, i8mm or portable)")
    if threads not in (None, 1):
        raise UnsupportedTarget(
            f"emit c builds a single-threaded library (it runs on the caller's thread and "
            f"starts none); threads={threads} needs the Relax VM library (emit vm)")
    if exec_mode != EXEC_MODE:
        raise UnsupportedTarget(f"emit c has no VM, so no exec_mode {exec_mode!r}")


def relax_pipeline():
    """The Relax pipeline after tvm_armq's pass (``lower``): TVM's own, then the internal
    kernels' library names taken back (``call_sequence.keep_internal``)."""
    import tvm

    from . import hooks

    return tvm.transform.Sequential([hooks.stock_pipeline(), call_sequence.keep_internal()])


def lowered(mod, tgt, *, label: str, tuning_database=None, precision: str = "int8",
            report: list | None = None, strict: bool = False, kernels: dict | None = None):
    """An imported model lowered for the aarch64 target ``tgt`` as ``compile_tflite`` does
    it, refusing what ``strict`` refuses: (the module, the portable build's per-level
    variants or None)."""
    import tvm

    layers = [] if report is None else report
    variants = None
    levels = targets.portable_levels(tgt)
    if levels is not None:
        from .portable import Variants

        if precision != "int8" or tuning_database is not None:
            raise UnsupportedTarget(
                "a portable build runs default-scheduled int8 kernels: precision "
                f"{precision!r} and tuning databases need a single ISA level (--isa neon, "
                "dotprod or i8mm)")
        variants = Variants(levels)
    mod = lower(mod, tgt, database=_load_database(tuning_database, tgt), precision=precision,
                report=layers, variants=variants)
    fallbacks = [r for r in layers if isinstance(r, Fallback)]
    if strict and fallbacks:
        raise tvm.error.OpNotImplemented(
            f"{len(fallbacks)} quantized layer(s) have no tvm_armq integer kernel for "
            f"{targets.describe(tgt)}:\n"
            + "\n".join("  " + r.line() for r in fallbacks))
    if strict and not layers:
        raise tvm.error.OpNotImplemented(
            f"strict: {label} has no quantized layer, so nothing "
            "would run on tvm_armq's integer kernels (a float model: quantize it to int8, "
            "or compile it with precision bf16 at the i8mm level)")
    if kernels is not None:
        for gv, func in mod.functions.items():
            attrs = func.attrs if isinstance(func, tvm.tirx.PrimFunc) and func.attrs else {}
            if "tvm_armq.kernel" in attrs:  # a GEMM's op attribute, or the layer's op
                op = attrs.get("tvm_armq.op", attrs.get("tvm_armq.layer_op", ""))
                kernels[gv.name_hint] = (str(op), str(attrs["tvm_armq.kernel"]))
    return mod, variants


def lower(mod, target, *, database=None, precision: str = "int8", report: list | None = None,
          variants=None):
    """``mod`` (an imported TFLite model) with tvm_armq's passes applied for the aarch64
    ``target``: quantized layers on integer kernels (scheduled from ``database`` where it
    has them), and with ``precision="bf16"`` float conv2d / dense as bfmmla GEMMs.
    ``report`` receives a record per layer. ``tvm.compile(mod, target=target,
    relax_pipeline=hooks.stock_pipeline())`` then builds it (the pass has already run).
    A portable target's per-level GEMMs go to ``variants`` (``portable.Variants``), to be
    linked into the executable after that build."""
    from .passes import integer
    from .passes.float_math import vectorized_float_math

    with target:
        mod = integer.quantized_to_integer(target, tuned_schedule=_tuned(database, target),
                                             report=report, variants=variants)(mod)
        if precision == "bf16":  # float conv2d / dense of a float model -> bfmmla GEMMs
            from .passes import bf16

            mod = bf16.float_to_bf16(target, report=report)(mod)
        # the float32 ops left (after bf16's, which takes the conv2d / dense it asks for)
        mod = vectorized_float_math()(mod)
    return mod


def _tuned(database, target):
    """The pass's ``tuned_schedule`` hook for ``database`` (None without one)."""
    if database is None:
        return None
    from . import tuning

    return tuning.database_schedule(database, target)


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
                targets.resolve(name)) == tuning.target_key(tuned_tgt)), None)
            fix = (f"compile with --isa {level}" if level else
                   f"compile for {targets.describe(tuned_tgt)}")
            raise TuningTargetMismatch(
                f"tuning database {tuning_database} was tuned for "
                f"{targets.describe(tuned_tgt)}, not {targets.describe(target)}: none of its "
                f"schedules would apply; {fix}, or tune again for this target")
    return database


def inspect(model, target, *, tuning_database=None) -> list:
    """What each quantized layer of ``model`` becomes for ``target``, in model order:
    ``report.Lowered`` (op, shapes, the kernel's name in the selection table, tuned or
    not) or ``report.Fallback`` (op and why it stays float). Nothing is built."""
    from . import hooks
    from .passes import integer

    tgt = targets.resolve(target)
    if not hooks.applies_to(tgt):
        raise UnsupportedTarget(f"{targets.describe(tgt)} is not an aarch64 LLVM target: "
                                "tvm_armq leaves the "
                                "whole model to stock TVM")
    database = _load_database(tuning_database, tgt)
    report: list = []
    with tgt:
        integer.quantized_to_integer(tgt, tuned_schedule=_tuned(database, tgt), report=report,
                                       schedule=False)(import_tflite(model))
    return report


def _to_numpy(value) -> list[np.ndarray]:
    """The VM's result (one tensor or a tuple of them) as a flat list of arrays."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out = []
    for v in value:
        out += _to_numpy(v)
    return out


# Numbers the libraries DeviceModel uploads in this process (see DeviceModel).
_UPLOADS = itertools.count()


class DeviceModel:
    """A model library loaded once into the Relax VM of an RPC session; call it per input."""

    def __init__(self, session, library: str | os.PathLike, entry: str = "main"):
        from tvm.runtime.vm import VirtualMachine

        library = Path(library)
        # Each library goes up under a name of its own: overwriting a file the device process
        # has loaded crashes it, and two builds of one model may share a file name.
        remote = f"{library.stem}-{os.getpid()}-{next(_UPLOADS)}{library.suffix}"
        session.upload(str(library), target=remote)
        self.dev = session.cpu(0)
        self.library = session.load_module(remote)
        self.vm = VirtualMachine(self.library, self.dev)
        self.entry = entry

    def selected_level(self) -> str:
        """The ISA level a portable library's layers run at on this device's CPU
        (``portable.py``); raises ``RuntimeError`` with the library's reason if it refuses
        to run (a ``TVM_ARMQ_ISA`` cap above the CPU)."""
        import tvm

        out = tvm.runtime.tensor(np.zeros(1, "int32"), self.dev)
        self.library[SELECTOR](out)
        return level_name(int(out.numpy()[0]))

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


def estimate_model(model, level: str, *, core: str | None = None, threads: int = 1,
                   tuning_database=None, kernels: dict | None = None, layers: bool = True,
                   runs: int = 1, out_dir: Path | None = None) -> "cycles.Estimate":
    """Estimated cycles of ``model`` (a ``TFLiteModel``) as ``compile --threads N`` builds
    it: the total is the library ``compile`` writes (``main`` compiled, which armperf
    measures), the per-layer rows a second build whose ``main`` is bytecode (its
    interpreter's per-call hook; see ``cycles.estimate``). The library asks for the pool it
    is priced on; on one thread its loops are serial. ``kernels`` receives each function's op
    and kernel (``compile_tflite``); with ``out_dir`` the libraries are kept there
    (``model-compiled.so``, ``model-bytecode.so``)."""
    modes = ("compiled", "bytecode") if layers else ("compiled",)
    with tempfile.TemporaryDirectory(prefix="tvm_armq-estimate-") as tmp:
        where = Path(out_dir) if out_dir is not None else Path(tmp)
        libs = [export_aarch64(compile_tflite(model, level, tuning_database=tuning_database,
                                              kernels=kernels, threads=threads, exec_mode=mode),
                               where / f"model-{mode}.so")
                for mode in modes]
        args = [(t.shape, t.dtype) for t in model.signature()[0]]
        return cycles.estimate(libs[0], level, args, core=core, runs=runs, layers=layers,
                               threads=threads, layers_lib=libs[1] if layers else None)
