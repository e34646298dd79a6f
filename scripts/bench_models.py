"""Estimated aarch64 cycles of whole models: TVM builds against TFLite (XNNPACK).

For each model and ISA level: compile the model with TVM for that level, then
let ``../shared/armperf`` run TFLite and the TVM module on the same emulated CPU
and price their hot blocks on the level's llvm-mca core model. Prints a table of
estimated cycles per inference and the ratio tflite/tvm (above 1: TVM is faster).

    python scripts/bench_models.py [--models mobilenet_v1_0.25 ...] [--isa dotprod ...]
                                   [--json out.json] [--armperf PATH/armperf.py]

The figures are core-bound estimates (every load an L1 hit), for comparing two
builds of the same model on the same core model; they are not milliseconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tvm_armq import build, zoo
from tvm_armq.targets import LEVELS
from tvm_armq.tflite_model import TFLiteModel

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ARMPERF = REPO.parent / "shared" / "armperf" / "armperf.py"
DEFAULT_MODELS = ["mobilenet_v1_0.25", "resnet_block", "mobilenet_v1_1.0", "mobilenet_v2_1.0"]


def input_specs(model: TFLiteModel) -> list[str]:
    return [",".join(map(str, t.shape)) + ":" + t.dtype for t in model.signature()[0]]


def compare(armperf: Path, model: TFLiteModel, lib: Path, level: str, runs: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(armperf), "compare", str(model.path), str(lib),
               "--isa", level, "--runs", str(runs), "--json", out.name]
        for spec in input_specs(model):
            cmd += ["--input", spec]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"armperf failed on {model.path} at {level}:\n{res.stderr[-2000:]}")
        return json.load(open(out.name))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--armperf", type=Path, default=DEFAULT_ARMPERF)
    ap.add_argument("--json", type=Path, help="write all figures here")
    a = ap.parse_args()
    if not a.armperf.exists():
        ap.error(f"{a.armperf} not found: pass --armperf")

    rows = []
    print(f"{'model':20s} {'isa':8s} {'tflite cyc':>12s} {'stock TVM cyc':>14s} "
          f"{'tflite/tvm':>10s}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            model = TFLiteModel.load(zoo.build(name))
            for level in a.isa:
                lib = build.export_aarch64(build.compile_tflite(model, level),
                                           Path(tmp) / f"{name}-{level}.so")
                r = compare(a.armperf, model, lib, level, a.runs)
                row = {"model": name, "isa": level, "tflite": r["tflite"]["cycles_per_run"],
                       "stock_tvm": r["tvm"]["cycles_per_run"],
                       "tflite_over_tvm": r["tflite_over_tvm"]}
                rows.append(row)
                print(f"{name:20s} {level:8s} {row['tflite']:12.4g} {row['stock_tvm']:14.4g} "
                      f"{row['tflite_over_tvm']:10.3f}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
