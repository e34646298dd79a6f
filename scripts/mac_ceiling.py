"""How far ahead of TFLite a model can get at all: its multiply-accumulates at the core's peak rate.

Every product of a direct convolution, dense layer or batch matmul goes through an int8
multiply instruction, and the core model issues those at a fixed rate: ``peak`` MACs per cycle
(``inner_loop_peak.peak``: the level's widest MAC instruction, independent instances back
to back, priced by llvm-mca on armperf's core model). So no kernel runs a model in fewer
than

    bound = MACs of its CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED / TRANSPOSE_CONV /
            BATCH_MATMUL ops / peak

estimated cycles, whatever it does around them (every other op counts as free). Hence the
largest tflite / tvm_armq any implementation can reach on that model and level:

    ceiling = TFLite's figure / bound

and how far tvm_armq's own figure is above the bound (``tvm_armq / bound``; 1.00 would be
a model that is nothing but MAC instructions at the peak rate). The bound holds for the
direct algorithm, the one both libraries run; Winograd F(2x2, 3x3) would trade 2.25x fewer
products for operands wider than int8, which halves the products per instruction at neon and
quarters them at dotprod.

    python scripts/mac_ceiling.py --bench RESULTS.json [--models ...] [--isa ...]
                                  [--json OUT.json]

``--bench`` is a ``bench_models.py --json`` file of one-thread rows (its ``tflite`` and
``tvm_armq`` figures are used as they are); a (model, level) it does not hold has its TFLite
figure measured here with ``armperf.py tflite`` (one run) and no tvm_armq column. ``--json``
writes one row per model and level: ``macs`` (and ``macs_by_op``), ``peak`` (MACs per
cycle), ``bound`` (cycles), the ``tflite`` figure and its ``armperf`` version, ``ceiling``
and its ``target``, min(1.25, 0.9 x ceiling) (``results_data.target``), and, where tvm_armq
was measured, ``tvm_armq``, ``tvm_over_bound``, ``tflite_over_tvm_armq`` and ``met``
(whether it reaches the target). The docs' ceilings table is rendered from the checked-in one
(counting MACs needs no armperf; the peaks need llvm-mca):

    python scripts/mac_ceiling.py --bench scripts/results/models.json \\
                                  --json scripts/results/ceilings.json
    python scripts/render_results.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import armperf_tool  # noqa: E402
import bench_models  # noqa: E402
import results_data  # noqa: E402
from tvm_armq import zoo  # noqa: E402
from tvm_armq.targets import LEVELS  # noqa: E402
from tvm_armq.schedules.window import same_padding  # noqa: E402
from tvm_armq.frontend.model import TFLiteModel  # noqa: E402

_WINDOW_OPTIONS = {"CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions"}


def axis_taps(in_size: int, out_size: int, k: int, stride: int, dilation: int,
              pad_before: int) -> int:
    """(output position, kernel tap) pairs of one axis whose input is inside the tensor: a
    tap on the zero padding multiplies by zero and need not be done."""
    return sum(1 for o in range(out_size) for t in range(k)
               if 0 <= o * stride - pad_before + t * dilation < in_size)


def window_macs(op, fb_op, shape, kh: int, kw: int) -> int:
    """Multiply-accumulates per output channel (and image) of a CONV_2D or DEPTHWISE_CONV_2D:
    its in-bounds taps, counted per axis."""
    import tflite

    opts = getattr(tflite, _WINDOW_OPTIONS[op["op_name"]])()
    opts.Init(fb_op.BuiltinOptions().Bytes, fb_op.BuiltinOptions().Pos)
    _, in_h, in_w, _ = (int(s) for s in shape(int(op["inputs"][0])))
    _, out_h, out_w, _ = (int(s) for s in shape(int(op["outputs"][0])))
    strides, dilation = (opts.StrideH(), opts.StrideW()), (opts.DilationHFactor(),
                                                           opts.DilationWFactor())
    top, left = (same_padding((in_h, in_w), (kh, kw), strides, dilation)[:2]
                 if opts.Padding() == 0 else (0, 0))  # tflite.Padding.SAME is 0
    return (axis_taps(in_h, out_h, kh, strides[0], dilation[0], top)
            * axis_taps(in_w, out_w, kw, strides[1], dilation[1], left))


def op_macs(op: dict, fb_op, shape) -> int:
    """Multiply-accumulates of one op of the direct algorithm (0 for ops that have none).

    ``op`` is an entry of the interpreter's ops details, ``fb_op`` the flatbuffer's operator,
    ``shape(i)`` a tensor's shape. Taps on padding are not counted, nor TRANSPOSE_CONV's
    products that land outside its output: what the phase split multiplies."""
    name, ins, outs = op["op_name"], [int(i) for i in op["inputs"]], op["outputs"]
    out = [int(s) for s in shape(int(outs[0]))] if len(outs) else []
    if name == "CONV_2D":  # weights OHWI, I = in_c / groups
        _, kh, kw, ci = (int(s) for s in shape(ins[1]))
        return out[0] * out[3] * ci * window_macs(op, fb_op, shape, kh, kw)
    if name == "DEPTHWISE_CONV_2D":  # weights [1, kh, kw, c * multiplier]
        _, kh, kw, _ = (int(s) for s in shape(ins[1]))
        return out[0] * out[3] * window_macs(op, fb_op, shape, kh, kw)
    if name == "FULLY_CONNECTED":  # weights [N, K]
        return int(np.prod(out)) * int(shape(ins[1])[-1])
    if name == "TRANSPOSE_CONV":  # inputs: output shape, weights OHWI, input
        _, kh, kw, ci = (int(s) for s in shape(ins[1]))
        _, in_h, in_w, _ = (int(s) for s in shape(ins[2]))
        return out[0] * out[3] * ci * scatter_macs(fb_op, (in_h, in_w), out[1:3], (kh, kw))
    if name == "BATCH_MATMUL":
        return int(np.prod(out)) * batch_matmul_depth(fb_op, shape(ins[0]), shape(ins[1]))
    return 0


def batch_matmul_depth(fb_op, x_shape, y_shape) -> int:
    """The products summed into one output element of a BATCH_MATMUL: x is [..., M, K]
    ([..., K, M] with adj_x), y is [..., K, N] ([..., N, K] with adj_y)."""
    import tflite

    opts = tflite.BatchMatMulOptions()
    opts.Init(fb_op.BuiltinOptions().Bytes, fb_op.BuiltinOptions().Pos)
    depth = int(x_shape[-2] if opts.AdjX() else x_shape[-1])
    y_depth = int(y_shape[-1] if opts.AdjY() else y_shape[-2])
    if depth != y_depth:
        raise ValueError(f"BATCH_MATMUL of {list(x_shape)} and {list(y_shape)} (adj_x "
                         f"{opts.AdjX()}, adj_y {opts.AdjY()}): depths {depth} != {y_depth}")
    return depth


def scatter_macs(fb_op, in_hw, out_hw, k_hw) -> int:
    """Multiply-accumulates per output channel (and image) of a TRANSPOSE_CONV: the (input
    pixel, tap) pairs whose product lands inside the output, counted per axis. Input pixel
    i and tap t land on output i * stride + t - before, where ``before`` is the padding of
    the convolution that takes the output back to the input (TFLite's Prepare): half of
    (in - 1) * stride + k - out, rounded down, for SAME; none for VALID."""
    import tflite

    opts = tflite.TransposeConvOptions()
    opts.Init(fb_op.BuiltinOptions().Bytes, fb_op.BuiltinOptions().Pos)
    same = opts.Padding() == tflite.Padding.SAME
    macs = 1
    for n, out, k, stride in zip(in_hw, out_hw, k_hw, (opts.StrideH(), opts.StrideW())):
        before = max((n - 1) * stride + k - out, 0) // 2 if same else 0
        # the taps of input i that land: before - i * stride <= t < out + before - i * stride
        macs *= sum(max(0, min(k, out + before - i * stride) - max(0, before - i * stride))
                    for i in range(n))
    return macs


def macs_by_op(model: TFLiteModel) -> dict[str, int]:
    """Operator name -> multiply-accumulates of the model's ops of that name (the ops with
    none left out)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_content=model.data,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    shapes = {d["index"]: d["shape"] for d in it.get_tensor_details()}
    graph = model.flatbuffer().Subgraphs(0)
    found: dict[str, int] = {}
    for op in it._get_ops_details():
        macs = op_macs(op, graph.Operators(int(op["index"])), shapes.__getitem__)
        if macs:
            found[op["op_name"]] = found.get(op["op_name"], 0) + macs
    return found


