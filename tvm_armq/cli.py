"""``tvm-armq`` (``python -m tvm_armq``): compile, run and check TFLite models on aarch64;
tune them; manage the emulated device.

    tvm-armq compile MODEL.tflite --isa i8mm [-o MODEL.so] [--force] [--tuning DIR]
                                  [--precision int8|bf16] [--strict]
                                  [--threads N [--cores big|little]]
                                  [--emit c [--name NAME]] (-o: a directory)
    tvm-armq inspect MODEL.tflite --isa i8mm [--tuning DIR]
    tvm-armq run [MODEL.tflite] --isa i8mm [--device HOST:PORT[:KEY]] [--tolerance N]
    tvm-armq diff MODEL.tflite --isa i8mm [--device HOST:PORT[:KEY]] [--stock]
    tvm-armq device provision|start|stop|status [--isa LEVEL ...]
    tvm-armq tune MODEL.tflite --isa i8mm --trials N --work-dir DIR
                  [--measure time|cycles [--core CORE]] [--rpc-tracker HOST:PORT --key KEY]
    tvm-armq estimate MODEL.tflite --isa i8mm [--core CORE] [--tuning DIR] [--threads N]

Every failure ends as one line, ``tvm-armq: error: <what, where, what to do>``, and an
exit status that says which kind of failure it was (``--debug`` adds the traceback):

    0   success
    1   internal error: a bug in tvm_armq or TVM (rerun with --debug and report it)
    2   bad command line (unknown option, ISA level, malformed HOST:PORT, ...)
    3   bad model file: missing, unreadable, not TFLite, or rejected by TFLite's verifier
    4   unsupported model: a tensor type or operator TVM (or TFLite: a custom op) cannot
        load, or --strict refused it (layers left float, no quantized layer), or --emit c
        cannot make it one C function
    5   the target: not one tvm_armq compiles for (asked with strict, a tuning database or
        bf16), or lacking a feature the request needs (bf16 without +bf16)
    6   device or tracker: unreachable, hung past --timeout, crashed, or lacking the ISA
        extension the code uses
    7   tuning database or tuning run: not a database, corrupt, or tuned for another target
    8   output: -o (or tune's --work-dir) cannot be written, or -o would overwrite an
        input, a directory or a file that is not a compiled module (without --force), or
        the C library's cross tools are missing or failed
    9   run: the outputs differ from TFLite's reference kernels by more than --tolerance,
        or in number, shape or dtype; diff: a layer differs
    10  tune: every trial failed
    130 interrupted (Ctrl-C)

``EXIT_CODES`` below is that table in code: the one place where exception classes map to
exit statuses. A new subcommand raises (or reuses) an exception class and adds it there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import traceback
from pathlib import Path

from . import export, targets
from .targets import LEVELS
from .threads import CORES, POOL_FUNC

PROG = "tvm-armq"
BUNDLED_MODEL = Path(__file__).parent / "models" / "mobilenet_v1_0.25.tflite"


class UsageError(Exception):
    """Bad input on the command line."""


class OutputsDiffer(Exception):
    """``run``: the device's outputs differ from TFLite's by more than the tolerance, or in
    number, shape or dtype."""


class AllTrialsFailed(Exception):
    """``tune``: not one trial was measured."""


_reported = threading.Event()  # main's error boundary has printed the error line

# An error line longer than this is cut (a device's log tail is thousands of characters).
MAX_ERROR_CHARS = 2000
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
# (exit status, the exception classes that end with it, as "module:Class"). Classes are
# named, not imported: the CLI imports TVM lazily, and a class whose module was never
# imported cannot have been raised. The first row a raised exception is an instance of
# wins, so a subclass must come before its base class.
EXIT_CODES: tuple[tuple[int, tuple[str, ...]], ...] = (
    (EXIT_USAGE, ("tvm_armq.cli:UsageError", "tvm_armq.targets:UnknownIsaError")),
    (4, ("tvm_armq.frontend.importer:UnsupportedModel", "tvm.error:OpNotImplemented",
         "tvm_armq.frontend.model:TFLiteCannotRun",  # a ModelError: before that row
         "tvm_armq.clib:NotOneFunction")),
    (3, ("tvm_armq.frontend.model:ModelError",)),
    (5, ("tvm_armq.build:UnsupportedTarget",
         "tvm_armq.intrinsics.kernels:MissingTargetFeature")),
    (6, ("tvm_armq.device:DeviceError", "tvm_armq.tuning:DeviceGone")),  # and CycleModelError
    (7, ("tvm_armq.tuning:TuningError", "tvm_armq.build:TuningTargetMismatch")),
    (8, ("tvm_armq.export:OutputError", "tvm_armq.clib:CLibraryError")),
    (9, ("tvm_armq.cli:OutputsDiffer",)),
    (10, ("tvm_armq.cli:AllTrialsFailed",)),
)


def exit_code(error: BaseException) -> int:
    """The exit status of ``error`` from ``EXIT_CODES`` (``EXIT_INTERNAL`` if none)."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    for code, names in EXIT_CODES:
        for name in names:
            module, cls = name.split(":")
            loaded = sys.modules.get(module)
            if loaded is not None and isinstance(error, getattr(loaded, cls, ())):
                return code
    return EXIT_INTERNAL


