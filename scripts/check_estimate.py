"""Does tvm_armq's cycle model (``python -m tvm_armq estimate``, tvm_armq/cycles.py) agree
with the yardstick, ``../shared/armperf``? For each zoo net and ISA level: compile, export,
estimate one run with our model and with armperf, print both and their ratio.

    python scripts/check_estimate.py [--models mobilenet_v1_0.25 mobilenet_v2_1.0 ...]
                                     [--isa neon dotprod i8mm] [--armperf PATH] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import armperf_tool
from tvm_armq import build, cycles, export, zoo
from tvm_armq.targets import LEVELS
from tvm_armq.tflite_model import TFLiteModel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+",
                    default=["mobilenet_v1_0.25", "mobilenet_v2_1.0", "inception_block"])
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    armperf_tool.add_option(ap)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    armperf_tool.require(ap, a.armperf)
    rows = []
    print(f"{'model':20s} {'isa':8s} {'core':12s} {'estimate':>12s} {'armperf':>12s} "
          f"{'ratio':>7s} {'estimate s':>10s}")
    with tempfile.TemporaryDirectory(prefix="check_estimate-") as tmp:
        for name in a.models:
            model = TFLiteModel.load(zoo.build(name))
            args = [(t.shape, t.dtype) for t in model.signature()[0]]
            for level in a.isa:
                lib = export.export_aarch64(build.compile_tflite(model, level),
                                            Path(tmp) / f"{name}-{level}.so")
                start = time.monotonic()
                ours = cycles.estimate(lib, level, args, layers=False)
                took = time.monotonic() - start
                theirs, version = armperf_tool.tvm_cycles(a.armperf, lib, model, level)
                rows.append({"model": name, "isa": level, "core": ours.core,
                             "estimate": ours.total, "armperf": theirs,
                             "ratio": ours.total / theirs, "armperf_version": version,
                             "seconds": took})
                print(f"{name:20s} {level:8s} {ours.core:12s} {ours.total:12.4g} "
                      f"{theirs:12.4g} {ours.total / theirs:7.4f} {took:10.1f}", flush=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"(armperf version {rows[0]['armperf_version']}; largest disagreement "
          f"{worst:.2%})")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
