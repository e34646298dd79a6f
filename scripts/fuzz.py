"""Differential fuzzing: random int8 layers compiled by tvm_armq against TFLite's reference.

Each case is drawn from its own generator, ``numpy.random.default_rng([seed, index])``,
so case 17 of seed 5 is the same layer in every run, alone or in any batch. A case is one
random layer (most of them) or a random chain of 3-6 layers (``--chains``, the share of
chains), so that layouts and the requantization between layers meet each other. Cases
are written with the project's own ``.tflite`` writer, many to one model (each its own
inputs and outputs: one compile, one upload and one run per batch), compiled for the
level, run on its emulated device and compared with TFLite's ``BUILTIN_REF`` kernels,
bit for bit. Then each case is also one of:

  differs   an output element differs from TFLite's,
  float     a layer stayed float (``report.Fallback``): not integer, not exact,
  error     compiling or running failed (a batch that fails is retried case by case).

A failing case is written to the output directory as ``<level>-s<seed>-<index>.tflite``
(the case alone) with a ``.json`` of its parameters, and printed with a one-line command
that reproduces it (``python -m tvm_armq run FILE --isa LEVEL --seed K``; the fuzzer
checks that the command's inputs show the failure and names the seed that does). The run
goes on. ``tests/fuzz_cases/`` keeps every reproducer ever found; ``tests/test_fuzz.py``
runs them and a fixed-seed slice of this fuzzer at every level.

The distribution (``LAYERS``, one generator per op; each says what it draws):
  tensors   NHWC, batch 1 (sometimes 2), 1-24 px, channels log-uniform 1-256; scales
            10^U(-3, 0) for activations, 10^U(-3.5, -1.5) per output channel for weights
            (per-tensor for a quarter of the layers), zero points over the whole int8 range
  outputs   the output scale is set from the accumulator's expected spread, times
            10^U(-1, 1), so that outputs are mostly alive and sometimes saturate; one
            GEMM layer in ten gets an edge-case multiplier: an exact power of two, a
            mantissa just below one (fixed-point multiplier near 2^31), a large right
            shift (M near 2^-20) or a left shift (M above 1)
  attention BATCH_MATMUL with every adj_x / adj_y and broadcast batch axes (either
            operand's), FULLY_CONNECTED keeping its input's leading axes (keep_num_dims),
            GELU in both forms, SOFTMAX over any last axis, and LayerNorm as the chain the
            converter writes (``layer_norm``: MEAN, the DEQUANTIZE -> NEG -> QUANTIZE
            island, SQUARED_DIFFERENCE, RSQRT, MULs, ADDs), each tensor quantized from the
            real values a few random inputs give, as calibration would

    python scripts/fuzz.py --isa neon --n 200 --seed 1 [--ops conv2d,depthwise,...]
                           [--batch 24] [--chains 0.2] [--threads 1] [--out fuzz-out/]
    python scripts/fuzz.py --isa neon --seed 1 --cases 17,40   # replay two cases
    python scripts/fuzz.py --list                     # the ops and their weights
    python scripts/fuzz.py --isa dotprod --dynamic --n 200 --seed 1   # hybrid layers

``--dynamic`` draws dynamic-range layers (``HYBRID``): FULLY_CONNECTED, CONV_2D,
DEPTHWISE_CONV_2D and BATCH_MATMUL (a constant int8 operand) of a float32 input shifted
per channel by a float ADD (so each quantization group has its own zero point), int8
weights per channel or per tensor, a float bias where the op has one, both input schemes;
compared with TFLite bit for bit as the int8 layers are (the ADD is one IEEE addition on
both sides).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tvm_armq.frontend.writer import Operator, graph_model, options

INT8 = (-128, 127)
ACTIVATIONS = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3}
STD_INPUT = 74.0    # std of an int8 drawn uniformly over its range (the test inputs)
STD_WEIGHT = 73.0   # std of a weight drawn uniformly over [-127, 127]
FUZZ_PORT = 9400    # the fuzzer's device: the first free port from here


# ---------------------------------------------------------------- the graph being drawn

@dataclasses.dataclass
class Graph:
    """Tensors and operators of one model under construction (``frontend.writer`` dicts)."""

    tensors: list = dataclasses.field(default_factory=list)
    operators: list = dataclasses.field(default_factory=list)
    inputs: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)

    def tensor(self, shape, q=None, dtype="int8", data=None) -> int:
        self.tensors.append(dict(shape=tuple(int(s) for s in shape), dtype=dtype, q=q,
                                 data=data))
        return len(self.tensors) - 1

    def input(self, shape, q) -> int:
        """A graph input: int8 with ``q``, float32 without (a hybrid layer's)."""
        i = self.tensor(shape, q, "int8" if q is not None else "float32")
        self.inputs.append(i)
        return i

    def const(self, data, q=None) -> int:
        data = np.asarray(data)
        return self.tensor(data.shape, q, data.dtype.name, data)

    def op(self, name: str, inputs, outputs, opts=None, version: int = 1) -> None:
        import tflite

        self.operators.append(Operator(getattr(tflite.BuiltinOperator, name), tuple(inputs),
                                       tuple(outputs), opts, version))

    def shape(self, t: int) -> tuple:
        return self.tensors[t]["shape"]

    def q(self, t: int) -> tuple:
        return self.tensors[t]["q"]

    def dtype(self, t: int) -> str:
        return self.tensors[t]["dtype"]

    def write(self) -> bytes:
        return graph_model(self.tensors, self.operators, self.inputs, self.outputs)


def log_uniform_int(rng, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi + 0.5)))))


def act_q(rng) -> tuple:
    """An activation's (scale, zero point)."""
    return (float(10 ** rng.uniform(-3, 0)), int(rng.integers(-128, 128)))


def padding(same: bool) -> int:
    import tflite

    return tflite.Padding.SAME if same else tflite.Padding.VALID