def error_line(error: BaseException) -> str:
    """The one line a user reads: the message, its lines joined (a C++ stack of a TVM
    error is cut off; --debug shows it)."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    text = str(error).split("Stack trace:")[0]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    message = "; ".join(lines) or type(error).__name__
    if len(message) > MAX_ERROR_CHARS:  # a device's log tail, a long layer list
        message = (message[:MAX_ERROR_CHARS].rstrip() + f" ... ({len(message)} characters; "
                   "--debug prints the whole message)")
    if exit_code(error) == EXIT_INTERNAL:
        return (f"internal error ({type(error).__name__}: {message}); rerun with --debug "
                "for the traceback and report it")
    return message


# ------------------------------------------------------------------ argument types
def _isa(text: str) -> str:
    if text not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown ISA level {text!r} (choose from {', '.join(LEVELS)})")
    return text


def _build_isa(text: str) -> str:
    """An ISA level, or ``portable``: one library with every level's GEMM kernels."""
    if text == targets.PORTABLE:
        return text
    try:
        return _isa(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"unknown ISA level {text!r} (choose from {', '.join(LEVELS)} or "
            f"{targets.PORTABLE})") from None


def _core_option(p, what: str) -> None:
    """``--core``: a core model of the cycle model (``cycles.CORES``); checked against the
    level when the command runs."""
    from .device.cycles import DEFAULT_CORE

    defaults = ", ".join(f"{level} {core}" for level, core in DEFAULT_CORE.items())
    p.add_argument("--core", help=f"{what} (default: the level's: {defaults})")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: give 0 or more")
    return value


def _at_least_one(option: str, value: int | None) -> None:
    """A count option (``--threads``, ``--trials``) given as 0 or less is a usage error."""
    if value is not None and value < 1:
        raise UsageError(f"{option} must be at least 1, got {value}")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} s: give a positive number of seconds")
    return value


def _load(path: str):
    from .frontend.model import TFLiteModel

    return TFLiteModel.load(path)


def _tuning_dir(a):
    if not getattr(a, "tuning", None):
        return None
    return a.tuning  # tuning.load_database checks it and names what is wrong


# ------------------------------------------------------------------ compile
def _output_path(a, model) -> Path:
    """Where ``compile`` writes, checked: never the model or a directory; an existing file
    only if it is a compiled module (or with --force). Default: MODEL.so in the current
    directory (not beside the model: the bundled one lives inside the installed package)."""
    out = Path(a.output) if a.output else Path.cwd() / (Path(model.path).stem + ".so")
    if out.is_dir():
        raise export.OutputError(f"-o {out} is a directory: give a file name, such as "
                                f"{out / (Path(model.path).stem + '.so')}")
    inputs = [Path(model.path)] + ([Path(a.tuning)] if getattr(a, "tuning", None) else [])
    for source in inputs:
        if out.exists() and source.exists() and os.path.samefile(out, source):
            raise export.OutputError(f"-o {out} is the input {source}: writing the library "
                                    "there would destroy it; choose another -o")
    if out.exists() and not export.is_compiled_module(out) and not a.force:
        raise export.OutputError(f"-o {out} exists and is not a compiled module (not an "
                                "aarch64 shared library): pass --force to overwrite it, or "
                                "choose another -o")
    return out


