"""``python -m tvm_armq``: compile, run and check TFLite models on aarch64; manage the device.

    python -m tvm_armq compile MODEL.tflite --isa i8mm -o MODEL.so
    python -m tvm_armq run MODEL.tflite --isa i8mm [--device HOST:PORT[:KEY]]
    python -m tvm_armq device provision|start|stop|status [--isa LEVEL ...]

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
    lib = build.export_aarch64(build.compile_tflite(model, a.isa), out)
    print(f"wrote {lib} (aarch64, ISA level {a.isa})")
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
    try:
        got = build.compile_and_run(model, a.isa, session, inputs)
    finally:
        del session
        release()
    worst = 0
    for i, (g, e) in enumerate(zip(got, expected)):
        diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
        worst = max(worst, float(diff.max()))
        print(f"output {i}: shape {tuple(g.shape)} {g.dtype}, max abs diff vs TFLite "
              f"{diff.max():g}, {int((diff > 0).sum())}/{diff.size} elements differ")
    print(f"max abs difference against TFLite: {worst:g}")
    return 0


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
    c.set_defaults(func=cmd_compile)

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
