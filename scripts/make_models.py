#!/usr/bin/env python3
"""Build the deterministic int8 TFLite model zoo (see tvm_armq/zoo/).

    python scripts/make_models.py                 # build every model
    python scripts/make_models.py conv2d_3x3 add  # build some
    python scripts/make_models.py --list          # show names, do not build
    python scripts/make_models.py --out DIR       # write DIR/<name>.tflite
    python scripts/make_models.py --force ...     # rebuild even if cached

Prints one path per model on stdout (cached files are not rebuilt unless
--force); progress and timings go to stderr.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

try:
    from tvm_armq import zoo
except ImportError:
    # Not installed (pip install -e .): fall back to the checkout this script is in.
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    from tvm_armq import zoo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Build the int8 TFLite model zoo.",
        epilog="Models: " + ", ".join(zoo.names()),
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="models to build (default: all)")
    parser.add_argument("--out", metavar="DIR",
                        help=f"output directory (default: {zoo.model_dir()})")
    parser.add_argument("--list", action="store_true",
                        help="list the models and exit")
    parser.add_argument("--force", action="store_true",
                        help="rebuild even if a valid cached file exists")
    args = parser.parse_args(argv)

    if args.list:
        width = max(len(n) for n in zoo.names())
        for s in zoo.specs():
            shapes = " ".join("x".join(map(str, sh)) for sh in s.input_shapes)
            print(f"{s.name:<{width}}  {s.kind:<3}  {shapes:<22}  {s.description}")
        return 0

    selected = args.names or zoo.names()
    try:
        for name in selected:
            zoo.spec(name)  # validate all names before building anything
    except KeyError as e:
        parser.error(str(e))

    for name in selected:
        t0 = time.perf_counter()
        path = zoo.build(name, force=args.force, out_dir=args.out)
        print(f"{name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