def cmd_compile(a) -> int:
    from . import build

    if a.emit == "c":
        return _compile_c(a)
    if a.name is not None:
        raise UsageError("--name names a C library's API: it goes with --emit c")
    model = _load(a.model)
    out = _output_path(a, model)
    report: list = []
    _at_least_one("--threads", a.threads)
    exe = build.compile_tflite(model, a.isa, tuning_database=_tuning_dir(a),
                               precision=a.precision, report=report, strict=a.strict,
                               threads=a.threads, cores=a.cores)
    lib = export.export_aarch64(exe, out)
    pool = ("" if a.threads is None else
            f", {a.threads} thread{'s' if a.threads > 1 else ''} on the {a.cores} cores")
    print(f"wrote {lib} (aarch64, ISA level {a.isa}{pool})\n{_kernel_summary(report)}")
    if _tuning_dir(a):
        from . import tuning

        measured = tuning.read_summary(a.tuning).measured
        print(f"tuned schedules from {a.tuning}, measured as {measured}"
              + (" (qemu's wall time: it ranks qemu's work, not a core's)"
                 if measured == "qemu-time" else ""))
    return 0


def _compile_c(a) -> int:
    """``compile --emit c``: the header and libraries of ``clib.py`` in the -o directory."""
    from . import build, clib

    name = a.name or "model"
    clib.check_name(name)
    model = _load(a.model)
    out = Path(a.output) if a.output else Path.cwd() / (Path(model.path).stem + "_c")
    if out.exists() and not out.is_dir():
        raise export.OutputError(f"-o {out} is a file: --emit c writes a directory (the "
                                 "header and the libraries); choose another -o")
    _at_least_one("--threads", a.threads)
    report: list = []
    cmodel = build.compile_tflite(model, a.isa, tuning_database=_tuning_dir(a),
                                  precision=a.precision, report=report, strict=a.strict,
                                  threads=a.threads, emit="c")
    try:
        lib = clib.write(cmodel, out, name=name)
    except OSError as e:
        raise export.OutputError(f"cannot write {out}: {e.strerror or e} (choose another -o)")

    def size(path: Path) -> str:
        return f"{path.stat().st_size / 1024:.0f} KB"

    print(f"wrote {lib.header}, {lib.static.name} ({size(lib.static)}) and {lib.shared.name} "
          f"({size(lib.shared)}) in {out} (aarch64, ISA level {cmodel.level}, one thread; "
          f"arena {cmodel.arena_bytes} bytes, weights {cmodel.weights.size} bytes)\n"
          f"{_kernel_summary(report)}")
    return 0


def cmd_inspect(a) -> int:
    from . import build

    model = _load(a.model)
    report = build.inspect(model, a.isa, tuning_database=_tuning_dir(a))
    print(f"{model.label} for {a.isa} ({targets.describe(targets.resolve(a.isa))}):")
    for r in report:
        print("  " + r.line())
    print(_kernel_summary(report))
    return 0


# ------------------------------------------------------------------ run
def _session(a):
    """An RPC session on the requested device, its endpoint, and a function that releases
    what this command started."""
    import time

    from . import device

    a.connected_at = time.monotonic()  # the device counts --session-timeout from here
    if a.device:
        try:
            endpoint = device.Endpoint.parse(a.device)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return (endpoint.connect(session_timeout=a.session_timeout, timeout=a.timeout),
                endpoint, lambda: None)
    level = _device_isa(a)
    dev = device.running(level)
    if dev is not None:  # started earlier by `device start`: leave it running
        return (dev.connect(session_timeout=a.session_timeout, timeout=a.timeout),
                dev.endpoint, lambda: None)
    print(f"starting the emulated {level} device ...", file=sys.stderr)
    dev = device.start(level)
    return (dev.connect(session_timeout=a.session_timeout, timeout=a.timeout), dev.endpoint,
            dev.stop)


def _device_isa(a) -> str:
    """The level of the emulated device a command runs on: --isa, or --on for portable."""
    return getattr(a, "on", None) or a.isa if a.isa == targets.PORTABLE else a.isa