def model_macs(model: TFLiteModel) -> int:
    return sum(macs_by_op(model).values())


def tflite_cycles(armperf: Path, model: TFLiteModel, level: str) -> tuple[float, int]:
    """armperf's estimated cycles of one TFLite run of ``model`` at ``level``, and armperf's
    version."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        res = subprocess.run([sys.executable, str(armperf), "tflite", str(model.path),
                              "--isa", level, "--runs", "1", "--json", out.name],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"armperf failed on {model.path} at {level}:\n"
                               f"{res.stderr[-2000:]}")
        r = json.loads(Path(out.name).read_text())
        return float(r["cycles_per_run"]), r["armperf"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+",
                    help="zoo nets (default: those of --bench, else bench_models' defaults)")
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    ap.add_argument("--bench", type=Path, help="bench_models.py --json rows (one thread)")
    ap.add_argument("--json", type=Path,
                    help="write the rows here (the docs: scripts/results/ceilings.json)")
    armperf_tool.add_option(ap)
    a = ap.parse_args()
    import inner_loop_peak  # llvm-mca, as armperf installs it

    measured = {}
    if a.bench:
        for r in json.loads(a.bench.read_text()):
            if r.get("threads", results_data.ONE_THREAD) == results_data.ONE_THREAD:
                measured[r["model"], r["isa"]] = r
    names = (a.models or list(dict.fromkeys(m for m, _ in measured))
             or bench_models.DEFAULT_MODELS)
    peaks = {level: inner_loop_peak.peak(level) for level in a.isa}
    print(f"{'model':18s} {'isa':8s} {'MACs':>10s} {'bound cyc':>10s} {'tflite cyc':>11s} "
          f"{'ceiling':>8s} {'tvm_armq cyc':>13s} {'tvm/bound':>10s} {'tflite/tvm':>11s}",
          flush=True)
    rows = []
    for name in names:
        model = TFLiteModel.load(zoo.build(name))
        per_op = macs_by_op(model)
        macs = sum(per_op.values())
        for level in a.isa:
            bound = macs / peaks[level]
            r = measured.get((name, level))
            if r is None:
                armperf_tool.require(ap, a.armperf)
                cycles, version = tflite_cycles(a.armperf, model, level)
                r = {"tflite": cycles, "armperf": version}
            row = {"model": name, "isa": level, "threads": results_data.ONE_THREAD,
                   "armperf": r.get("armperf"),
                   "macs": macs, "macs_by_op": per_op, "peak": peaks[level], "bound": bound,
                   "tflite": r["tflite"], "ceiling": r["tflite"] / bound}
            line = (f"{name:18s} {level:8s} {macs:10.4g} {bound:10.4g} {r['tflite']:11.4g} "
                    f"{row['ceiling']:8.3f}")
            if "tvm_armq" in r:
                row["tvm_armq"] = r["tvm_armq"]
                row["tvm_over_bound"] = r["tvm_armq"] / bound
                row["tflite_over_tvm_armq"] = r.get("tflite_over_tvm_armq",
                                                    r["tflite"] / r["tvm_armq"])
                line += (f" {r['tvm_armq']:13.4g} {r['tvm_armq'] / bound:10.3f} "
                         f"{r['tflite'] / r['tvm_armq']:11.3f}")
            row["target"] = results_data.target(row["ceiling"])
            line += f"  target {row['target']:.3f}"
            if "tflite_over_tvm_armq" in row:
                row["met"] = row["tflite_over_tvm_armq"] >= row["target"]
                line += " met" if row["met"] else " NOT met"
            rows.append(row)
            print(line, flush=True)
    print("peak MACs/cycle: " + ", ".join(f"{lv} {p:.1f}" for lv, p in peaks.items()))
    if a.json:
        results_data.write(a.json, results_data.sort_rows(rows))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
