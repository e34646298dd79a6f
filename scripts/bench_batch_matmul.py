"""Estimated cycles of the BATCH_MATMUL kernels against their MAC floor.

Attention's two products, Q.K^T and P.V, in the shapes of the zoo's ViT and BERT-style
encoder and of a ViT-Tiny (224 px: 197 tokens, 3 heads of 64), each compiled alone with
``schedules.batch_matmul`` for the level (the micro-kernel of the selection table, the
macro tile of ``REGISTER_TILE``) and timed by ``armperf.py script`` on the level's core
model, one thread. The floor is the product's multiply-accumulates at the level's peak
rate (``inner_loop_peak.peak``: its MAC instruction back to back, priced by llvm-mca on
the same core model); ``x floor`` is how many times that the kernel takes. Besides the
MACs, every output costs its zero-point terms and TFLite's requantization (a multiply
with rounding, its fix-up, a rounding shift, the zero point and two narrowing steps) on
the same vector pipes, so a short depth (16 in the zoo's nets) keeps any kernel well
above the floor.

    python scripts/bench_batch_matmul.py [--cases vit_qk ...] [--isa dotprod ...]
                                         [--json rows.json] [--armperf PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import armperf_tool  # noqa: E402
from bench_layers import armperf  # noqa: E402  (one armperf run, its figures)
from inner_loop_peak import peak  # noqa: E402
from tvm_armq.targets import LEVELS  # noqa: E402

# name: (lhs shape, rhs shape, adj_y, (lhs zero point, rhs zero point)). P is softmax's
# output, whose zero point TFLite fixes at -128.
CASES = {
    "vit_qk": ((1, 4, 65, 16), (1, 4, 16, 65), False, (5, -3)),
    "vit_pv": ((1, 4, 65, 65), (1, 4, 65, 16), False, (-128, 2)),
    "bert_qk": ((1, 4, 32, 16), (1, 4, 16, 32), False, (5, -3)),
    "bert_pv": ((1, 4, 32, 32), (1, 4, 32, 16), False, (-128, 2)),
    "vit_tiny_qk": ((1, 3, 197, 64), (1, 3, 64, 197), False, (5, -3)),
    "vit_tiny_qk_adj_y": ((1, 3, 197, 64), (1, 3, 197, 64), True, (5, -3)),
    "vit_tiny_pv": ((1, 3, 197, 197), (1, 3, 197, 64), False, (-128, 2)),
}
SEED = 0
# The output scale: the products' typical spread (sqrt(K) * this many input units of
# each operand) over the int8 range, so the outputs use most of it
OUTPUT_SPREAD = 64.0
SYMBOL = "bmm"
RUNS = 2  # measured calls per armperf run
TOP = 1  # hot blocks armperf keeps (not read here)
GUEST = textwrap.dedent(f'''\
    import numpy as np, tvm
    def setup(args):
        lib, npz = args
        tvm.get_global_func("runtime.config_threadpool")(1, 1)
        f = tvm.runtime.load_module(lib)["{SYMBOL}"]
        with np.load(npz) as s:
            t = [tvm.runtime.tensor(s[k]) for k in ("lhs", "rhs", "out")]
        return lambda: f(*t)
''')


def build(name: str, level: str, work: Path):
    """(shape, library, operands file) of case ``name`` compiled for ``level``."""
    import tvm

    from tvm_armq import export, targets
    from tvm_armq.schedules import batch_matmul as bm

    lhs, rhs, adj_y, (za, zb) = CASES[name]
    shape = bm.BatchMatmulShape(lhs, rhs, adj_y=adj_y)
    s_a, s_b = 0.02, 0.03
    s_out = s_a * s_b * np.sqrt(shape.depth) * OUTPUT_SPREAD / 127
    p = bm.batch_matmul_params((s_a, za), (s_b, zb), (s_out, 0))
    target = targets.resolve(level)
    func = bm.batch_matmul_func(shape, p, target=target).with_attr("global_symbol", SYMBOL)
    lib = export.export_aarch64(tvm.compile(tvm.IRModule({SYMBOL: func}), target=target),
                                work / f"{name}-{level}.so")
    rng = np.random.default_rng(SEED)
    operands = work / f"{name}.npz"
    np.savez(operands, lhs=rng.integers(-128, 128, lhs, dtype=np.int8),
             rhs=rng.integers(-128, 128, rhs, dtype=np.int8),
             out=np.zeros(shape.out, np.int8))
    return shape, bm.kernel_name(shape, target), lib, operands


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    ap.add_argument("--json", type=Path, help="write the rows here")
    a = armperf_tool.parse(ap)
    rows = []
    print(f"{'case':18s} {'isa':8s} {'kernel':28s} {'est. cycles':>11s} {'floor':>9s} "
          f"{'x floor':>7s}", flush=True)
    with armperf_tool.guest_script("bench_batch_matmul-", GUEST) as (work, guest):
        for level in a.isa:
            rate = peak(level)
            for name in a.cases:
                shape, kernel, lib, operands = build(name, level, work)
                r = armperf(a.armperf, "script", guest, level, RUNS, TOP,
                            args=(lib, operands))
                floor = shape.macs / rate
                row = {"case": name, "isa": level, "kernel": kernel,
                       "cycles": r["cycles_per_run"], "macs": shape.macs,
                       "peak_macs_per_cycle": rate, "floor": floor,
                       "over_floor": r["cycles_per_run"] / floor,
                       "armperf": r.get("armperf", 1)}
                rows.append(row)
                print(f"{name:18s} {level:8s} {kernel:28s} {row['cycles']:11.4g} "
                      f"{floor:9.4g} {row['over_floor']:7.2f}", flush=True)
    print(f"(armperf version {', '.join(sorted({str(r['armperf']) for r in rows}))}, "
          "one thread)")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