def _run_on(session, endpoint, lib, inputs, a):
    """The model's outputs from the device, or a ``DeviceError`` that says why not; a
    session that dies while running is explained by probing the device's ISA level."""
    from . import build, device

    def run():
        model = build.DeviceModel(session, lib)
        outputs = model(inputs)
        if a.isa == targets.PORTABLE:
            print(f"the portable library chose {model.selected_level()} on {endpoint}")
        return outputs

    try:
        return device.call_with_timeout(
            run,
            a.session_timeout + device.SESSION_GRACE,
            f"the device at {endpoint} did not finish running the model",
            "--session-timeout")
    except device.DeviceError:
        raise
    except Exception as e:  # noqa: BLE001 - the session died: find out whether it is the ISA
        crash = device.last_line(e)
    import time

    if time.monotonic() - a.connected_at >= a.session_timeout:  # the device ended it
        raise device.DeviceError(
            f"the session on {endpoint} reached --session-timeout ({a.session_timeout:g} s, "
            f"counted from the connection, compile included) and the device ended it "
            f"({crash}): give a longer --session-timeout")
    print(f"the session on {endpoint} ended while running the model ({crash}); probing "
          "which ISA extensions the device has ...", file=sys.stderr)
    try:
        has = device.probe_level(endpoint, a.timeout)
    except Exception as e:  # noqa: BLE001 - report the original crash and the probe's
        raise device.DeviceError(f"the session on {endpoint} ended while running the model "
                                 f"({crash}), and the ISA probe failed too "
                                 f"({device.last_line(e)})") from None
    names = list(LEVELS)
    wanted = names[0] if a.isa == targets.PORTABLE else a.isa  # portable: neon code
    if names.index(has) < names.index(wanted):
        raise device.DeviceLacksFeature(device.lacks_message(endpoint, wanted, has))
    raise device.DeviceError(f"the session on {endpoint} ended while running the model "
                             f"({crash}), though the device runs {has} code; see the "
                             "device's log")


def cmd_run(a) -> int:
    import tempfile

    import numpy as np

    from . import build

    model = _load(a.model)
    inputs = model.random_inputs(a.seed)
    expected = model.reference_outputs(inputs)
    report: list = []
    # The device first: an unreachable or hung one fails in --timeout seconds, not after
    # a compile. The session's own limit (--session-timeout) covers the compile too.
    session, endpoint, release = _session(a)
    try:
        with tempfile.TemporaryDirectory(prefix="tvm_armq_run_") as tmp:
            lib = export.export_aarch64(build.compile_tflite(model, a.isa, report=report),
                                       Path(tmp) / "model.so")
            got = _run_on(session, endpoint, lib, inputs, a)
    finally:
        del session
        release()
    print(_kernel_summary(report))
    if model.reference_note is not None:
        print(model.reference_note)
    _check_output_signature(model, endpoint, a.isa, got, expected)
    tolerances = _tolerances(a.tolerance, report, expected)
    worst, where, beyond = 0.0, "", []
    for i, (g, e) in enumerate(zip(got, expected)):
        diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
        differ = int((diff > tolerances[i]).sum())
        if differ:
            beyond.append(i)
        # the distinct values of TFLite's output: agreement with an output that takes two
        # values (a collapsed net, a saturated layer) says little, and the reader sees it
        print(f"output {i}: shape {tuple(g.shape)} {g.dtype}, {len(np.unique(e))} distinct "
              f"values, max abs diff vs TFLite {diff.max():g}, "
              f"{int((diff > 0).sum())}/{diff.size} elements differ")
        if diff.max() > worst:
            worst = float(diff.max())
            where = f"output {i}: {differ}/{diff.size} elements beyond it"
    print(f"max abs difference against TFLite: {worst:g}")
    if beyond:
        i = beyond[0]
        raise OutputsDiffer(
            f"{model.label} on {endpoint} ({a.isa}): outputs differ from TFLite's reference "
            f"kernels by up to {worst:g} (output {i}'s tolerance {tolerances[i]:g}; "
            f"{where}); float layers (TVM's float code, see `inspect`) may differ by "
            "rounding: pass --tolerance to accept that; integer kernels must not differ at "
            "all")
    return 0


def _tolerances(given, report: list, expected: list) -> list[float]:
    """The largest accepted |difference| per output: ``--tolerance`` for every output if
    given; else 0 (bit-exact), but for the float outputs of a dynamic-range model
    (``report.FLOAT_RELATIVE_TOLERANCE`` of the output's largest magnitude: its float
    layers are TVM's float code, which rounds differently from TFLite's), said on a line."""
    import numpy as np

    from .report import FLOAT_RELATIVE_TOLERANCE, dynamic_range

    if given is not None:
        return [given] * len(expected)
    floats = dynamic_range(report)
    out = [FLOAT_RELATIVE_TOLERANCE * float(np.abs(e).max(initial=0))
           if floats and e.dtype.kind == "f" else 0.0 for e in expected]
    if floats:
        print(f"a dynamic-range model: its float outputs are compared within "
              f"{FLOAT_RELATIVE_TOLERANCE:g} x their largest magnitude (TVM's float ops "
              "round differently from TFLite's; docs/exactness.md), its hybrid layers are "
              "TFLite's to the bit (`diff` shows each layer)")
    return out


