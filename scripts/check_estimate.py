"""Does tvm_armq's cycle model (``python -m tvm_armq estimate``, tvm_armq/device/cycles.py)
agree with the yardstick, ``../shared/armperf``? For each model and ISA level: build it as
``compile --isa LEVEL --threads 1`` does, estimate one run as ``estimate`` does
(``build.estimate_model``: the compiled library's total, the per-layer rows from a
bytecode build), measure that compiled library with armperf, print both and their ratio.

    python scripts/check_estimate.py [--models mobilenet_v1_0.25 path/to/net.tflite ...]
                                     [--isa neon dotprod i8mm] [--armperf PATH] [--json F]
                                     [--runs N]

A model is a zoo name or a ``.tflite`` path: a net of several inputs or outputs (a
feature map beside the logits, say) is measured as it is, every output returned by the
module on both sides. The ``outputs`` column counts them; ``rows/total`` is the share of
the total the per-layer rows account for as ``estimate`` prints them (the rest, its "VM
and runtime" row, must stay above 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import armperf_tool
from tvm_armq import build, zoo
from tvm_armq.targets import LEVELS
from tvm_armq.threads import POOL_FUNC
from tvm_armq.frontend.model import TFLiteModel

DEFAULT_MODELS = ["mobilenet_v1_0.25", "mobilenet_v2_1.0", "inception_block"]


def load(name: str) -> tuple[str, TFLiteModel]:
    """A zoo name or a .tflite path: (the label printed, the model)."""
    if name.endswith(".tflite") or Path(name).exists():
        return Path(name).stem, TFLiteModel.load(Path(name))
    return name, TFLiteModel.load(zoo.build(name))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS,
                    help="zoo names or .tflite paths")
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    ap.add_argument("--runs", type=int, default=1, help="armperf's --runs (default 1)")
    armperf_tool.add_option(ap)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    armperf_tool.require(ap, a.armperf)
    rows = []
    print(f"{'model':28s} {'isa':8s} {'core':12s} {'outputs':>7s} {'estimate':>12s} "
          f"{'armperf':>12s} {'ratio':>7s} {'rows/total':>10s} {'estimate s':>10s}")
    with tempfile.TemporaryDirectory(prefix="check_estimate-") as tmp:
        for name in a.models:
            label, model = load(name)
            outputs = model.signature()[1]
            for level in a.isa:
                out = Path(tmp) / f"{label}-{level}"
                out.mkdir()
                start = time.monotonic()
                ours = build.estimate_model(model, level, threads=1, out_dir=out)
                took = time.monotonic() - start
                rows_share = sum(r.cycles for r in ours.layers  # the layers, as estimate
                                 if not r.function.startswith("vm.builtin.")  # prints them
                                 and r.function != POOL_FUNC) / ours.total
                theirs, version = armperf_tool.tvm_cycles(
                    a.armperf, out / "model-compiled.so", model, level, runs=a.runs)
                rows.append({"model": label, "isa": level, "core": ours.core,
                             "outputs": [[list(t.shape), t.dtype] for t in outputs],
                             "estimate": ours.total, "armperf": theirs,
                             "ratio": ours.total / theirs, "rows_share": rows_share,
                             "armperf_version": version, "seconds": took})
                print(f"{label:28s} {level:8s} {ours.core:12s} {len(outputs):7d} "
                      f"{ours.total:12.4g} {theirs:12.4g} {ours.total / theirs:7.4f} "
                      f"{rows_share:10.4f} {took:10.1f}", flush=True)
    worst = max(abs(r["ratio"] - 1) for r in rows)
    print(f"(armperf version {rows[0]['armperf_version']}; largest disagreement "
          f"{worst:.2%})")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
