"""Did tuning pay? For a model and a `tune --work-dir` per ISA level: compile the model with
default knobs and with the database, let ``../shared/armperf`` estimate both on the level's
core, and run the tuned library on the emulated device against TFLite's reference kernels.

    python scripts/bench_tuning.py MODEL --isa neon=DIR [dotprod=DIR ...] [--json F]
                                   [--armperf PATH]   (MODEL: a zoo name or a .tflite)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

import armperf_tool
from tvm_armq import build, device, export, tuning, zoo
from tvm_armq.frontend.model import TFLiteModel

DEVICE_PORT = 9690  # away from the test suite's and tune's devices


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--isa", nargs="+", required=True, metavar="LEVEL=DIR")
    armperf_tool.add_option(ap)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    armperf_tool.require(ap, a.armperf)
    path = a.model if a.model.endswith(".tflite") else zoo.build(a.model)
    model = TFLiteModel.load(path)
    rows = []
    print(f"{'isa':8s} {'measured as':22s} {'default cyc':>12s} {'tuned cyc':>12s} "
          f"{'default/tuned':>13s}  tuned vs TFLite")
    with tempfile.TemporaryDirectory(prefix="bench_tuning-") as tmp:
        for spec in a.isa:
            level, work = spec.split("=", 1)
            summary = tuning.read_summary(work)
            default = export.export_aarch64(build.compile_tflite(model, level),
                                            Path(tmp) / f"default-{level}.so")
            report: list = []
            tuned = export.export_aarch64(
                build.compile_tflite(model, level, tuning_database=work, report=report),
                Path(tmp) / f"tuned-{level}.so")
            before, version = armperf_tool.tvm_cycles(a.armperf, default, model, level)
            after, _ = armperf_tool.tvm_cycles(a.armperf, tuned, model, level)
            dev = device.start(level, port=DEVICE_PORT)
            try:
                dm = build.DeviceModel(dev.connect(), tuned)
                inputs = model.random_inputs(0)
                exact = all(np.array_equal(g, w) for g, w in
                            zip(dm(inputs), model.reference_outputs(inputs)))
            finally:
                dev.stop()
            rows.append({"isa": level, "measured": summary.measured, "default": before,
                         "tuned": after, "ratio": before / after, "bit_exact": exact,
                         "tuned_layers": sum(bool(getattr(r, "tuned", False)) for r in report),
                         "trials": summary.trials, "seconds": summary.seconds,
                         "armperf": version})
            print(f"{level:8s} {summary.measured:22s} {before:12.4g} {after:12.4g} "
                  f"{before / after:13.4f}  {'bit-exact' if exact else 'DIFFERS'} "
                  f"({rows[-1]['tuned_layers']} layers tuned, {summary.trials} trials in "
                  f"{summary.seconds / 60:.0f} min)", flush=True)
    print(f"(armperf version {rows[0]['armperf']}, one thread)")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
