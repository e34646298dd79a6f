"""What one library for every Arm CPU costs: size, and estimated cycles at each level.

For a zoo model (default MobileNetV2 1.0): build one library per ISA level and one
``portable`` library (``tvm_armq/portable.py``), print each ``.so``'s size, then let
``../shared/armperf`` run the level's own library and the portable one on that level's
emulated CPU (the portable one picks that level's kernels from the CPU's features) and
print armperf's estimated cycles per inference for both and their ratio.

    python scripts/bench_portable.py [--model mobilenet_v2_1.0] [--isa neon dotprod i8mm]
                                     [--json out.json] [--armperf PATH/armperf.py]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import armperf_tool
from tvm_armq import build, export, targets, zoo
from tvm_armq.targets import LEVELS
from tvm_armq.frontend.model import TFLiteModel

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2_1.0")
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    armperf_tool.add_option(ap)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    armperf_tool.require(ap, a.armperf)
    model = TFLiteModel.load(zoo.build(a.model))
    rows, sizes = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_portable-") as tmp:
        libs = {}
        for name in [*LEVELS, targets.PORTABLE]:
            libs[name] = export.export_aarch64(build.compile_tflite(model, name),
                                               Path(tmp) / f"{a.model}-{name}.so")
            sizes[name] = libs[name].stat().st_size
            print(f"{a.model} {name:9s} .so {sizes[name] / 1024:8.1f} KiB", flush=True)
        print(f"\n{'isa':8s} {'own build cyc':>14s} {'portable cyc':>13s} {'portable/own':>13s}")
        for level in a.isa:
            own, version = armperf_tool.tvm_cycles(a.armperf, libs[level], model, level)
            port, _ = armperf_tool.tvm_cycles(a.armperf, libs[targets.PORTABLE], model, level)
            rows.append({"isa": level, "own": own, "portable": port, "ratio": port / own,
                         "armperf": version})
            print(f"{level:8s} {own:14.4g} {port:13.4g} {port / own:13.4f}", flush=True)
    print(f"(armperf version {rows[0]['armperf'] if rows else '?'}, one thread)")
    if a.json:
        a.json.write_text(json.dumps({"model": a.model, "sizes": sizes, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