def _check_output_signature(model, endpoint, isa: str, got: list, expected: list) -> None:
    """``run``'s outputs are TFLite's in number, shape and dtype, or ``OutputsDiffer``: a
    missing output must not pass a comparison made output by output."""
    if len(got) != len(expected):
        raise OutputsDiffer(f"{model.label} on {endpoint} ({isa}): the compiled model gave "
                            f"{len(got)} outputs, TFLite's has {len(expected)}")
    for i, (g, e) in enumerate(zip(got, expected)):
        if g.shape != e.shape or g.dtype != e.dtype:
            raise OutputsDiffer(f"{model.label} on {endpoint} ({isa}): output {i} is "
                                f"{tuple(g.shape)} {g.dtype}, TFLite's is {tuple(e.shape)} "
                                f"{e.dtype}")


def _kernel_summary(report: list) -> str:
    """One line: how many quantized layers run tvm_armq kernels, which kernels, and how
    many stay float."""
    from .report import Lowered

    kernels: dict[str, int] = {}
    for r in report:
        if isinstance(r, Lowered):
            kernels[r.kernel] = kernels.get(r.kernel, 0) + 1
    used = ", ".join(f"{n} x {k}" for k, n in sorted(kernels.items(), key=lambda kv: -kv[1]))
    floats = len(report) - sum(kernels.values())
    return (f"{sum(kernels.values())} of {len(report)} quantized layers on tvm_armq kernels"
            + (f": {used}" if used else "") + f"; {floats} left in float")


# ------------------------------------------------------------------ diff
def cmd_diff(a) -> int:
    """Every layer's output against TFLite's, in graph order (``layer_diff``)."""
    import numpy as np

    from . import layer_diff

    model = _load(a.model)
    inputs = model.random_inputs(a.seed)
    session, endpoint, release = _session(a)
    try:
        layers = layer_diff.diff_layers(model, a.isa, session, inputs, stock=a.stock)
    finally:
        del session
        release()
    for layer in layers:
        print(layer.line())
    first = layer_diff.first_difference(layers)
    if first is None:
        print(f"every one of the {len(layers)} layers equals TFLite's reference kernels")
        return 0
    raise OutputsDiffer(
        f"{model.label} ({a.isa}): the first layer that differs from TFLite is operator "
        f"{first.index} {first.op} ({first.kernel}): by up to {first.max_diff:g} in "
        f"{first.differ} of {int(np.prod(first.shape))} elements; every later layer "
        "inherits it")


