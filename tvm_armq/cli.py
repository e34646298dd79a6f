"""``python -m tvm_armq``: compile, run and check TFLite models on aarch64; manage the device.

    python -m tvm_armq compile MODEL.tflite --isa i8mm -o MODEL.so [--tuning DIR]
                                           [--precision int8|bf16]
    python -m tvm_armq inspect MODEL.tflite --isa i8mm [--tuning DIR]
    python -m tvm_armq run MODEL.tflite --isa i8mm [--device HOST:PORT[:KEY]]
    python -m tvm_armq device provision|start|stop|status [--isa LEVEL ...]
    python -m tvm_armq tune MODEL.tflite --isa i8mm --trials N --work-dir DIR
                            [--rpc-tracker HOST:PORT --key KEY]

Bad input (a missing file, a file that is not a TFLite model, an unknown ISA)
is reported as one ``tvm_armq: error: ...`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .targets import LEVELS

BUNDLED_MODEL = Path(__file__).parent / "models" / "mobilenet_v1_0.25.tflite"


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _isa(text: str) -> str:
    if text not in LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown ISA level {text!r} (choose from {', '.join(LEVELS)})")
    return text


def _load(path: str):
    from .tflite_model import ModelError, TFLiteModel

    try:
        return TFLiteModel.load(path)
    except ModelError as e:
        raise UsageError(str(e)) from None


def cmd_compile(a) -> int:
    from . import build

    model = _load(a.model)
    out = Path(a.output) if a.output else Path(model.path).with_suffix(".so")
    report: list = []
    import tvm

    try:
        exe = build.compile_tflite(model, a.isa, tuning_database=_tuning_dir(a),
                                   precision=a.precision, report=report, strict=a.strict)
    except tvm.error.OpNotImplemented as e:
        raise UsageError(str(e).replace("\n", "; ")) from None
    lib = build.export_aarch64(exe, out)
    print(f"wrote {lib} (aarch64, ISA level {a.isa})\n{_kernel_summary(report)}")
    return 0


def _tuning_dir(a):
    if not getattr(a, "tuning", None):
        return None
    if not Path(a.tuning).is_dir():
        raise UsageError(f"--tuning {a.tuning}: no such directory (a `tune --work-dir`)")
    return a.tuning


def cmd_inspect(a) -> int:
    from . import build

    model = _load(a.model)
    try:
        report = build.inspect(model, a.isa, tuning_database=_tuning_dir(a))
    except Exception as e:  # noqa: BLE001 - a bad database is the user's input
        from . import tuning

        if isinstance(e, getattr(tuning, "TuningError", ())):
            raise UsageError(str(e)) from None
        raise
    print(f"{model.label} for {a.isa} ({build.describe_target(build.resolve_target(a.isa))}):")
    for r in report:
        print("  " + r.line())
    print(_kernel_summary(report))
    return 0


def _session(a):
    """An RPC session on the requested device and a function that releases what we started."""
    from . import device

    if a.device:
        try:
            return device.Endpoint.parse(a.device).connect(), lambda: None
        except ValueError as e:
            raise UsageError(str(e)) from None
    dev = device.running(a.isa)
    if dev is not None:  # started earlier by `device start`: leave it running
        return dev.connect(), lambda: None
    print(f"starting the emulated {a.isa} device ...", file=sys.stderr)
    dev = device.start(a.isa)
    return dev.connect(), dev.stop


def cmd_run(a) -> int:
    import numpy as np

    from . import build

    model = _load(a.model)
    inputs = model.random_inputs(a.seed)
    expected = model.reference_outputs(inputs)
    session, release = _session(a)
    report: list = []
    try:
        got = build.compile_and_run(model, a.isa, session, inputs, report=report)
    finally:
        del session
        release()
    print(_kernel_summary(report))
    worst = 0
    for i, (g, e) in enumerate(zip(got, expected)):
        diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
        worst = max(worst, float(diff.max()))
        print(f"output {i}: shape {tuple(g.shape)} {g.dtype}, max abs diff vs TFLite "
              f"{diff.max():g}, {int((diff > 0).sum())}/{diff.size} elements differ")
    print(f"max abs difference against TFLite: {worst:g}")
    return 0


def _kernel_summary(report: list) -> str:
    """One line: how many quantized layers run tvm_armq kernels, and which kernels."""
    kernels: dict[str, int] = {}
    for r in report:
        if not hasattr(r, "reason"):
            kernels[r.kernel] = kernels.get(r.kernel, 0) + 1
    used = ", ".join(f"{n} x {k}" for k, n in sorted(kernels.items(), key=lambda kv: -kv[1]))
    return (f"{sum(kernels.values())} of {len(report)} quantized layers on tvm_armq kernels"
            + (f": {used}" if used else ""))


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
            return 0
        for lvl, devs in state.items():
            where = ", ".join(f"{d['host']}:{d['port']} (pid {d['pid']})" for d in devs)
            print(f"{lvl}: " + (f"running at {where}" if devs else "not running"))
    return 0


def cmd_tune(a) -> int:
    from . import tuning

    model = _load(a.model)
    if a.trials < 1:
        raise UsageError(f"--trials must be at least 1, got {a.trials}")
    tracker = a.rpc_tracker
    if a.rpc_tracker and a.key:
        tracker = f"{a.rpc_tracker}:{a.key}"
    elif a.rpc_tracker and a.rpc_tracker.count(":") != 2:  # HOST:PORT:KEY is fine too
        raise UsageError("--rpc-tracker needs --key (the key the board registered under)")
    elif a.key:
        raise UsageError("--key names a device at an RPC tracker: give --rpc-tracker too")
    try:
        tasks = tuning.tasks_of_model(model, a.isa)
        summary = tuning.tune(tasks, a.isa, work_dir=a.work_dir, trials=a.trials,
                              tracker=tracker, level=a.isa, progress=not a.no_progress)
    except tuning.TuningError as e:  # bad tracker address, foreign work dir, ...
        raise UsageError(str(e)) from None
    print(summary.table())
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (no usage dump), exit status 2."""

    def error(self, message):
        self.exit(2, f"python -m tvm_armq: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m tvm_armq", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("compile", help="compile a TFLite model into an aarch64 shared library")
    c.add_argument("model")
    c.add_argument("--isa", type=_isa, default="i8mm")
    c.add_argument("-o", "--output", help="output .so (default: MODEL.so beside the model)")
    c.add_argument("--tuning", metavar="DIR", help="apply the database of a `tune --work-dir`")
    c.add_argument("--strict", action="store_true",
                   help="fail if a quantized layer would stay float (no tvm_armq kernel)")
    c.add_argument("--precision", choices=["int8", "bf16"], default="int8",
                   help="bf16: float conv2d/dense of a float model run as bf16 GEMMs "
                        "(needs +bf16, the i8mm level)")
    c.set_defaults(func=cmd_compile)

    i = sub.add_parser("inspect", help="per layer: op, shapes, the kernel chosen or why not")
    i.add_argument("model")
    i.add_argument("--isa", type=_isa, default="i8mm")
    i.add_argument("--tuning", metavar="DIR", help="show which layers the database tunes")
    i.set_defaults(func=cmd_inspect)

    r = sub.add_parser("run", help="compile, run on the aarch64 device, compare with TFLite")
    r.add_argument("model", nargs="?", default=str(BUNDLED_MODEL),
                   help="a .tflite model (default: the bundled MobileNetV1 0.25)")
    r.add_argument("--isa", type=_isa, default="i8mm")
    r.add_argument("--device", help="HOST:PORT or TRACKER_HOST:PORT:KEY of a real board "
                                    "(default: the emulated device of --isa)")
    r.add_argument("--seed", type=int, default=0, help="seed of the random input")
    r.set_defaults(func=cmd_run)

    d = sub.add_parser("device", help="the emulated aarch64 device (TVM RPC under qemu-user)")
    d.add_argument("action", choices=["provision", "start", "stop", "status"])
    d.add_argument("--isa", type=_isa, action="append",
                   help="level(s) to act on (default: all three)")
    d.add_argument("--tracker", help="HOST:PORT of an RPC tracker to register with")
    d.add_argument("--key", help="device key at the tracker (default armq-LEVEL)")
    d.add_argument("--json", action="store_true", help="status as JSON")
    d.set_defaults(func=cmd_device)

    t = sub.add_parser("tune", help="autotune the model's conv2d/dense schedules on an aarch64 "
                                    "device (MetaSchedule)")
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
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_tune)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    try:
        return a.func(a)
    except UsageError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")
    except Exception as e:  # noqa: BLE001 - a device or toolchain problem, said in one line
        from .device import DeviceError

        if isinstance(e, DeviceError):
            p.exit(1, f"{p.prog}: device error: {e}\n")
        raise
