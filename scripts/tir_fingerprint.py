#!/usr/bin/env python3
"""Fingerprints of the scheduled TIR of every kernel of zoo models, to prove a refactoring
changed no generated code.

For each model and ISA level (a float model: bf16 at the i8mm level) the model is imported
and lowered by tvm_armq's passes
(``build.lower``: every quantized layer becomes a scheduled, tensorized PrimFunc, as
``tvm.compile`` would get it), and each PrimFunc's TVMScript text is hashed. Nothing is
compiled by LLVM or run, so this takes seconds per model, not minutes.

    python scripts/tir_fingerprint.py --out before.json            # every zoo model
    python scripts/tir_fingerprint.py --models mobilenet_v2_100 --isa dotprod --out a.json
    python scripts/tir_fingerprint.py --compare before.json         # after the change

``--compare`` fingerprints the same models and levels as the file and lists every kernel
whose TIR differs, appeared or disappeared; it exits 1 if any did. A kernel whose TIR
differs is then a case for armperf (``scripts/bench_layers.py``), not a failure in itself.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from tvm_armq import build, targets, zoo
from tvm_armq.frontend import importer
from tvm_armq.targets import LEVELS


# A float zoo model is fingerprinted at this mode only: bf16 GEMMs at the i8mm level.
BF16 = "bf16"


def fingerprints(model: str, mode: str) -> dict[str, str]:
    """{PrimFunc name: sha256 of its TVMScript} of ``model`` lowered for ``mode`` (an ISA
    level, or ``BF16``: the i8mm level with precision bf16)."""
    import tvm

    level, precision = ("i8mm", "bf16") if mode == BF16 else (mode, "int8")
    mod = build.lower(importer.import_tflite(str(zoo.build(model))),
                      targets.resolve(level), precision=precision)
    out = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            out[gv.name_hint] = hashlib.sha256(func.script().encode()).hexdigest()[:16]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", help="zoo model names (default: all)")
    parser.add_argument("--isa", nargs="*", choices=list(LEVELS),
                        help="ISA levels (default: all)")
    parser.add_argument("--out", type=Path, help="write the fingerprints to this JSON file")
    parser.add_argument("--compare", type=Path,
                        help="fingerprint the models and levels of this file and diff")
    args = parser.parse_args(argv)
    before = json.loads(args.compare.read_text()) if args.compare else None
    if before is not None:
        keys = sorted({tuple(k.split("@")) for k in before})
    else:
        models = args.models or zoo.names() + zoo.float_names()
        floats = set(zoo.float_names())
        keys = [(m, lv) for m in models
                for lv in ([BF16] if m in floats else args.isa or list(LEVELS))]
    now: dict[str, dict[str, str]] = {}
    changed = 0
    for model, level in keys:
        key = f"{model}@{level}"
        now[key] = fingerprints(model, level)
        if before is None:
            print(f"{key}: {len(now[key])} kernels", flush=True)
            continue
        old, new = before[key], now[key]
        diffs = ([f"  changed  {n}" for n in sorted(old.keys() & new.keys())
                  if old[n] != new[n]]
                 + [f"  gone     {n}" for n in sorted(old.keys() - new.keys())]
                 + [f"  new      {n}" for n in sorted(new.keys() - old.keys())])
        changed += len(diffs)
        print(f"{key}: {len(new)} kernels, {len(diffs)} differ", flush=True)
        for line in diffs:
            print(line)
    if args.out:
        args.out.write_text(json.dumps(now, indent=1, sort_keys=True))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