def out_size(size: int, k: int, stride: int, dilation: int, same: bool) -> int:
    extent = (k - 1) * dilation + 1
    return -(-size // stride) if same else (size - extent) // stride + 1


def acc_spread(g: Graph, x: int, depth: int, w_scale: float) -> float:
    """Expected std of a GEMM's real-valued accumulator: depth products of an input
    (uniform over int8, less its zero point) and a weight (uniform over +-127)."""
    s, zp = g.q(x)
    return s * w_scale * math.sqrt(depth * (STD_INPUT ** 2 + zp ** 2)) * STD_WEIGHT


def output_scale(rng, spread: float, params: dict, center: float = 0.0) -> float:
    """An output scale that puts ``spread`` at ~40 steps, times 10^U(-1, 1), and is coarse
    enough for the expected value ``center`` to lie inside the int8 range."""
    scale = max(spread / 40 * 10 ** rng.uniform(-1, 1), abs(center) / 90)
    params["out_scale"] = scale
    return scale


def centred_zero_point(rng, center: float, scale: float) -> int:
    """An output zero point that puts the real value ``center`` (the output's expected
    mean) within a few dozen steps of the middle of the int8 range."""
    return int(np.clip(round(-center / scale) + rng.integers(-40, 41), *INT8))


def mean_real(g: Graph, t: int) -> float:
    """The expected real value of an input tensor t (its int8 values uniform over the range)."""
    s, zp = g.q(t)
    return s * (-0.5 - zp)


def edge_multiplier(rng, in_scale: float, w_scale: float, params: dict):
    """One GEMM in ten: an output scale whose multiplier in_scale * w_scale / out_scale is
    an edge case of TFLite's fixed-point requantization; else None."""
    if rng.random() >= 0.1:
        return None
    kind = str(rng.choice(["pow2", "near_one", "tiny", "left_shift"]))
    product = np.float32(in_scale) * np.float32(w_scale)
    exponent = {"pow2": int(rng.integers(-12, -2)), "near_one": int(rng.integers(-12, -2)),
                "tiny": -20, "left_shift": int(rng.integers(1, 4))}[kind]
    out = np.float32(float(product) / 2.0 ** exponent)
    if kind == "near_one":  # one float32 ulp up: the multiplier's mantissa just below 1
        out = np.nextafter(out, np.float32(np.inf))
    params["multiplier"] = kind
    return float(out)


def weights(rng, shape) -> np.ndarray:
    return rng.integers(-127, 128, size=shape).astype(np.int8)


def weight_scales(rng, n: int, params: dict) -> np.ndarray:
    per_channel = rng.random() < 0.75
    params["per_channel"] = per_channel
    if per_channel:
        return (10 ** rng.uniform(-3.5, -1.5, n)).astype(np.float32)
    return np.full(n, np.float32(10 ** rng.uniform(-3.5, -1.5)), np.float32)


def weight_q(scales: np.ndarray, axis: int, per_channel: bool):
    if per_channel:
        return (scales, np.zeros(len(scales), np.int64), axis)
    return (float(scales[0]), 0)


def bias(rng, g: Graph, x: int, w_scales: np.ndarray, depth: int):
    """An int32 bias of the accumulator's magnitude, quantized per output channel."""
    s_in = np.float32(g.q(x)[0])
    values = rng.normal(0, math.sqrt(depth) * STD_INPUT * STD_WEIGHT * 0.3, len(w_scales))
    scales = (s_in * w_scales).astype(np.float32)
    return g.const(np.clip(values, -2 ** 30, 2 ** 30).astype(np.int32),
                   (scales, np.zeros(len(scales), np.int64), 0))


def gemm_operands(rng, g: Graph, x: int, shape, axis: int, depth: int, p: dict):
    """Weights of ``shape`` (quantized along ``axis``), their int32 bias and the output
    quantization of a GEMM layer over x of ``depth`` products per output."""
    w_scales = weight_scales(rng, shape[axis], p)
    out_q = requant_q(rng, g, x, depth, w_scales, p)
    wt = g.const(weights(rng, shape), weight_q(w_scales, axis, p["per_channel"]))
    b = bias(rng, g, x, w_scales, depth)
    return wt, b, out_q


def requant_q(rng, g, x, depth, w_scales, params) -> tuple:
    s_in = g.q(x)[0]
    edge = edge_multiplier(rng, s_in, float(w_scales[0]), params)
    if edge is not None and params.get("per_channel"):
        w_scales[:] = w_scales[0]  # the edge multiplier on every channel
    scale = edge if edge is not None else output_scale(
        rng, acc_spread(g, x, depth, float(np.median(w_scales))), params)
    return (scale, int(rng.integers(-128, 128)))


def activation(rng, params: dict, allowed=("NONE", "RELU", "RELU6", "RELU_N1_TO_1")) -> int:
    name = str(rng.choice(list(allowed)))
    params["act"] = name
    return ACTIVATIONS[name]


def window(rng, g: Graph, x: int, params: dict, k_choices, max_stride=3, dilate=True):
    """Kernel size, stride, dilation and padding of a sliding window over x's H and W."""
    _, h, w, _ = g.shape(x)
    kh, kw = k_choices[int(rng.integers(len(k_choices)))]
    stride = int(rng.choice(np.arange(1, max_stride + 1), p=_stride_p(max_stride)))
    dilation = 2 if dilate and rng.random() < 0.15 else 1
    same = bool(rng.random() < 0.5)
    if not same and (h < (kh - 1) * dilation + 1 or w < (kw - 1) * dilation + 1):
        same = True
    params.update(kernel=(kh, kw), stride=stride, dilation=dilation,
                  padding="SAME" if same else "VALID")
    return kh, kw, stride, dilation, same


def _stride_p(n: int):
    p = np.array([0.55, 0.3, 0.15][:n])
    return p / p.sum()


KERNELS = [(1, 1), (1, 1), (3, 3), (3, 3), (5, 5), (7, 7), (2, 2), (1, 3), (3, 1),
           (1, 7), (7, 1)]


# ---------------------------------------------------------------- one generator per op
#
# Each takes (rng, graph, x) - x a 4-D int8 NHWC tensor (2-D for the dense layer and
# the 2-D forms) - adds its operator and returns (output tensor, parameters).

def conv2d(rng, g: Graph, x: int):
    p: dict = {}
    n, h, w, c = g.shape(x)
    kh, kw, stride, dil, same = window(rng, g, x, p, KERNELS)
    groups = 1
    if c > 1 and rng.random() < 0.1:
        groups = int(rng.choice([d for d in range(2, c + 1) if c % d == 0]))
    cout = log_uniform_int(rng, 1, 128)
    cout = max(groups, cout // groups * groups)
    depth = kh * kw * c // groups
    wt, b, out_q = gemm_operands(rng, g, x, (cout, kh, kw, c // groups), 0, depth, p)
    oh, ow = out_size(h, kh, stride, dil, same), out_size(w, kw, stride, dil, same)
    y = g.tensor((n, oh, ow, cout), out_q)
    g.op("CONV_2D", [x, wt, b], [y], options(
        "Conv2DOptions", Padding=padding(same), StrideW=stride, StrideH=stride,
        DilationWFactor=dil, DilationHFactor=dil,
        FusedActivationFunction=activation(rng, p)), version=3)
    p.update(shape=(n, h, w, c), cout=cout, groups=groups)
    return y, p


def depthwise(rng, g: Graph, x: int):
    p: dict = {}
    n, h, w, c = g.shape(x)
    kh, kw, stride, dil, same = window(rng, g, x, p, [(3, 3), (3, 3), (5, 5), (1, 1), (7, 7),
                                                      (2, 2), (3, 1), (1, 3)])
    mult = 1 if rng.random() < 0.8 else int(rng.integers(2, 5))
    cout = c * mult
    wt, b, out_q = gemm_operands(rng, g, x, (1, kh, kw, cout), 3, kh * kw, p)
    oh, ow = out_size(h, kh, stride, dil, same), out_size(w, kw, stride, dil, same)
    y = g.tensor((n, oh, ow, cout), out_q)
    g.op("DEPTHWISE_CONV_2D", [x, wt, b], [y], options(
        "DepthwiseConv2DOptions", Padding=padding(same), StrideW=stride, StrideH=stride,
        DepthMultiplier=mult, DilationWFactor=dil, DilationHFactor=dil,
        FusedActivationFunction=activation(rng, p)), version=3)
    p.update(shape=(n, h, w, c), multiplier_depth=mult)
    return y, p


def dense(rng, g: Graph, x: int):
    """FULLY_CONNECTED: of x flattened to (batch, features), or (keep_num_dims, four
    times in ten for an input of rank 3 or 4) of x's last axis, the others as rows."""
    p: dict = {"per_channel": False}
    keep = len(g.shape(x)) in (3, 4) and bool(rng.random() < 0.4)
    if not keep:
        x = flatten(g, x)
    *rows, k = g.shape(x)
    n = int(np.prod(rows))
    units = log_uniform_int(rng, 1, 256)
    w_scale = np.full(units, np.float32(10 ** rng.uniform(-3.5, -1.5)), np.float32)
    out_q = requant_q(rng, g, x, k, w_scale, p)
    wt = g.const(weights(rng, (units, k)), (float(w_scale[0]), 0))
    b = bias(rng, g, x, w_scale, k)
    g.tensors[b]["q"] = (float(np.float32(g.q(x)[0]) * w_scale[0]), 0)  # per tensor
    y = g.tensor((*rows, units), out_q)
    g.op("FULLY_CONNECTED", [x, wt, b], [y], options(
        "FullyConnectedOptions", FusedActivationFunction=activation(rng, p),
        KeepNumDims=keep), version=4)
    p.update(shape=g.shape(x), units=units, keep_num_dims=keep)
    return y, p


def flatten(g: Graph, x: int) -> int:
    """x as 2-D (batch, features): a RESHAPE if it is not already."""
    shape = g.shape(x)
    if len(shape) == 2:
        return x
    y = g.tensor((shape[0], int(np.prod(shape[1:]))), g.q(x))
    g.op("RESHAPE", [x, g.const(np.array(g.shape(y), np.int32))], [y])
    return y


def _other_operand(rng, g: Graph, x: int, p: dict) -> int:
    """The second operand of a binary op: another input of x's shape, or a constant of
    x's shape, per channel, or a scalar (broadcast)."""
    shape = g.shape(x)
    form = str(rng.choice(["input", "input", "channel", "scalar", "full"]))
    p["other"] = form
    q = act_q(rng)
    if form == "input":
        return g.input(shape, q)
    c_shape = {"channel": (shape[-1],), "scalar": (), "full": shape}[form]
    data = rng.integers(-128, 128, size=c_shape).astype(np.int8)
    return g.const(data, q)


def _binary(name: str, opts_kind: str | None):
    def gen(rng, g: Graph, x: int):
        p: dict = {"shape": g.shape(x)}
        other = _other_operand(rng, g, x, p)
        s1, s2 = g.q(x)[0], g.q(other)[0]
        m1, m2 = mean_real(g, x), mean_real(g, other)
        if name == "MUL":
            spread = s1 * s2 * STD_INPUT ** 2 + abs(m1 * s2) * STD_INPUT + abs(m2 * s1) * STD_INPUT
            center = m1 * m2
        else:
            spread = (s1 + s2) * STD_INPUT
            center = m1 + m2 if name == "ADD" else m1 - m2
        scale = output_scale(rng, spread, p, center)
        out_q = (scale, centred_zero_point(rng, center, scale))
        y = g.tensor(g.shape(x), out_q)
        opts = None
        if opts_kind:
            opts = options(opts_kind, FusedActivationFunction=activation(rng, p))
        g.op(name, [x, other], [y], opts, version=2)
        return y, p
    gen.__name__ = name.lower()
    return gen


def _pool(name: str):
    def gen(rng, g: Graph, x: int):
        p: dict = {}
        n, h, w, c = g.shape(x)
        if rng.random() < 0.15:  # global: the whole image
            kh, kw, stride, same = h, w, 1, False
            p.update(kernel=(h, w), stride=1, padding="VALID")
        else:
            kh, kw, stride, _, same = window(rng, g, x, p, [(2, 2), (3, 3), (2, 2), (4, 4),
                                                            (1, 1), (3, 2)], dilate=False)
        y = g.tensor((n, out_size(h, kh, stride, 1, same), out_size(w, kw, stride, 1, same), c),
                     g.q(x))  # TFLite's int8 pools keep the input's quantization
        g.op(name, [x], [y], options(
            "Pool2DOptions", Padding=padding(same), StrideW=stride, StrideH=stride,
            FilterWidth=kw, FilterHeight=kh, FusedActivationFunction=activation(rng, p)),
            version=2)
        p["shape"] = (n, h, w, c)
        return y, p
    gen.__name__ = name.lower()
    return gen


def _unary(name: str, fixed_q=None, opts=None):
    def gen(rng, g: Graph, x: int):
        p: dict = {"shape": g.shape(x)}
        q = fixed_q or act_q(rng)
        if name == "HARD_SWISH":  # TFLite needs (s_in / 128) / s_out below 1
            q = (g.q(x)[0] * 10 ** rng.uniform(-0.8, 0.5), q[1])
        built = None
        if opts:
            fields = opts(rng, p)
            built = options(fields.pop("kind"), **fields)
        y = g.tensor(g.shape(x), q)
        g.op(name, [x], [y], built, version=1 if name in ("HARD_SWISH", "RELU_N1_TO_1") else 2)
        return y, p
    gen.__name__ = name.lower()
    return gen


def _leaky(rng, p):
    p["alpha"] = alpha = float(np.float32(rng.choice([0.01, 0.1, 0.2, 0.3, rng.uniform(0, 1)])))
    return {"kind": "LeakyReluOptions", "Alpha": alpha}


def concatenation(rng, g: Graph, x: int):
    shape = g.shape(x)
    parts, p = [x], {"shape": shape}
    for _ in range(int(rng.integers(1, 3))):
        c = log_uniform_int(rng, 1, 64)
        parts.append(g.input(shape[:-1] + (c,), act_q(rng)))
    out_q = g.q(x)  # TFLite's int8 CONCATENATION takes one quantization for all
    for t in parts:
        g.tensors[t]["q"] = out_q
    y = g.tensor(shape[:-1] + (sum(g.shape(t)[-1] for t in parts),), out_q)
    g.op("CONCATENATION", parts, [y], options(
        "ConcatenationOptions", Axis=len(shape) - 1,
        FusedActivationFunction=activation(rng, p, ("NONE",))))
    return y, p


def mean(rng, g: Graph, x: int):
    shape = g.shape(x)
    axes = [[1, 2], [1, 2], [1], [2], [3], [1, 2, 3]][int(rng.integers(6))]
    keep = bool(rng.random() < 0.5)
    p = {"shape": shape, "axes": axes, "keep_dims": keep}
    out = [1 if i in axes else s for i, s in enumerate(shape)] if keep else \
        [s for i, s in enumerate(shape) if i not in axes]
    count = int(np.prod([shape[i] for i in axes]))  # a mean's spread shrinks with sqrt
    scale = output_scale(rng, g.q(x)[0] * STD_INPUT / math.sqrt(count), p, mean_real(g, x))
    y = g.tensor(out, (scale, centred_zero_point(rng, mean_real(g, x), scale)))
    g.op("MEAN", [x, g.const(np.array(axes, np.int32))], [y],
         options("ReducerOptions", KeepDims=keep), version=2)
    return y, p


def softmax(rng, g: Graph, x: int):
    beta = float(rng.choice([1.0, 1.0, 0.5, 2.0]))
    y = g.tensor(g.shape(x), (1 / 256, -128))  # TFLite's int8 softmax output
    g.op("SOFTMAX", [x], [y], options("SoftmaxOptions", Beta=beta), version=2)
    return y, {"shape": g.shape(x), "beta": beta}


def batch_matmul(rng, g: Graph, x: int):
    """BATCH_MATMUL of x (its last two axes rows x depth; depth x rows with adj_x) and a
    second input (depth x cols; cols x depth with adj_y), whose batch axes are x's, or 1
    where x's are not (broadcast), or more where x's are 1."""
    shape = g.shape(x)
    adj_x, adj_y = bool(rng.random() < 0.25), bool(rng.random() < 0.5)
    rows, depth = (shape[-1], shape[-2]) if adj_x else (shape[-2], shape[-1])
    cols = log_uniform_int(rng, 1, 96)
    other_batch = tuple(int(rng.integers(2, 4)) if n == 1 and rng.random() < 0.2 else
                        1 if n > 1 and rng.random() < 0.3 else n for n in shape[:-2])
    other = g.input((*other_batch, cols, depth) if adj_y else (*other_batch, depth, cols),
                    act_q(rng))
    p = {"shape": shape, "other": g.shape(other), "adj_x": adj_x, "adj_y": adj_y}
    (s1, _), (s2, _) = g.q(x), g.q(other)
    m1, m2 = mean_real(g, x), mean_real(g, other)
    spread = math.sqrt(depth) * (s1 * s2 * STD_INPUT ** 2 + (abs(m1 * s2) + abs(m2 * s1))
                                 * STD_INPUT)
    center = depth * m1 * m2
    scale = output_scale(rng, spread, p, center)
    batch = tuple(np.broadcast_shapes(shape[:-2], other_batch))
    y = g.tensor((*batch, rows, cols), (scale, centred_zero_point(rng, center, scale)))
    g.op("BATCH_MATMUL", [x, other], [y],
         options("BatchMatMulOptions", AdjX=adj_x, AdjY=adj_y), version=2)
    return y, p


def _calibrated_q(values) -> tuple:
    """(scale, zero point) of a tensor whose real values are ``values``: their range over
    255 steps, as a converter calibrates an activation (the range holds 0)."""
    lo, hi = min(float(np.min(values)), 0.0), max(float(np.max(values)), 0.0)
    scale = max(hi - lo, 1e-6) / 255
    return float(np.float32(scale)), int(np.clip(round(-128 - lo / scale), *INT8))


def layer_norm(rng, g: Graph, x: int):
    """The chain TFLite's converter makes of a LayerNormalization over the last axis:
    MEAN, the float island DEQUANTIZE -> NEG -> QUANTIZE, SQUARED_DIFFERENCE, MEAN, ADD of
    epsilon, RSQRT, MUL by gamma, the MULs by x and by -mean and the ADDs (beta too, half
    of the time). Every tensor is quantized as calibration would: from the real values a
    few random int8 inputs give."""
    shape = g.shape(x)
    keep = tuple(shape[:-1]) + (1,)
    axis = g.const(np.array([len(shape) - 1], np.int32))
    s, zp = g.q(x)
    xr = s * (rng.integers(-128, 128, (4, *shape)) - zp)  # four sample inputs, real
    eps = float(10 ** rng.uniform(-6, -2))
    gamma = rng.uniform(0.5, 1.5, shape[-1])
    beta = rng.normal(0.1, 0.2, shape[-1]) if rng.random() < 0.5 else None
    mean_ = xr.mean(-1, keepdims=True)
    var = ((xr - mean_) ** 2).mean(-1, keepdims=True)
    rg = gamma / np.sqrt(var + eps)
    reals = {"mean": mean_, "neg": -mean_, "sq": (xr - mean_) ** 2, "var": var,
             "var_eps": var + eps, "rsqrt": 1 / np.sqrt(var + eps), "rg": rg,
             "xrg": xr * rg, "nmrg": -mean_ * rg, "out": (xr - mean_) * rg}
    if beta is not None:
        reals["out_beta"] = reals["out"] + beta

    def t(name, shape_):
        return g.tensor(shape_, _calibrated_q(reals[name]))

    def const(values):
        q = _calibrated_q(values)
        data = np.clip(np.round(values / q[0]) + q[1], *INT8).astype(np.int8)
        return g.const(data, q)

    m = t("mean", keep)
    g.op("MEAN", [x, axis], [m], options("ReducerOptions", KeepDims=True), version=2)
    mf, nf = g.tensor(keep, dtype="float32"), g.tensor(keep, dtype="float32")
    g.op("DEQUANTIZE", [m], [mf], version=2)
    g.op("NEG", [mf], [nf], version=1)
    nm = t("neg", keep)
    g.op("QUANTIZE", [nf], [nm], version=2)
    sq = t("sq", shape)
    g.op("SQUARED_DIFFERENCE", [x, m], [sq], version=2)
    var_t = t("var", keep)
    g.op("MEAN", [sq, axis], [var_t], options("ReducerOptions", KeepDims=True), version=2)
    ve = t("var_eps", keep)
    g.op("ADD", [var_t, const(np.array(eps))], [ve], options("AddOptions"), version=2)
    r = t("rsqrt", keep)
    g.op("RSQRT", [ve], [r], version=2)
    rg_t = t("rg", shape)
    g.op("MUL", [r, const(gamma)], [rg_t], options("MulOptions"), version=2)
    a, b = t("nmrg", shape), t("xrg", shape)
    g.op("MUL", [nm, rg_t], [a], options("MulOptions"), version=2)
    g.op("MUL", [x, rg_t], [b], options("MulOptions"), version=2)
    y = t("out", shape)
    g.op("ADD", [b, a], [y], options("AddOptions"), version=2)
    if beta is not None:
        y_beta = t("out_beta", shape)
        g.op("ADD", [y, const(beta)], [y_beta], options("AddOptions"), version=2)
        y = y_beta
    return y, {"shape": shape, "eps": eps, "beta": beta is not None}


def _gelu(rng, p):
    p["approximate"] = approximate = bool(rng.random() < 0.5)
    return {"kind": "GeluOptions", "Approximate": approximate}


def _resize(name: str, opts_kind: str):
    def gen(rng, g: Graph, x: int):
        n, h, w, c = g.shape(x)
        oh, ow = (int(rng.integers(1, 3 * s + 1)) for s in (h, w))
        mode = str(rng.choice(["none", "align_corners", "half_pixel"]))
        p = {"shape": (n, h, w, c), "size": (oh, ow), "mode": mode}
        y = g.tensor((n, oh, ow, c), g.q(x))
        g.op(name, [x, g.const(np.array([oh, ow], np.int32))], [y], options(
            opts_kind, AlignCorners=mode == "align_corners",
            HalfPixelCenters=mode == "half_pixel"), version=3)
        return y, p
    gen.__name__ = name.lower()
    return gen


def _extremum(name: str):
    def gen(rng, g: Graph, x: int):
        p: dict = {"shape": g.shape(x)}
        other = _other_operand(rng, g, x, p)
        g.tensors[other]["q"] = g.q(x)  # TFLite compares raw values: one quantization
        y = g.tensor(g.shape(x), g.q(x))
        g.op(name, [x, other], [y], version=2)
        return y, p
    gen.__name__ = name.lower()
    return gen


def transpose_conv(rng, g: Graph, x: int):
    p: dict = {}
    n, h, w, c = g.shape(x)
    k = int(rng.choice([2, 3, 4, 5]))
    stride = int(rng.choice([1, 2, 2, 3]))
    same = bool(rng.random() < 0.5)
    cout = log_uniform_int(rng, 1, 64)
    oh, ow = (s * stride if same else (s - 1) * stride + k for s in (h, w))
    # each output sees about k*k*c / stride^2 products
    wt, b, out_q = gemm_operands(rng, g, x, (cout, k, k, c), 0,
                                 max(1, k * k * c // (stride * stride)), p)
    y = g.tensor((n, oh, ow, cout), out_q)
    shape = g.const(np.array([n, oh, ow, cout], np.int32))
    g.op("TRANSPOSE_CONV", [shape, wt, x, b], [y], options(
        "TransposeConvOptions", Padding=padding(same), StrideW=stride, StrideH=stride),
        version=4)
    p.update(shape=(n, h, w, c), kernel=(k, k), stride=stride, cout=cout,
             padding="SAME" if same else "VALID")
    return y, p


def quantize(rng, g: Graph, x: int):
    y = g.tensor(g.shape(x), act_q(rng))
    g.op("QUANTIZE", [x], [y], version=2)
    return y, {"shape": g.shape(x)}


def pad(rng, g: Graph, x: int):
    pads = np.zeros((4, 2), np.int32)
    pads[1:3] = rng.integers(0, 4, (2, 2))
    y = g.tensor([s + int(a + b) for s, (a, b) in zip(g.shape(x), pads)], g.q(x))
    g.op("PAD", [x, g.const(pads)], [y], version=2)
    return y, {"shape": g.shape(x), "pads": pads[1:3].tolist()}


def prelu(rng, g: Graph, x: int):
    shape = g.shape(x)
    a_shape = (shape[-1],) if rng.random() < 0.5 else (1,) * (len(shape) - 2) + (shape[-1],)
    alpha = g.const(rng.integers(-128, 128, size=a_shape).astype(np.int8), act_q(rng))
    y = g.tensor(shape, act_q(rng))
    g.op("PRELU", [x, alpha], [y])
    return y, {"shape": shape, "alpha_shape": a_shape}


def _block_move(name: str, opts_kind: str):
    """SPACE_TO_DEPTH / DEPTH_TO_SPACE with block 2 or 3 (bytes moved, one quantization)."""
    def gen(rng, g: Graph, x: int):
        n, h, w, c = g.shape(x)
        block = int(rng.choice([2, 2, 3]))
        if name == "SPACE_TO_DEPTH":
            if h < block or w < block:  # too small for one block: padded up to one
                x = _pad_to(g, x, max(h, block), max(w, block))
                h, w = g.shape(x)[1:3]
            h, w = h // block, w // block
            x = _crop(g, x, (n, h * block, w * block, c))
            out = (n, h, w, c * block * block)
        else:
            x = _expand_channels(g, x, block * block)
            out = (n, h * block, w * block, g.shape(x)[3] // (block * block))
        y = g.tensor(out, g.q(x))
        g.op(name, [x], [y], options(opts_kind, BlockSize=block))
        return y, {"shape": g.shape(x), "block": block}
    gen.__name__ = name.lower()
    return gen


def _pad_to(g: Graph, x: int, h: int, w: int) -> int:
    """x padded at the bottom and right to h x w (a PAD, with its zero point)."""
    n, h0, w0, c = g.shape(x)
    pads = np.array([[0, 0], [0, h - h0], [0, w - w0], [0, 0]], np.int32)
    y = g.tensor((n, h, w, c), g.q(x))
    g.op("PAD", [x, g.const(pads)], [y], version=2)
    return y


def _crop(g: Graph, x: int, shape) -> int:
    """x's leading corner of ``shape`` (a SLICE), or x if it has that shape."""
    if tuple(shape) == g.shape(x):
        return x
    y = g.tensor(shape, g.q(x), g.dtype(x))
    g.op("SLICE", [x, g.const(np.zeros(4, np.int32)), g.const(np.array(shape, np.int32))], [y])
    return y


def _expand_channels(g: Graph, x: int, multiple: int) -> int:
    """x with its channels a multiple of ``multiple`` (a CONCATENATION with itself)."""
    c = g.shape(x)[3]
    if c % multiple == 0:
        return x
    y = g.tensor(g.shape(x)[:3] + (c * multiple,), g.q(x))
    g.op("CONCATENATION", [x] * multiple, [y], options("ConcatenationOptions", Axis=3))
    return y


def transpose(rng, g: Graph, x: int):
    shape = g.shape(x)
    perm = [0] + [int(a) + 1 for a in rng.permutation(len(shape) - 1)]
    y = g.tensor([shape[a] for a in perm], g.q(x))
    g.op("TRANSPOSE", [x, g.const(np.array(perm, np.int32))], [y])
    return y, {"shape": shape, "perm": perm}


def strided_slice(rng, g: Graph, x: int):
    shape = g.shape(x)
    begin, end, strides = [0], [shape[0]], [1]
    for size in shape[1:]:
        b = int(rng.integers(0, size))
        st = int(rng.choice([1, 1, 2, 3]))
        begin, end, strides = begin + [b], end + [int(rng.integers(b + 1, size + 1))], \
            strides + [st]
    out = [-(-(e - b) // st) for b, e, st in zip(begin, end, strides)]
    y = g.tensor(out, g.q(x))
    g.op("STRIDED_SLICE", [x] + [g.const(np.array(v, np.int32)) for v in (begin, end, strides)],
         [y], options("StridedSliceOptions"))
    return y, {"shape": shape, "begin": begin, "end": end, "strides": strides}


# ---------------------------------------------------------------- dynamic range (hybrid)

def _float_shift(rng, g: Graph, x: int) -> int:
    """x plus a constant per channel (a float ADD, exact in both TVM and TFLite): each
    quantization group then has its own offset, so asymmetric zero points spread over the
    int8 range instead of sitting near 0 (the test inputs are uniform in [-1, 1])."""
    c = g.shape(x)[-1]
    shift = (rng.uniform(-3, 3) + rng.normal(0, 0.3, c)).astype(np.float32)
    y = g.tensor(g.shape(x), None, "float32")
    g.op("ADD", [x, g.const(shift)], [y], options("AddOptions"))
    return y


def _hybrid_weights(rng, g: Graph, shape, p: dict):
    """int8 weights with one scale or one per output channel (axis 0), and a float bias."""
    n = shape[0]
    per_channel = bool(rng.random() < 0.7)
    scales = (10 ** rng.uniform(-3.5, -1.5, n if per_channel else 1)).astype(np.float32)
    q = ((scales, np.zeros(n, np.int64), 0) if per_channel else (float(scales[0]), 0))
    wt = g.const(weights(rng, shape), q)
    b = g.const(rng.normal(0, 0.5, n).astype(np.float32))
    p.update(per_channel=per_channel)
    return wt, b


def dense_hybrid(rng, g: Graph, x: int):
    """A dynamic-range FULLY_CONNECTED: float32 input (after a per-feature shift), int8
    weights, TFLite's either input scheme, 2-D or (keep_num_dims) 3-D / 4-D input."""
    p: dict = {}
    x = _float_shift(rng, g, x)
    *rows, k = g.shape(x)
    keep = len(rows) > 1 and bool(rng.random() < 0.5)
    units = log_uniform_int(rng, 1, 256)
    wt, b = _hybrid_weights(rng, g, (units, k), p)
    asym = bool(rng.random() < 0.6)
    out = (*rows, units) if keep else (int(np.prod(rows)), units)
    y = g.tensor(out, None, "float32")
    g.op("FULLY_CONNECTED", [x, wt, b], [y], options(
        "FullyConnectedOptions", FusedActivationFunction=activation(rng, p),
        KeepNumDims=keep, AsymmetricQuantizeInputs=asym), version=9)
    p.update(shape=g.shape(x), units=units, keep_num_dims=keep, asymmetric=asym)
    return y, p


def conv2d_hybrid(rng, g: Graph, x: int):
    """A dynamic-range CONV_2D: float32 NHWC input (after a per-channel shift), int8
    weights, any window; TFLite quantizes the image asymmetrically when the weight scales
    differ per channel, symmetrically otherwise."""
    p: dict = {}
    x = _float_shift(rng, g, x)
    n, h, w, c = g.shape(x)
    kh, kw, stride, dil, same = window(rng, g, x, p, KERNELS)
    if n > 1 and same:  # TFLite pads each image with its own zero point: one image
        x = _crop(g, x, (1, h, w, c))
        n = 1
    cout = log_uniform_int(rng, 1, 128)
    wt, b = _hybrid_weights(rng, g, (cout, kh, kw, c), p)
    oh, ow = out_size(h, kh, stride, dil, same), out_size(w, kw, stride, dil, same)
    y = g.tensor((n, oh, ow, cout), None, "float32")
    g.op("CONV_2D", [x, wt, b], [y], options(
        "Conv2DOptions", Padding=padding(same), StrideW=stride, StrideH=stride,
        DilationWFactor=dil, DilationHFactor=dil,
        FusedActivationFunction=activation(rng, p)), version=3)
    p.update(shape=(n, h, w, c), cout=cout)
    return y, p


def depthwise_hybrid(rng, g: Graph, x: int):
    """A dynamic-range DEPTHWISE_CONV_2D: float32 NHWC input (after a per-channel shift),
    int8 weights with a scale per output channel (TFLite's hybrid depthwise takes no
    other), a float bias (it needs one), any window and multiplier; each image quantized
    asymmetrically, padding left out."""
    p: dict = {}
    x = _float_shift(rng, g, x)
    n, h, w, c = g.shape(x)
    kh, kw, stride, dil, same = window(rng, g, x, p, [(3, 3), (3, 3), (5, 5), (1, 1), (7, 7),
                                                      (2, 2), (3, 1), (1, 3)])
    mult = 1 if rng.random() < 0.8 else int(rng.integers(2, 5))
    cout = c * mult
    scales = (10 ** rng.uniform(-3.5, -1.5, cout)).astype(np.float32)
    wt = g.const(weights(rng, (1, kh, kw, cout)), (scales, np.zeros(cout, np.int64), 3))
    b = g.const(rng.normal(0, 0.5, cout).astype(np.float32))
    oh, ow = out_size(h, kh, stride, dil, same), out_size(w, kw, stride, dil, same)
    y = g.tensor((n, oh, ow, cout), None, "float32")
    g.op("DEPTHWISE_CONV_2D", [x, wt, b], [y], options(
        "DepthwiseConv2DOptions", Padding=padding(same), StrideW=stride, StrideH=stride,
        DepthMultiplier=mult, DilationWFactor=dil, DilationHFactor=dil,
        FusedActivationFunction=activation(rng, p)), version=3)
    p.update(shape=(n, h, w, c), multiplier=mult, per_channel=True)
    return y, p


def batch_matmul_hybrid(rng, g: Graph, x: int):
    """A dynamic-range BATCH_MATMUL: float32 x (after a per-feature shift; its last two
    axes rows x depth, depth x rows with adj_x) times a constant int8 operand (depth x
    cols, cols x depth with adj_y) of no batch axes, x's, or broadcasting against x's;
    one scale or one per column; TFLite's either input scheme."""
    from tvm_armq.frontend.converters import tflite_hybrid_batch_axes

    p: dict = {}
    x = _float_shift(rng, g, x)
    shape = g.shape(x)
    if sum(d > 1 for d in shape[:-2]) > 1:  # TFLite's product is wrong there: one batch axis
        y = g.tensor((int(np.prod(shape[:-2])), *shape[-2:]), None, "float32")
        g.op("RESHAPE", [x, g.const(np.array(g.shape(y), np.int32))], [y])
        x, shape = y, g.shape(y)
    adj_x, adj_y = bool(rng.random() < 0.25), bool(rng.random() < 0.5)
    rows, depth = (shape[-1], shape[-2]) if adj_x else (shape[-2], shape[-1])
    cols = log_uniform_int(rng, 1, 96)
    batch = shape[:-2]
    kind = rng.random()
    w_batch = (() if kind < 0.4 else tuple(batch) if kind < 0.7 else
               tuple(int(rng.integers(2, 4)) if d == 1 else 1 if rng.random() < 0.5 else d
                     for d in batch))
    asym = bool(rng.random() < 0.6)
    if not tflite_hybrid_batch_axes(shape, (*w_batch, depth, cols), adj_x, asym):
        w_batch = ()
    per_channel = bool(rng.random() < 0.5)
    scales = (10 ** rng.uniform(-3.5, -1.5, cols if per_channel else 1)).astype(np.float32)
    axis = len(w_batch) + (0 if adj_y else 1)  # the columns' axis
    q = (scales, np.zeros(cols, np.int64), axis) if per_channel else (float(scales[0]), 0)
    wt = g.const(weights(rng, (*w_batch, cols, depth) if adj_y else (*w_batch, depth, cols)),
                 q)
    out_batch = tuple(np.broadcast_shapes(tuple(batch), w_batch))
    y = g.tensor((*out_batch, rows, cols), None, "float32")
    g.op("BATCH_MATMUL", [x, wt], [y], options(
        "BatchMatMulOptions", AdjX=adj_x, AdjY=adj_y, AsymmetricQuantizeInputs=asym),
        version=4)
    p.update(shape=shape, other=g.shape(wt), per_channel=per_channel, asymmetric=asym,
             adj_x=adj_x, adj_y=adj_y)
    return y, p


HYBRID = {"dense_hybrid": dense_hybrid, "conv2d_hybrid": conv2d_hybrid,
          "depthwise_hybrid": depthwise_hybrid, "batch_matmul_hybrid": batch_matmul_hybrid}


LAYERS = {
    "conv2d": conv2d,
    "depthwise": depthwise,
    "dense": dense,
    "add": _binary("ADD", "AddOptions"),
    "sub": _binary("SUB", "SubOptions"),
    "mul": _binary("MUL", "MulOptions"),
    "avg_pool": _pool("AVERAGE_POOL_2D"),
    "max_pool": _pool("MAX_POOL_2D"),
    "logistic": _unary("LOGISTIC", (1 / 256, -128)),
    "tanh": _unary("TANH", (1 / 128, 0)),
    "hard_swish": _unary("HARD_SWISH"),
    "leaky_relu": _unary("LEAKY_RELU", opts=_leaky),
    "relu": _unary("RELU"),
    "relu6": _unary("RELU6"),
    "relu_n1_to_1": _unary("RELU_N1_TO_1"),
    "prelu": prelu,
    "concat": concatenation,
    "mean": mean,
    "softmax": softmax,
    "resize_bilinear": _resize("RESIZE_BILINEAR", "ResizeBilinearOptions"),
    "resize_nearest": _resize("RESIZE_NEAREST_NEIGHBOR", "ResizeNearestNeighborOptions"),
    "maximum": _extremum("MAXIMUM"),
    "minimum": _extremum("MINIMUM"),
    "transpose_conv": transpose_conv,
    "quantize": quantize,
    "pad": pad,
    "space_to_depth": _block_move("SPACE_TO_DEPTH", "SpaceToDepthOptions"),
    "depth_to_space": _block_move("DEPTH_TO_SPACE", "DepthToSpaceOptions"),
    "transpose": transpose,
    "strided_slice": strided_slice,
    "batch_matmul": batch_matmul,
    "gelu": _unary("GELU", opts=_gelu),
    "layer_norm": layer_norm,
    **HYBRID,
}
INT8_LAYERS = [o for o in LAYERS if o not in HYBRID]  # what a run draws without --dynamic
# How often each op is drawn: the GEMM layers most, as most of a CNN's code is theirs.
WEIGHT = collections.defaultdict(lambda: 1.0, conv2d=6.0, depthwise=3.0, dense=2.0, add=2.0,
                                 mul=1.5, avg_pool=1.5, max_pool=1.5, concat=1.5)
FLAT = {"dense", "softmax", "batch_matmul", "layer_norm", "dense_hybrid",
        "batch_matmul_hybrid"}  # 2-D inputs too
FOUR_D = {"conv2d", "conv2d_hybrid", "depthwise", "depthwise_hybrid", "avg_pool", "max_pool",
          "concat", "mean",
          "resize_bilinear", "resize_nearest", "transpose_conv", "pad", "space_to_depth",
          "depth_to_space"}


# ---------------------------------------------------------------- cases

@dataclasses.dataclass
class Case:
    """One fuzz case: a layer or a chain of layers, drawn from ``default_rng([seed, index])``."""

    seed: int
    index: int
    layers: list  # [(op, parameters)] in order

    @property
    def name(self) -> str:
        return f"s{self.seed}-{self.index}"

    def describe(self) -> str:
        return " -> ".join(f"{op}{_short(p)}" for op, p in self.layers)


def _short(p: dict) -> str:
    keep = ("shape", "kernel", "stride", "dilation", "padding", "cout", "groups", "units",
            "act", "per_channel", "multiplier", "other", "axes", "size", "mode")
    return "(" + ", ".join(f"{k}={p[k]}" for k in keep if k in p) + ")"


def first_input(rng, g: Graph, op: str) -> int:
    """A fresh graph input for ``op``: NHWC, or (batch, features) for the 2-D ops; float32
    for a hybrid op (rows of up to 8 for a dense one)."""
    batch = 1 if rng.random() < 0.85 else 2
    q = None if op in HYBRID else act_q(rng)
    if op in HYBRID:
        batch = int(rng.integers(1, 9)) if op == "dense_hybrid" else batch
    if op in FLAT and rng.random() < 0.6:
        return g.input((batch, log_uniform_int(rng, 2 if op == "layer_norm" else 1, 512)),
                       q)
    c = log_uniform_int(rng, 1, 256)
    if op == "layer_norm":  # over a row of one value TFLite's chain aborts
        c = max(c, 2)
    hw_max = max(1, min(24, int(math.sqrt(60000 / c))))
    h, w = (int(rng.integers(1, hw_max + 1)) for _ in range(2))
    if rng.random() < 0.2:
        h = w  # square images, as most nets have
    return g.input((batch, h, w, c), q)


def draw(seed: int, index: int, ops: list[str], chains: float, g: Graph) -> Case:
    """Case ``index`` of ``seed``, added to ``g`` (its inputs and its output)."""
    rng = np.random.default_rng([seed, index])
    weights_ = np.array([WEIGHT[o] for o in ops])
    length = int(rng.integers(3, 7)) if rng.random() < chains else 1
    op = str(rng.choice(ops, p=weights_ / weights_.sum()))
    x = first_input(rng, g, op)
    layers = []
    for step in range(length):
        if step:
            fits = [o for o in ops if o not in HYBRID and _fits(o, g.shape(x))]
            if not fits:  # nothing takes this tensor (a --ops subset): the chain ends here
                break
            w = np.array([WEIGHT[o] for o in fits])
            op = str(rng.choice(fits, p=w / w.sum()))
        x, params = LAYERS[op](rng, g, x)
        layers.append((op, params))
    g.outputs.append(x)
    return Case(seed, index, layers)


def _fits(op: str, shape) -> bool:
    """Whether op takes a tensor of ``shape`` in a chain (and keeps it small)."""
    if op == "batch_matmul":  # keeps the product small: rows x cols x depth per batch
        return len(shape) >= 2 and np.prod(shape) <= 20_000 and shape[-1] <= 512
    if op == "layer_norm":  # a row of one value normalizes to nothing
        return len(shape) >= 2 and shape[-1] >= 2 and np.prod(shape) <= 200_000
    if len(shape) != 4:  # 2-D (dense, softmax) or 3-D (a MEAN over one axis)
        return op not in FOUR_D
    if np.prod(shape) > 200_000:
        return op in {"avg_pool", "max_pool", "mean", "conv2d", "depthwise"}
    return op not in {"dense"} or np.prod(shape[1:]) <= 4096


# ---------------------------------------------------------------- running

# A case's output is alive (its comparison means something) when TFLite's takes at least
# this many values: a sign or a saturated pair of values is not.
MIN_ALIVE_VALUES = 3


@dataclasses.dataclass
class Outcome:
    case: Case
    kind: str          # "ok", "differs", "float", "error"
    detail: str = ""
    alive: bool = True


def batch_model(seed: int, indices, ops, chains):
    from tvm_armq.frontend.model import TFLiteModel

    g = Graph()
    cases = [draw(seed, i, ops, chains, g) for i in indices]
    return TFLiteModel.load(g.write()), cases


def run_batch(session, level: str, seed: int, indices, ops, chains, workdir: Path):
    """Compile cases ``indices`` as one model, run it, compare each case's output."""
    from tvm_armq import build, export
    from tvm_armq.layer_diff import difference
    from tvm_armq.report import Fallback

    model, cases = batch_model(seed, indices, ops, chains)
    inputs = model.random_inputs(seed)
    expected = model.reference_outputs(inputs)
    report: list = []
    # named by its first case and its size: the first case re-run alone after its batch
    # failed must not overwrite the batch's library, which the device still has loaded
    # (that kills the session, and every later case reads as an RPC error)
    lib = export.export_aarch64(build.compile_tflite(model, level, report=report),
                                workdir / f"batch-{seed}-{indices[0]}-{len(indices)}.so")
    got = build.run_on_device(session, lib, inputs)
    if not len(got) == len(expected) == len(cases):  # each case is one output of the batch
        raise RuntimeError(f"the batch of {len(cases)} cases gave {len(got)} outputs, "
                           f"TFLite's {len(expected)}")
    floats = [r for r in report if isinstance(r, Fallback)]
    out = []
    for case, g_, e in zip(cases, got, expected):
        alive = len(np.unique(e)) >= MIN_ALIVE_VALUES
        if g_.shape != e.shape or not np.array_equal(g_, e):
            diff = difference(g_, e) if g_.shape == e.shape else None
            detail = (f"shape {g_.shape} != {e.shape}" if diff is None else
                      f"{int((diff > 0).sum())}/{diff.size} elements differ, up to "
                      f"{diff.max():g}")
            out.append(Outcome(case, "differs", detail, alive))
        else:
            out.append(Outcome(case, "ok", "", alive))
    if floats:  # which cases hold them: compile each alone (rare)
        for o in out:
            alone = single_case(seed, o.case.index, ops, chains)
            rep = build.inspect(alone, level)
            reasons = [r.line() for r in rep if isinstance(r, Fallback)]
            if reasons and o.kind == "ok":
                o.kind, o.detail = "float", "; ".join(reasons)
    return out


def single_case(seed: int, index: int, ops, chains):
    return batch_model(seed, [index], ops, chains)[0]


def reproducer(session, level: str, o: Outcome, ops, chains, out_dir: Path) -> str:
    """Write the case alone and find the ``run --seed`` that shows its failure."""
    from tvm_armq import build, export

    model = single_case(o.case.seed, o.case.index, ops, chains)
    stem = out_dir / f"{level}-{o.case.name}"
    path = stem.with_suffix(".tflite")
    path.write_bytes(model.data)
    stem.with_suffix(".json").write_text(json.dumps(
        {"level": level, "seed": o.case.seed, "index": o.case.index, "kind": o.kind,
         "detail": o.detail, "layers": o.case.layers}, indent=1, default=_jsonable))
    shows = None
    if o.kind == "differs":
        try:
            lib = export.export_aarch64(build.compile_tflite(model, level),
                                        out_dir / f"{level}-{o.case.name}.so")
            for k in range(4):
                ins = model.random_inputs(k)
                got = build.run_on_device(session, lib, ins)
                if any(not np.array_equal(a, b)
                       for a, b in zip(got, model.reference_outputs(ins))):
                    shows = k
                    break
        except Exception as e:  # noqa: BLE001 - a reproducer that fails to build still is one
            return f"{path} (alone it fails to build: {e})"
    seed = f" --seed {shows}" if shows is not None else ""
    note = "" if shows is not None or o.kind != "differs" else "  (alone: same on seeds 0-3)"
    return f"python -m tvm_armq run {path} --isa {level}{seed}{note}"


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)


def fuzz(level: str, n: int, seed: int, ops, *, batch: int = 24, chains: float = 0.2,
         out_dir: Path | None = None, session=None, log=print,
         cases: list[int] | None = None) -> list[Outcome]:
    """Draw, compile, run and compare ``n`` cases at ``level`` (or the case numbers
    ``cases``); write reproducers of the failures to ``out_dir`` (if given). Returns
    every case's outcome."""
    outcomes: list[Outcome] = []
    chosen = list(cases) if cases is not None else list(range(n))
    with tempfile.TemporaryDirectory(prefix="tvm_armq_fuzz_") as tmp:
        for start in range(0, len(chosen), batch):
            indices = chosen[start:start + batch]
            t0 = time.time()
            try:
                got = run_batch(session, level, seed, indices, ops, chains, Path(tmp))
            except Exception:  # noqa: BLE001 - find the case(s) that break it
                got = []
                for i in indices:
                    try:
                        got += run_batch(session, level, seed, [i], ops, chains, Path(tmp))
                    except Exception as e:  # noqa: BLE001 - reported as the case's outcome
                        case = batch_model(seed, [i], ops, chains)[1][0]
                        got.append(Outcome(case, "error", f"{type(e).__name__}: "
                                           f"{str(e).strip().splitlines()[-1][:300]}"))
            outcomes += got
            bad = [o for o in got if o.kind != "ok"]
            log(f"[{level}] cases {indices[0]}-{indices[-1]}: {len(got) - len(bad)} exact, "
                f"{len(bad)} failing ({time.time() - t0:.0f} s)")
            for o in bad:
                log(f"  {o.kind}: {o.case.name} {o.case.describe()}\n    {o.detail}")
                if out_dir is not None:
                    log(f"    reproduce: {reproducer(session, level, o, ops, chains, out_dir)}")
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    kinds = collections.Counter(o.kind for o in outcomes)
    mix = collections.Counter(op for o in outcomes for op, _ in o.case.layers)
    dead = sum(not o.alive for o in outcomes)
    return (f"{len(outcomes)} cases ({sum(mix.values())} layers): "
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
            + f"; {dead} with a constant output\nop mix: "
            + ", ".join(f"{k} {v}" for k, v in mix.most_common()))


def main() -> int:
    from tvm_armq import device
    from tvm_armq.targets import LEVELS

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--isa", choices=list(LEVELS), default="neon")
    ap.add_argument("--n", type=int, default=100, help="cases to draw")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ops", help="comma-separated, of --list (default: every int8 op; "
                                  "with --dynamic the hybrid ones)")
    ap.add_argument("--dynamic", action="store_true",
                    help="dynamic-range layers (float32 activations, int8 weights: "
                         + ", ".join(HYBRID) + ")")
    ap.add_argument("--batch", type=int, default=24, help="cases per compiled module")
    ap.add_argument("--chains", type=float, default=0.2, help="share of 3-6 layer chains")
    ap.add_argument("--out", type=Path, default=Path("fuzz-out"), help="reproducers here")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads the device runs the kernels with (their parallel loops)")
    ap.add_argument("--cases", help="only these case numbers (comma-separated): a replay")
    ap.add_argument("--list", action="store_true", help="print the ops and exit")
    a = ap.parse_args()
    if a.list:
        for name, gen in LAYERS.items():
            print(f"{name:16s} weight {WEIGHT[name]:.1f}")
        return 0
    default = list(HYBRID) if a.dynamic else INT8_LAYERS
    ops = [o.strip() for o in (a.ops or ",".join(default)).split(",") if o.strip()]
    unknown = [o for o in ops if o not in LAYERS]
    if unknown:
        ap.error(f"--ops: unknown {', '.join(unknown)} (known: {', '.join(LAYERS)})")
    a.out.mkdir(parents=True, exist_ok=True)
    # away from the devices' default ports, which the test suite's devices take
    dev = device.start(a.isa, port=FUZZ_PORT, env={"TVM_NUM_THREADS": str(a.threads)})
    t0 = time.time()
    try:
        outcomes = fuzz(a.isa, a.n, a.seed, ops, batch=a.batch, chains=a.chains,
                        out_dir=a.out, session=dev.endpoint.connect(),
                        cases=[int(c) for c in a.cases.split(",")] if a.cases else None)
    finally:
        dev.stop()
    print(summary(outcomes))
    print(f"{a.isa}, seed {a.seed}: {time.time() - t0:.0f} s")
    return 0 if all(o.kind == "ok" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