# ------------------------------------------------------------------ device
def cmd_device(a) -> int:
    from . import device

    levels = a.isa or list(LEVELS)
    if a.action == "provision":
        device.provision()
        print(f"emulated device provisioned in {device.home()}")
    elif a.action == "start":
        for lvl in levels:
            dev = device.running(lvl) or device.start(lvl, tracker=a.tracker, key=a.key)
            print(f"{lvl}: {dev.endpoint} (pid {dev.pid}, qemu cpu "
                  f"{LEVELS[lvl].qemu_cpu}, log {dev.log})")
    elif a.action == "stop":
        for lvl in levels:
            print(f"{lvl}: {'stopped' if device.stop(lvl) else 'was not running'}")
    else:
        state = {lvl: [d.to_json() for d in devs] for lvl, devs in device.status().items()}
        if a.json:
            print(json.dumps(state, indent=1))
        else:
            for lvl, devs in state.items():
                where = ", ".join(f"{d['host']}:{d['port']} (pid {d['pid']})" for d in devs)
                print(f"{lvl}: " + (f"running at {where}" if devs else "not running"))
    for lvl, why in device.STALE:  # records whose pid is no longer our device
        print(f"{lvl}: {why}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------ tune
def cmd_estimate(a) -> int:
    from . import build
    from .device import cycles

    core = cycles.core_for(a.isa, a.core)  # a bad --core fails before the compile
    _at_least_one("--threads", a.threads)
    model = _load(a.model)
    kernels: dict = {}
    # the total: the library `compile --threads N` writes (main compiled); the per-layer
    # rows: a build whose main is bytecode, from the interpreter's hook around each call
    est = build.estimate_model(model, a.isa, core=core, threads=a.threads,
                               tuning_database=_tuning_dir(a), kernels=kernels)
    threaded = est.threads > 1
    cores = f"{est.threads} {core} cores" if threaded else f"the {core} model"
    print(f"{model.label} at ISA level {a.isa}, priced on {cores}: estimated cycles of one "
          "run" + (" (each layer: its busiest thread's work)" if threaded else ""))
    # VM builtins and the thread-pool set-up are bookkeeping: they count as the runtime's
    rows = [(r.function, *kernels.get(r.function, ("", "")), r.calls, r.cycles, r.balance)
            for r in est.layers
            if not r.function.startswith("vm.builtin.") and r.function != POOL_FUNC]
    rest = est.total - sum(row[4] for row in rows)
    rows += [("VM and runtime", "", "", "", rest, None),
             ("total" + (" (critical path)" if threaded else ""), "", "", "", est.total, None)]
    w = [max(len(str(row[i])) for row in rows + [("function", "op", "kernel")])
         for i in range(3)]
    print(f"  {'function':{w[0]}s}  {'op':{w[1]}s}  {'kernel':{w[2]}s}  calls  "
          f"{'est. cycles':>12s}   share" + ("  busiest/mean" if threaded else ""))
    for i, (name, op, kernel, calls, cyc, balance) in enumerate(rows):
        share = f"{cyc / est.total:7.1%}" if est.total and i < len(rows) - 1 else " " * 7
        tail = f"  {balance:13.2f}" if threaded and balance is not None else ""
        print(f"  {name:{w[0]}s}  {op:{w[1]}s}  {kernel:{w[2]}s}  {str(calls):>5s}  "
              f"{cyc:12,.0f} {share}{tail}")
    if threaded:
        print("Work per thread (the calling thread first): "
              + ", ".join(f"{c:,.0f}" for c in est.work)
              + f"; split evenly it would be {est.balanced:,.0f} per thread.")
    cores = (f"{est.threads} {core} cores that never wait on memory or on each other beyond "
             "the work each thread does (waiting is left out)" if threaded
             else f"one {core} core")
    print(f"Assumes {cores}, every load an L1 hit and the model's steady state per block "
          "(llvm-mca over the blocks qemu counted); it ranks code doing the same work and is "
          "not a time.")
    return 0


def cmd_tune(a) -> int:
    from . import device, tuning

    model = _load(a.model)
    _at_least_one("--trials", a.trials)
    tracker = a.rpc_tracker
    if a.rpc_tracker and a.key:
        tracker = f"{a.rpc_tracker}:{a.key}"
    elif a.rpc_tracker and a.rpc_tracker.count(":") != 2:  # HOST:PORT:KEY is fine too
        raise UsageError("--rpc-tracker needs --key (the key the board registered under)")
    elif a.key:
        raise UsageError("--key names a device at an RPC tracker: give --rpc-tracker too")
    if a.measure == "cycles" and tracker:
        raise UsageError("--measure cycles estimates cycles on the emulated CPU: it takes no "
                         "--rpc-tracker (time a real board with --measure time)")
    if a.core and a.measure != "cycles":
        raise UsageError("--core chooses the core model of --measure cycles")
    if a.measure == "cycles":
        from .device import cycles

        cycles.core_for(a.isa, a.core)  # a bad --core fails before any work
    if tracker:  # before the model is split into tasks: a dead tracker fails in seconds
        try:
            endpoint = device.Endpoint.parse(tracker)
        except ValueError as e:
            raise UsageError(f"--rpc-tracker: {e}") from None
        device.check_key(device.connect_tracker(endpoint.host, endpoint.port, a.timeout),
                         endpoint, a.timeout)
    try:  # before any work: a --work-dir that cannot be made is an output error
        Path(a.work_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from .export import OutputError

        raise OutputError(f"--work-dir {a.work_dir}: cannot create it ({e.strerror or e}); "
                          "choose another directory") from None
    tasks = tuning.tasks_of_model(model, a.isa)
    summary = tuning.tune(tasks, a.isa, work_dir=a.work_dir, trials=a.trials,
                          tracker=tracker, level=a.isa, progress=not a.no_progress,
                          measure=a.measure, core=a.core)
    print(summary.table())
    if summary.trials and summary.failed == summary.trials:
        errors = [e for t in summary.tasks for e in t.errors]
        raise AllTrialsFailed(
            f"all {summary.trials} trials failed on {summary.device}"
            + (f" (first: {errors[0]})" if errors else "")
            + f"; nothing was measured: see {Path(a.work_dir) / tuning.LOG_FILE}")
    return 0


# ------------------------------------------------------------------ parser
class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (no usage dump), exit status 2."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"{PROG}: error: {message}\n")


def _debug_flag(p: argparse.ArgumentParser, default) -> None:
    p.add_argument("--debug", action="store_true", default=default,
                   help="on an error, print the Python traceback too")


def _timeouts(p: argparse.ArgumentParser, session: bool = True) -> None:
    from .device import CONNECT_TIMEOUT, SESSION_TIMEOUT

    p.add_argument("--timeout", type=_positive_float, default=CONNECT_TIMEOUT,
                   metavar="SECONDS",
                   help="how long a device or RPC tracker may take to accept the connection "
                        f"and answer the handshake (default {CONNECT_TIMEOUT:g})")
    if session:
        p.add_argument("--session-timeout", type=_positive_float, default=SESSION_TIMEOUT,
                       metavar="SECONDS",
                       help="how long one session on the device (upload, run, fetch) may "
                            f"last (default {SESSION_TIMEOUT:g})")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    _debug_flag(p, False)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name, func, **kw):
        c = sub.add_parser(name, **kw)
        _debug_flag(c, argparse.SUPPRESS)  # also after the subcommand, not overriding it
        c.set_defaults(func=func)
        return c

    c = command("compile", cmd_compile,
                help="compile a TFLite model into an aarch64 shared library")
    c.add_argument("model")
    c.add_argument("--isa", type=_build_isa, default="i8mm",
                   help="an ISA level, or portable: one library that runs on every level, "
                        "choosing its GEMM kernels from the CPU's features")
    c.add_argument("-o", "--output",
                   help="output .so (default: MODEL.so in the current directory)")
    c.add_argument("--force", action="store_true",
                   help="overwrite an existing -o file even if it is not a compiled module")
    c.add_argument("--tuning", metavar="DIR", help="apply the database of a `tune --work-dir`")
    c.add_argument("--strict", action="store_true",
                   help="fail unless every quantized layer runs a tvm_armq kernel (refuses "
                        "layers left float, a model with no quantized layer)")
    c.add_argument("--precision", choices=["int8", "bf16"], default="int8",
                   help="bf16: float conv2d/dense of a float model run as bf16 GEMMs "
                        "(needs +bf16, the i8mm level)")
    c.add_argument("--threads", type=int, metavar="N",
                   help="the library runs on N threads (TVM's pool, the calling thread one "
                        "of them; default: as TVM's runtime sizes its pool)")
    c.add_argument("--cores", choices=list(CORES), default="big",
                   help="with --threads: pin the threads to the fastest cores (big) or the "
                        "slowest (little)")
    c.add_argument("--emit", choices=["vm", "c"], default="vm",
                   help="vm: a library for TVM's runtime (default); c: a header and "
                        "libNAME.a / libNAME.so needing libc alone, in the -o directory "
                        "(default MODEL_c; one thread)")
    c.add_argument("--name", help="with --emit c: the API's prefix and the files' names "
                                  "(default model: model.h, model_run, ...)")

    i = command("inspect", cmd_inspect,
                help="per layer: op, shapes, the kernel chosen or why not")
    i.add_argument("model")
    i.add_argument("--isa", type=_build_isa, default="i8mm")
    i.add_argument("--tuning", metavar="DIR", help="show which layers the database tunes")

    r = command("run", cmd_run,
                help="compile, run on the aarch64 device, compare with TFLite")
    r.add_argument("model", nargs="?", default=str(BUNDLED_MODEL),
                   help="a .tflite model (default: the bundled MobileNetV1 0.25)")
    r.add_argument("--isa", type=_build_isa, default="i8mm")
    r.add_argument("--on", type=_isa, default="i8mm", metavar="LEVEL",
                   help="with --isa portable: the emulated device to run it on")
    r.add_argument("--device", help="HOST:PORT or TRACKER_HOST:PORT:KEY of a real board "
                                    "(default: the emulated device of --isa)")
    r.add_argument("--seed", type=_non_negative_int, default=0,
                   help="seed of the random input (0 or more)")
    r.add_argument("--tolerance", type=float, default=None,
                   help="largest accepted absolute difference from TFLite (default 0: "
                        "bit-exact; a dynamic-range model's float outputs: 1e-4 of their "
                        "largest magnitude); beyond it the exit status is 9")
    _timeouts(r)

    f = command("diff", cmd_diff,
                help="every layer's output against TFLite's, in graph order: where a model "
                     "starts to differ")
    f.add_argument("model")
    f.add_argument("--isa", type=_isa, default="i8mm")
    f.add_argument("--device", help="HOST:PORT or TRACKER_HOST:PORT:KEY of a real board "
                                    "(default: the emulated device of --isa)")
    f.add_argument("--seed", type=_non_negative_int, default=0,
                   help="seed of the random input (0 or more)")
    f.add_argument("--stock", action="store_true",
                   help="compile with stock TVM (its float path) instead of tvm_armq's "
                        "kernels, to see where that drifts")
    _timeouts(f)

    d = command("device", cmd_device,
                help="the emulated aarch64 device (TVM RPC under qemu-user)")
    d.add_argument("action", choices=["provision", "start", "stop", "status"])
    d.add_argument("--isa", type=_isa, action="append",
                   help="level(s) to act on (default: all three)")
    d.add_argument("--tracker", help="HOST:PORT of an RPC tracker to register with")
    d.add_argument("--key", help="device key at the tracker (default armq-LEVEL)")
    d.add_argument("--json", action="store_true", help="status as JSON")

    t = command("tune", cmd_tune,
                help="autotune the model's conv2d/dense schedules on an aarch64 device "
                     "(MetaSchedule)")
    t.add_argument("model")
    t.add_argument("--isa", type=_isa, default="i8mm")
    t.add_argument("--trials", type=int, default=64, help="candidates measured per layer")
    t.add_argument("--work-dir", required=True,
                   help="where the database, the summary and the logs go (resumed if present)")
    t.add_argument("--rpc-tracker", help="HOST:PORT (or HOST:PORT:KEY) of an RPC tracker with "
                                         "the board(s) "
                                         "(default: a tracker and the emulated --isa device, "
                                         "started for the run)")
    t.add_argument("--key", help="the boards' device key at --rpc-tracker")
    t.add_argument("--measure", choices=["time", "cycles"], default="time",
                   help="time: TVM's time_evaluator on the device (qemu's wall time on the "
                        "emulated one, which does not rank code as a core does); cycles: "
                        "estimated cycles on --core's model, no board needed")
    _core_option(t, "with --measure cycles: the core model")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    _timeouts(t, session=False)

    e = command("estimate", cmd_estimate,
                help="estimated cycles per layer and in total on an Arm core's model (qemu "
                     "block counts priced by llvm-mca)")
    e.add_argument("model")
    e.add_argument("--isa", type=_isa, default="i8mm")
    _core_option(e, "the core model that prices the code")
    e.add_argument("--tuning", metavar="DIR", help="apply the database of a `tune --work-dir`")
    e.add_argument("--threads", type=int, default=1,
                   help="threads in TVM's pool, each counted apart on its own core "
                        "(default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; every exception ends as ``tvm-armq: error: ...`` and the exit
    status of its class (``EXIT_CODES``)."""
    p = parser()
    a = p.parse_args(argv)
    if argv is None:  # the program itself, not a caller in Python
        _end_on_ctrl_c_even_if_blocked()
    try:
        return a.func(a)
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the one error boundary
        if a.debug:
            traceback.print_exc()
        print(f"{PROG}: error: {error_line(e)}", file=sys.stderr, flush=True)
        _reported.set()
        code = exit_code(e)
        _exit_if_a_call_is_stuck(code)
        return code


CTRL_C_GRACE = 10.0  # s the ordinary path gets to report a Ctrl-C and clean up


def _end_on_ctrl_c_even_if_blocked() -> None:
    """A Ctrl-C normally ends the command through ``main``'s error boundary (the main thread
    raises KeyboardInterrupt). Should the main thread be stuck where Python cannot run
    its handler (a call into TVM's C++ code that never returns), a watcher thread, woken
    by the signal itself (``signal.set_wakeup_fd``), ends the process after
    ``CTRL_C_GRACE`` s with the same line and status."""
    import signal
    import time

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)

    def watch():
        while signal.SIGINT not in os.read(read_end, 64):
            pass
        time.sleep(CTRL_C_GRACE)
        if not _reported.is_set():
            os.write(2, f"{PROG}: error: interrupted\n".encode())
        os._exit(EXIT_INTERRUPTED)

    threading.Thread(target=watch, name="tvm_armq-ctrl-c", daemon=True).start()


def _exit_if_a_call_is_stuck(code: int) -> None:
    """End the process now when an RPC call was abandoned in TVM's C++ code (Ctrl-C or a
    timeout while it waits, ``device.call_with_timeout``): the interpreter's normal shutdown
    can wait on TVM's runtime, which that call holds, and the command would hang after
    printing its error. Our own output is flushed first; nothing else is left to do."""
    from .device import RPC_CALL_THREAD

    if any(t.name == RPC_CALL_THREAD and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


__all__ = ["EXIT_CODES", "exit_code", "error_line", "main", "parser"]
