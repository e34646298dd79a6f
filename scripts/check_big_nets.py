#!/usr/bin/env python3
"""Whole-model bit-exactness of zoo models at every ISA level, with timings, outside pytest.

tests/test_models.py checks every zoo model; this script checks the chosen ones (by
default the biggest nets) in the same way and also says how long each step took and,
with ``--diff``, where a model that differs starts to differ. For each model and level
it compiles the model with ``build.compile_tflite`` (keeping the compile report),
exports it, runs it on an emulated device of that level started for the run, and
compares every output with TFLite's reference kernels (``BUILTIN_REF``) for each seed. A
comparison counts only if TFLite's output really varies (``armq_checks.assert_alive``, the
tests' own guard). A model passes when every output element is equal and no quantized layer
stayed float (no ``report.Fallback`` record).

    python scripts/check_big_nets.py                          # big nets, all levels
    python scripts/check_big_nets.py --models ds_cnn --isa neon
    python scripts/check_big_nets.py --diff                   # name the first layer
                                                              # of a model that differs

Prints one line per (model, level): compile and run wall times, the largest difference,
the fallbacks; exits 1 if any model is not bit-exact, is not alive or falls back.
Wall times are qemu's (emulation), not the speed of an Arm core.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # armq_checks: the liveness guard the tests use

from armq_checks import assert_alive  # noqa: E402
from tvm_armq import build, device, export, layer_diff, zoo  # noqa: E402
from tvm_armq.targets import LEVELS  # noqa: E402
from tvm_armq.frontend.model import TFLiteModel  # noqa: E402
from tvm_armq.report import Fallback  # noqa: E402

# The zoo's biggest nets (most layers, or the largest input: InceptionV3's 299x299).
BIG_NETS = ["xception", "densenet169", "inception_v3", "resnet50"]
SEEDS = (0, 1)  # the tests' seeds


def check(model: TFLiteModel, level: str, session, tmp: Path, name: str) -> dict:
    """Compile ``model`` for ``level``, run every seed on ``session``, compare with TFLite."""
    report: list = []
    t0 = time.perf_counter()
    exe = build.compile_tflite(model, level, report=report)
    lib = export.export_aarch64(exe, tmp / f"{name.replace('.', '_')}-{level}.so")
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = build.DeviceModel(session, lib)
    load_s = time.perf_counter() - t0
    worst, differ, run_s, dead = 0, 0, [], []
    for seed in SEEDS:
        x = model.random_inputs(seed=seed)
        t0 = time.perf_counter()
        got = run(x)
        run_s.append(time.perf_counter() - t0)
        expected = model.reference_outputs(x)
        if len(got) != len(expected):
            raise RuntimeError(f"{name} at {level}: {len(got)} outputs, TFLite has "
                               f"{len(expected)}")
        for i, (g, e) in enumerate(zip(got, expected)):
            try:
                assert_alive(e, f"{name} output {i}, seed {seed}")
            except AssertionError as err:
                dead.append(str(err))
            d = np.abs(g.astype(np.int32) - e.astype(np.int32))
            worst, differ = max(worst, int(d.max())), differ + int((d > 0).sum())
    fallbacks = [r.line() for r in report if isinstance(r, Fallback)]
    return {"compile_s": compile_s, "load_s": load_s, "run_s": max(run_s),
            "max_diff": worst, "differ": differ, "fallbacks": fallbacks, "dead": dead,
            "layers": len(report)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=BIG_NETS, metavar="NAME",
                        help=f"zoo models (default: {' '.join(BIG_NETS)})")
    parser.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS),
                        help="ISA levels (default: all)")
    parser.add_argument("--diff", action="store_true",
                        help="for a model that differs, run layer_diff and name the first "
                             "layer that differs (one more compile and run)")
    args = parser.parse_args(argv)
    for name in args.models:
        zoo.spec(name)  # a typo fails before any build
    models = {name: TFLiteModel.load(zoo.build(name)) for name in args.models}

    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.isa:
            dev = device.start(level)
            try:
                # One session for the level: the device serves one at a time, and a
                # session stays open while anything loaded through it is referenced.
                session = dev.connect()
                for name, model in models.items():
                    r = check(model, level, session, Path(tmp), name)
                    ok = r["max_diff"] == 0 and not r["fallbacks"] and not r["dead"]
                    failed |= not ok
                    print(f"{name:18s} {level:8s} compile {r['compile_s']:6.1f} s  "
                          f"load {r['load_s']:5.1f} s  run {r['run_s']:6.1f} s  "
                          f"{r['layers']:4d} layers  max|diff| {r['max_diff']:3d} "
                          f"({r['differ']} elements)  fallbacks {len(r['fallbacks'])}  "
                          f"{'bit-exact' if ok else 'FAILED'}", flush=True)
                    for line in r["fallbacks"] + r["dead"]:
                        print(f"    {line}", flush=True)
                    if r["max_diff"] and args.diff:
                        layers = layer_diff.diff_layers(model, level, session,
                                                        model.random_inputs(seed=SEEDS[0]))
                        first = layer_diff.first_difference(layers)
                        print("    first layer that differs: "
                              + (first.line() if first else "none at seed 0"), flush=True)
                del session
            finally:
                dev.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
