"""8-bit ADD, MUL, MEAN, AVERAGE_POOL_2D, requantize (QUANTIZE) and SOFTMAX
(``schedules.int8_ops``), bit-exact against TFLite's reference kernels.

Three layers of evidence:

1. Host: the NumPy references (``schedules.reference``) with the Prepare parameters of
   ``int8_ops.*_params`` equal TFLite's ``BUILTIN_REF`` kernels on single-op models written
   with the ``tflite`` package's flatbuffer builder (``frontend.writer.single_op_model``), so
   that any scale, zero point, shape, keep_dims or activation can be tried. A seeded random
   sweep of ~160 models covers shifts both ways, zero points across the range,
   broadcasting, int8 and uint8.
2. Device, per ISA level (neon and i8mm): every case of ``CASES`` built into one module,
   uploaded once and run in one session; each output equals the NumPy reference and
   TFLite's output on the same model (checked on the host in 1.).
3. Device: the zoo's ``add``, ``mean``, ``avg_pool`` and ``concat`` models, with their
   quantization read from the .tflite files, against TFLite on the models themselves; and
   the MEAN (keep_dims true: MobileNet's global average pool) of ``mobilenet_v1_0.25`` and
   the ADDs and MEAN of ``resnet_block``, against the tensors TFLite computes inside those
   nets (``experimental_preserve_all_tensors``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import numpy as np
import pytest
from armq_checks import tier

from tvm_armq.frontend.writer import single_op_model
from tvm_armq.schedules import int8_ops as ops
from tvm_armq.schedules import reference as ref
from tvm_armq.schedules import softmax as softmax_ops
from tvm_armq.schedules.window import same_padding
from tvm_armq.targets import LEVELS
from tvm_armq.frontend.layers import activation_range

pytestmark = pytest.mark.device

DEVICE_LEVELS = ("neon", "i8mm")  # the portable baseline and the richest level

# tflite.ActivationFunctionType / tflite.Padding values
ACT_NONE, ACT_RELU, ACT_RELU_N1_TO_1, ACT_RELU6 = 0, 1, 2, 3
PADDING_SAME, PADDING_VALID = 0, 1
SOFTMAX_OUT_SCALE = 1.0 / 256  # TFLite's fixed 8-bit softmax output scale
SOFTMAX_OUT_ZP = {"int8": -128, "uint8": 0}


# ----------------------------------------------------------------- single-op .tflite models
def _activation_options(start, add_act, end, act):
    def build_options(b):
        start(b)
        add_act(b, act)
        return end(b)
    return build_options


def _binary_model(op_name: str, a_shape, b_shape, a_q, b_q, out_q, act, dtype) -> bytes:
    import tflite

    opt = {"ADD": "AddOptions", "MUL": "MulOptions", "SUB": "SubOptions",
           "SQUARED_DIFFERENCE": "SquaredDifferenceOptions"}[op_name]
    if op_name == "SQUARED_DIFFERENCE":  # no fused activation
        def options(b):
            tflite.SquaredDifferenceOptionsStart(b)
            return tflite.SquaredDifferenceOptionsEnd(b)
    else:
        options = _activation_options(getattr(tflite, f"{opt}Start"),
                                      getattr(tflite, f"{opt}AddFusedActivationFunction"),
                                      getattr(tflite, f"{opt}End"), act)
    out_shape = np.broadcast_shapes(tuple(a_shape), tuple(b_shape))
    tensors = [dict(shape=a_shape, dtype=dtype, q=a_q), dict(shape=b_shape, dtype=dtype, q=b_q),
               dict(shape=out_shape, dtype=dtype, q=out_q)]
    return single_op_model(getattr(tflite.BuiltinOperator, op_name), tensors, [0, 1], [2],
                            (getattr(tflite.BuiltinOptions, opt), options))


def _mean_model(shape, axes, keepdims, in_q, out_q, dtype) -> bytes:
    import tflite

    def options(b):
        tflite.ReducerOptionsStart(b)
        tflite.ReducerOptionsAddKeepDims(b, keepdims)
        return tflite.ReducerOptionsEnd(b)

    out_shape = np.zeros(shape, np.int8).sum(axis=tuple(axes), keepdims=keepdims).shape
    tensors = [dict(shape=shape, dtype=dtype, q=in_q),
               dict(shape=(len(axes),), dtype="int32", data=np.array(axes, np.int32)),
               dict(shape=out_shape, dtype=dtype, q=out_q)]
    return single_op_model(tflite.BuiltinOperator.MEAN, tensors, [0, 1], [2],
                            (tflite.BuiltinOptions.ReducerOptions, options))


def _pool_model(shape, pool, strides, same: bool, q, act, dtype) -> bytes:
    import tflite

    def options(b):
        tflite.Pool2DOptionsStart(b)
        tflite.Pool2DOptionsAddPadding(b, PADDING_SAME if same else PADDING_VALID)
        tflite.Pool2DOptionsAddStrideH(b, strides[0])
        tflite.Pool2DOptionsAddStrideW(b, strides[1])
        tflite.Pool2DOptionsAddFilterHeight(b, pool[0])
        tflite.Pool2DOptionsAddFilterWidth(b, pool[1])
        tflite.Pool2DOptionsAddFusedActivationFunction(b, act)
        return tflite.Pool2DOptionsEnd(b)

    pad = _pool_padding(shape, pool, strides, same)
    out_shape = ref.average_pool(np.zeros(shape, np.int8), pool, strides, pad, (0, 0)).shape
    tensors = [dict(shape=shape, dtype=dtype, q=q), dict(shape=out_shape, dtype=dtype, q=q)]
    return single_op_model(tflite.BuiltinOperator.AVERAGE_POOL_2D, tensors, [0], [1],
                            (tflite.BuiltinOptions.Pool2DOptions, options))


def _quantize_model(shape, in_q, out_q, in_dtype, out_dtype) -> bytes:
    import tflite

    tensors = [dict(shape=shape, dtype=in_dtype, q=in_q),
               dict(shape=shape, dtype=out_dtype, q=out_q)]
    return single_op_model(tflite.BuiltinOperator.QUANTIZE, tensors, [0], [1])


def _softmax_model(shape, in_q, beta, dtype) -> bytes:
    import tflite

    def options(b):
        tflite.SoftmaxOptionsStart(b)
        tflite.SoftmaxOptionsAddBeta(b, beta)
        return tflite.SoftmaxOptionsEnd(b)

    tensors = [dict(shape=shape, dtype=dtype, q=in_q),
               dict(shape=shape, dtype=dtype, q=(SOFTMAX_OUT_SCALE, SOFTMAX_OUT_ZP[dtype]))]
    return single_op_model(tflite.BuiltinOperator.SOFTMAX, tensors, [0], [1],
                            (tflite.BuiltinOptions.SoftmaxOptions, options))


def _pool_padding(shape, pool, strides, same: bool):
    return same_padding(shape[1:3], pool, strides) if same else (0, 0, 0, 0)


def _tflite(model: bytes, inputs):
    from tvm_armq.frontend.model import TFLiteModel

    return TFLiteModel.load(model).reference_outputs(list(inputs))[0]


# ----------------------------------------------------------------------------- the cases
@dataclasses.dataclass(frozen=True)
class Built:
    """One case made concrete: the PrimFunc, its arguments, the expected output."""

    func: object
    args: list  # the func's inputs (its output comes last and is allocated by the runner)
    expected: np.ndarray
    tflite: bytes | None  # the same computation as a single-op model (None: NumPy only)
    tflite_inputs: list


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[np.random.Generator], Built]


def _data(rng, shape, dtype="int8", extremes=False):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype)
    if extremes:  # most values at the ends of the range: sums and rounding at their limits
        ends = rng.random(x.shape) < 0.8
        x[ends] = rng.choice(np.array([info.min, info.max], dtype), ends.sum())
    return x


def _near(rng, shape, zp: int, spread: int, dtype="int8"):
    """Values within ``spread`` of the zero point: small real values, for scales above 1."""
    info = np.iinfo(dtype)
    x = zp + rng.integers(-spread, spread, shape, endpoint=True)
    return np.clip(x, info.min, info.max).astype(dtype)


def _per_channel(rng, shape, dtype="int8", noise: int = 15):
    """Each channel (last axis) around its own level: averages spread over the range."""
    info = np.iinfo(dtype)
    levels = rng.integers(info.min, info.max, shape[-1], endpoint=True)
    x = levels + rng.integers(-noise, noise, shape, endpoint=True)
    return np.clip(x, info.min, info.max).astype(dtype)


def _act(act, out_q, dtype):
    return activation_range(act, out_q[0], out_q[1], dtype)


def _add_case(name, a_shape, b_shape, a_q, b_q, out_q, act=ACT_NONE, dtype="int8",
              constant=False):
    """``constant``: b is a compile-time constant, handed to the kernel rescaled."""
    def make(rng):
        out_shape = np.broadcast_shapes(a_shape, b_shape)
        act_range = _act(act, out_q, dtype)
        a, b = _data(rng, a_shape, dtype), _data(rng, b_shape, dtype)
        p = ops.add_params(a_q, b_q, out_q, act_range, dtype)
        func = ops.add_func(a_shape, b_shape, out_shape, a_q, b_q, out_q, act_range, dtype,
                            constant=b if constant else None)
        func, b_arg = func if constant else (func, b)
        return Built(func, [a, b_arg], ref.broadcast_add(a, b, **dataclasses.asdict(p)),
                     _binary_model("ADD", a_shape, b_shape, a_q, b_q, out_q, act, dtype), [a, b])
    return Case(name, make)


def _mul_case(name, a_shape, b_shape, a_q, b_q, out_q, act=ACT_NONE, dtype="int8",
              spread=None):
    def make(rng):
        out_shape = np.broadcast_shapes(a_shape, b_shape)
        act_range = _act(act, out_q, dtype)
        if spread is None:
            a, b = _data(rng, a_shape, dtype), _data(rng, b_shape, dtype)
        else:
            a, b = (_near(rng, s, q[1], spread, dtype)
                    for s, q in ((a_shape, a_q), (b_shape, b_q)))
        p = ops.mul_params(a_q, b_q, out_q, act_range, dtype)
        return Built(ops.mul_func(a_shape, b_shape, out_shape, a_q, b_q, out_q, act_range, dtype),
                     [a, b], ref.broadcast_mul(a, b, **dataclasses.asdict(p)),
                     _binary_model("MUL", a_shape, b_shape, a_q, b_q, out_q, act, dtype), [a, b])
    return Case(name, make)


def _mean_case(name, shape, axes, keepdims, in_q, out_q, dtype="int8", extremes=False,
               spread=None):
    def make(rng):
        if spread is not None:
            x = _near(rng, shape, in_q[1], spread, dtype)
        else:
            x = _data(rng, shape, dtype, extremes) if extremes else _per_channel(rng, shape, dtype)
        count = int(np.prod([shape[a] for a in axes]))
        p = ops.mean_params(count, in_q, out_q, dtype)
        return Built(ops.mean_func(shape, axes, keepdims, in_q, out_q, dtype), [x],
                     ref.mean(x, axes, keepdims, **dataclasses.asdict(p)),
                     _mean_model(shape, axes, keepdims, in_q, out_q, dtype), [x])
    return Case(name, make)


def _pool_case(name, shape, pool, strides, same, act=ACT_NONE, q=(0.05, -3), dtype="int8",
               extremes=False, padding=None):
    """SAME/VALID pooling (also a TFLite model), or explicit ``padding`` (NumPy only)."""
    def make(rng):
        x = _data(rng, shape, dtype, extremes)
        pad = padding if padding is not None else _pool_padding(shape, pool, strides, same)
        act_range = _act(act, q, dtype)
        model = None if padding is not None else _pool_model(shape, pool, strides, same, q,
                                                             act, dtype)
        return Built(ops.avg_pool_func(shape, pool, strides, pad, act_range, dtype), [x],
                     ref.average_pool(x, pool, strides, pad, act_range, dtype), model, [x])
    return Case(name, make)


def _requantize_case(name, shape, in_q, out_q, in_dtype="int8", out_dtype="int8",
                     spread=None):
    def make(rng):
        x = _data(rng, shape, in_dtype) if spread is None else \
            _near(rng, shape, in_q[1], spread, in_dtype)
        p = ops.requantize_params(in_q, out_q, in_dtype, out_dtype)
        return Built(ops.requantize_func(shape, in_q, out_q, in_dtype, out_dtype), [x],
                     ref.requantize_tensor(x, **dataclasses.asdict(p)),
                     _quantize_model(shape, in_q, out_q, in_dtype, out_dtype), [x])
    return Case(name, make)


def _softmax_case(name, shape, in_q, beta=1.0, dtype="int8", peaks=None, spread=None):
    """Uniform inputs, or with ``peaks``: that many large entries per row over low ones
    (a classifier's logits: a long row whose probabilities do not all round to 0), or
    with ``spread``: each row within ``spread`` of its own level (attention scores: many
    probabilities well above 0 in a row)."""
    def make(rng):
        x = _data(rng, shape, dtype)
        if spread is not None:
            info = np.iinfo(dtype)
            levels = rng.integers(info.min + spread, info.max - spread, shape[:-1] + (1,),
                                  endpoint=True)
            x = (levels + rng.integers(-spread, spread, shape, endpoint=True)).astype(dtype)
        if peaks is not None:
            info = np.iinfo(dtype)
            low = rng.integers(info.min, info.min + 60, shape, endpoint=True)
            high = rng.integers(info.max - 70, info.max, shape, endpoint=True)
            top = rng.random(shape).argsort(axis=-1) < peaks
            x = np.where(top, high, low).astype(dtype)
        func, table = softmax_ops.softmax_func(shape, in_q, beta, dtype)
        p = softmax_ops.softmax_params(in_q, beta, dtype)
        return Built(func, [x, table], ref.softmax(x, **dataclasses.asdict(p)),
                     _softmax_model(shape, in_q, beta, dtype), [x])
    return Case(name, make)


CASES = [
    # ADD: the output shift is always a right shift (TFLite requires it); broadcasting in
    # every direction; zero points at the ends of the range; fused ReLU / ReLU6 / none.
    _add_case("add_same_shape_relu", (1, 7, 9, 24), (1, 7, 9, 24), (0.02, -128), (0.05, 127),
              (0.06, -128), ACT_RELU),
    _add_case("add_channel_broadcast_relu6", (1, 5, 6, 40), (1, 1, 1, 40), (0.031, 5),
              (0.012, -60), (0.04, -20), ACT_RELU6),
    _add_case("add_rows_and_columns", (2, 3, 1, 5), (1, 1, 4, 1), (0.5, 0), (0.25, 10),
              (0.6, 3)),
    _add_case("add_scalar_2d", (3, 37), (1,), (0.004, 60), (0.1, -1), (0.08, 100)),
    _add_case("add_equal_scales", (1, 4, 4, 16), (1, 4, 4, 16), (0.03, 1), (0.03, 1),
              (0.05, -7), ACT_RELU_N1_TO_1),
    _add_case("add_channel_constant_relu6", (1, 5, 6, 40), (40,), (0.031, 5), (0.012, -3),
              (0.04, -128), ACT_RELU6, constant=True),
    _add_case("add_constant_uint8", (2, 3, 37), (1, 3, 1), (0.004, 60), (0.1, 1), (0.08, 100),
              dtype="uint8", constant=True),
    _add_case("add_uint8", (1, 6, 5, 19), (1, 6, 5, 19), (0.02, 0), (0.07, 255), (0.08, 128),
              ACT_RELU, dtype="uint8"),
    # MUL: scales below and above 1 (right and left shifts)
    _mul_case("mul_same_shape", (1, 6, 6, 24), (1, 6, 6, 24), (0.05, -128), (0.02, 30),
              (0.04, 0)),
    _mul_case("mul_broadcast_left_shift", (1, 4, 4, 16), (1, 1, 1, 16), (0.01, 3), (0.02, -5),
              (0.00005, -10), spread=6),  # 0.01 * 0.02 / 0.00005 = 4: shift +3
    _mul_case("mul_rows_relu6", (2, 1, 7, 3), (1, 5, 1, 3), (0.1, 20), (0.05, -20), (0.3, -128),
              ACT_RELU6),
    _mul_case("mul_uint8", (1, 3, 3, 35), (1, 3, 3, 35), (0.03, 128), (0.04, 7), (0.05, 250),
              dtype="uint8"),
    # MEAN: keep_dims both ways, axes in either order, equal / different quantization, the
    # 1/n fold with a left shift left over, a reduced channel axis, odd channel counts
    _mean_case("mean_hw_keepdims", (1, 7, 7, 64), (1, 2), True, (0.0235, -128), (0.0096, -128)),
    _mean_case("mean_hw_reversed_axes", (2, 5, 4, 24), (2, 1), False, (0.05, 3), (0.03, -11)),
    _mean_case("mean_same_quantization", (1, 6, 6, 16), (1, 2), True, (0.04, 9), (0.04, 9)),
    _mean_case("mean_left_shift", (1, 2, 2, 8), (1, 2), False, (0.08, 0), (0.005, -3),
               spread=7),  # 0.08 / 0.005 = 16 and n = 4: shift +2 after the 1/n fold
    _mean_case("mean_w_only", (1, 5, 6, 8), (2,), False, (0.02, -100), (0.01, 50)),
    _mean_case("mean_channels_keepdims", (1, 3, 4, 21), (3,), True, (0.02, 5), (0.01, -5)),
    _mean_case("mean_35_channels_extremes", (1, 16, 16, 35), (1, 2), False, (0.1, 127),
               (0.2, 60), extremes=True),
    _mean_case("mean_uint8", (1, 4, 4, 32), (1, 2), True, (0.02, 128), (0.015, 100),
               dtype="uint8"),
    # AVERAGE_POOL_2D: SAME (border windows average fewer pixels) and VALID, strides, ReLU
    _pool_case("pool_3x3_s2_same", (1, 16, 16, 8), (3, 3), (2, 2), True),
    _pool_case("pool_2x2_valid", (2, 6, 7, 35), (2, 2), (2, 2), False),
    _pool_case("pool_3x2_s21_same_relu", (1, 7, 9, 24), (3, 2), (2, 1), True, ACT_RELU,
               q=(0.03, -40)),
    _pool_case("pool_5x5_same_extremes", (1, 5, 5, 16), (5, 5), (1, 1), True, extremes=True),
    _pool_case("pool_uint8_relu6", (1, 8, 8, 16), (3, 3), (1, 1), True, ACT_RELU6,
               q=(0.04, 10), dtype="uint8"),
    # a window over more than 1024 pixels divides with truncdiv, not by multiplication
    _pool_case("pool_global_36x44_valid", (1, 36, 44, 8), (36, 44), (1, 1), False,
               extremes=True),
    _pool_case("pool_explicit_asymmetric_padding", (1, 6, 7, 12), (3, 3), (2, 2), False,
               padding=(2, 0, 1, 2)),
    # QUANTIZE 8-bit -> 8-bit: scale down (right shift), up (left shift), identity, types
    _requantize_case("requantize_right_shift", (2, 7, 35), (0.05, 3), (0.2, -9)),
    _requantize_case("requantize_left_shift", (1, 8, 8, 16), (0.2, -100), (0.03, -128),
                     spread=30),
    _requantize_case("requantize_identity", (1, 4, 4, 16), (0.0196, 25), (0.0196, 25)),
    _requantize_case("requantize_int8_to_uint8", (3, 50), (0.05, 0), (0.05, 128),
                     out_dtype="uint8"),
    _requantize_case("requantize_uint8", (1, 5, 5, 8), (0.1, 200), (0.07, 30), "uint8",
                     "uint8"),
    # SOFTMAX: rows of 10 to 1000, beta, 1-D, uint8; attention's rows of 17, 65 and 197
    # (a remainder to 16 lanes; row counts that are no multiple of the kernel's groups of
    # four), scores close together
    _softmax_case("softmax_attention_17", (1, 2, 9, 17), (0.11, 3), spread=20),
    _softmax_case("softmax_attention_65_beta", (1, 3, 7, 65), (0.09, -2), beta=0.7, spread=40),
    _softmax_case("softmax_attention_197_uint8", (5, 197), (0.07, 128), dtype="uint8",
                  spread=50),
    _softmax_case("softmax_10", (1, 10), (0.03, 5)),
    _softmax_case("softmax_3x100", (3, 100), (0.02, -7)),
    _softmax_case("softmax_3d_beta_half", (2, 5, 7), (0.05, 0), beta=0.5),
    _softmax_case("softmax_1000_logits", (1, 1000), (0.05, 3), peaks=12),
    _softmax_case("softmax_1d", (33,), (0.08, -128)),
    _softmax_case("softmax_uint8", (2, 30), (0.06, 128), dtype="uint8"),
]


def _built(cases):
    return [case.build(np.random.default_rng(i)) for i, case in enumerate(cases)]


# ------------------------------------------------------------------------ host-side checks
def test_cases_reference_matches_tflite():
    """Each device case's NumPy reference equals TFLite's reference kernel on the same
    single-op model: the expected outputs of the device test are TFLite's."""
    for case, b in zip(CASES, _built(CASES)):
        assert len(np.unique(b.expected)) > 4, f"{case.name}: the case must spread its outputs"
        if b.tflite is not None:
            np.testing.assert_array_equal(b.expected, _tflite(b.tflite, b.tflite_inputs),
                                          err_msg=case.name)


def _random_q(rng, dtype, lo=-3.0, hi=0.0):
    info = np.iinfo(dtype)
    return float(np.float32(10 ** rng.uniform(lo, hi))), int(rng.integers(info.min, info.max + 1))


def test_sub_and_squared_difference_references_match_tflite():
    """SUB and SQUARED_DIFFERENCE, ADD's recipe with a difference (and its square): a
    seeded sweep of scales, zero points over the whole range and broadcast shapes, the
    NumPy reference against TFLite's kernels (SQUARED_DIFFERENCE: int8 only, no
    activation, an output scale that keeps TFLite's output factor below 1)."""
    rng = np.random.default_rng(20261124)
    shapes = [((1, 5, 6, 8), (1, 5, 6, 8)), ((1, 5, 6, 8), (1, 1, 1, 8)),
              ((2, 3, 1, 4), (1, 1, 5, 1)), ((3, 4), (4,))]
    checked = lively = 0
    for trial in range(40):
        op = ("SUB", "SQUARED_DIFFERENCE")[trial % 2]
        dtype = "int8" if op == "SQUARED_DIFFERENCE" else ("int8", "uint8")[trial // 2 % 2]
        a_shape, b_shape = shapes[trial % len(shapes)]
        a, b = _data(rng, a_shape, dtype, extremes=trial % 5 == 0), _data(rng, b_shape, dtype)
        a_q = _random_q(rng, dtype)  # b's scale within a decade of a's
        b_q = (float(np.float32(a_q[0] * 10 ** rng.uniform(-1, 1))), _random_q(rng, dtype)[1])
        twice = 2 * max(a_q[0], b_q[0])
        low = int(np.iinfo(dtype).min)
        if op == "SUB":  # an output scale about the inputs' difference, zero point mid-range
            out_q = (float(np.float32(twice * 10 ** rng.uniform(-0.5, 0.5))),
                     low + 128 + int(rng.integers(-48, 48)))
            act = (ACT_NONE, ACT_RELU)[trial // 2 % 2]
        else:  # an output scale about the square's, (255 s)**2 / 255; zero point low
            out_q, act = (float(np.float32(twice * twice * 10 ** rng.uniform(0.5, 2.5))),
                          low + int(rng.integers(0, 64))), ACT_NONE
        act_range = _act(act, out_q, dtype)
        if act_range[0] > act_range[1]:
            continue
        p = ops.add_params(a_q, b_q, out_q, act_range, dtype, op)
        expected = _tflite(_binary_model(op, a_shape, b_shape, a_q, b_q, out_q, act, dtype),
                           [a, b])
        np.testing.assert_array_equal(ref.broadcast_add(a, b, **dataclasses.asdict(p)),
                                      expected, err_msg=f"{op} {p}")
        lively += len(np.unique(expected)) > 8
        checked += 1
    assert checked >= 30
    assert lively >= 0.75 * checked, f"only {lively} of {checked} outputs vary"


def _prelu_model(x_shape, alpha, x_q, alpha_q, out_q, dtype) -> bytes:
    import tflite

    tensors = [dict(shape=x_shape, dtype=dtype, q=x_q),
               dict(shape=alpha.shape, dtype=dtype, q=alpha_q, data=alpha),
               dict(shape=x_shape, dtype=dtype, q=out_q)]
    return single_op_model(tflite.BuiltinOperator.PRELU, tensors, [0, 1], [2], version=1)


def test_prelu_reference_matches_tflite():
    """PRELU with a constant alpha (per channel, as Keras' PReLU; or shared over H and W),
    a seeded sweep of scales and zero points over the whole range: the NumPy reference
    against TFLite's kernel."""
    rng = np.random.default_rng(20261125)
    shapes = [((1, 5, 6, 8), (8,)), ((1, 5, 6, 8), (1, 1, 8)), ((2, 3, 4, 5), (3, 1, 5))]
    checked = lively = 0
    for trial in range(30):
        dtype = ("int8", "uint8")[trial % 2]
        x_shape, alpha_shape = shapes[trial % len(shapes)]
        x, alpha = _data(rng, x_shape, dtype, extremes=trial % 5 == 0), \
            _data(rng, alpha_shape, dtype)
        x_q, alpha_q = _random_q(rng, dtype), _random_q(rng, dtype, -3.0, -1.0)
        out_q = (float(np.float32(x_q[0] * 10 ** rng.uniform(-0.7, 0.7))),
                 _random_q(rng, dtype)[1])
        p = ops.prelu_params(x_q, alpha_q, out_q, dtype)
        expected = _tflite(_prelu_model(x_shape, alpha, x_q, alpha_q, out_q, dtype), [x])
        np.testing.assert_array_equal(ref.prelu(x, alpha, **dataclasses.asdict(p)),
                                      expected, err_msg=f"PRELU {p}")
        lively += len(np.unique(expected)) > 8
        checked += 1
    assert lively >= 0.75 * checked, f"only {lively} of {checked} outputs vary"


def test_reference_sweep_matches_tflite():
    """A seeded random sweep, broader than the device cases: random scales (1/1000 to 1,
    so rescaling factors below and above 1: right and left shifts), zero points, shapes,
    keep_dims and axes, pooling geometry, activations, int8 and uint8, each a single-op
    TFLite model compared with the NumPy reference."""
    rng = np.random.default_rng(20240611)
    checked = 0
    shapes = [((1, 5, 6, 8), (1, 5, 6, 8)), ((1, 5, 6, 8), (1, 1, 1, 8)),
              ((2, 3, 1, 4), (1, 1, 5, 1)), ((3, 4), (4,)), ((7,), (1,))]
    for trial in range(30):
        dtype = ("int8", "uint8")[trial % 2]
        a_shape, b_shape = shapes[trial % len(shapes)]
        a, b = _data(rng, a_shape, dtype), _data(rng, b_shape, dtype)
        act = trial % 4
        a_q, b_q, out_q = (_random_q(rng, dtype) for _ in range(3))
        act_range = _act(act, out_q, dtype)
        if act_range[0] <= act_range[1] and 2 * max(a_q[0], b_q[0]) < out_q[0] * (1 << 20):
            p = ops.add_params(a_q, b_q, out_q, act_range, dtype)
            model = _binary_model("ADD", a_shape, b_shape, a_q, b_q, out_q, act, dtype)
            np.testing.assert_array_equal(ref.broadcast_add(a, b, **dataclasses.asdict(p)),
                                          _tflite(model, [a, b]), err_msg=f"ADD {p}")
            checked += 1
        out_q = (float(np.float32(a_q[0] * b_q[0] * 10 ** rng.uniform(-2, 3))), out_q[1])
        act_range = _act(act, out_q, dtype)
        if act_range[0] <= act_range[1]:
            p = ops.mul_params(a_q, b_q, out_q, act_range, dtype)
            model = _binary_model("MUL", a_shape, b_shape, a_q, b_q, out_q, act, dtype)
            np.testing.assert_array_equal(ref.broadcast_mul(a, b, **dataclasses.asdict(p)),
                                          _tflite(model, [a, b]), err_msg=f"MUL {p}")
            checked += 1
    for trial in range(30):
        dtype = ("int8", "uint8")[trial % 2]
        shape = [(1, 7, 9, 8), (2, 4, 4, 3), (1, 16, 16, 8), (1, 1, 5, 4)][trial % 4]
        axes = [(1, 2), (2, 1), (1,), (2,), (1, 2, 3), (3,)][trial % 6]
        keep = trial % 3 == 0
        in_q = _random_q(rng, dtype)
        out_q = in_q if trial % 5 == 0 else (float(np.float32(in_q[0] * 10 ** rng.uniform(-1, 1))),
                                            _random_q(rng, dtype)[1])
        x = _data(rng, shape, dtype)
        p = ops.mean_params(int(np.prod([shape[a] for a in axes])), in_q, out_q, dtype)
        np.testing.assert_array_equal(
            ref.mean(x, axes, keep, **dataclasses.asdict(p)),
            _tflite(_mean_model(shape, axes, keep, in_q, out_q, dtype), [x]),
            err_msg=f"MEAN {shape} {axes} keep_dims={keep} {in_q} -> {out_q}")
        checked += 1
    for trial in range(24):
        dtype = ("int8", "uint8")[trial % 2]
        shape = [(1, 7, 9, 8), (2, 6, 6, 3), (1, 16, 16, 8)][trial % 3]
        pool = [(3, 3), (2, 2), (3, 2), (5, 5)][trial % 4]
        strides = [(1, 1), (2, 2), (2, 1)][trial % 3]
        same, act = trial % 2 == 0, [ACT_NONE, ACT_RELU, ACT_RELU6][trial % 3]
        q = _random_q(rng, dtype)
        act_range = _act(act, q, dtype)
        if act_range[0] > act_range[1]:
            continue
        x = _data(rng, shape, dtype, extremes=trial % 4 == 1)
        np.testing.assert_array_equal(
            ref.average_pool(x, pool, strides, _pool_padding(shape, pool, strides, same),
                             act_range, dtype),
            _tflite(_pool_model(shape, pool, strides, same, q, act, dtype), [x]),
            err_msg=f"AVERAGE_POOL_2D {shape} {pool} {strides} same={same}")
        checked += 1
    for trial in range(24):
        in_dtype, out_dtype = [("int8", "int8"), ("uint8", "uint8"), ("int8", "uint8"),
                               ("uint8", "int8")][trial % 4]
        in_q, out_q = _random_q(rng, in_dtype), _random_q(rng, out_dtype)
        x = _data(rng, (2, 5, 7), in_dtype)
        p = ops.requantize_params(in_q, out_q, in_dtype, out_dtype)
        np.testing.assert_array_equal(
            ref.requantize_tensor(x, **dataclasses.asdict(p)),
            _tflite(_quantize_model((2, 5, 7), in_q, out_q, in_dtype, out_dtype), [x]),
            err_msg=f"QUANTIZE {in_q} -> {out_q}")
        checked += 1
    for trial in range(24):
        dtype = ("int8", "uint8")[trial % 2]
        shape = [(1, 10), (3, 100), (2, 5, 7), (1, 300)][trial % 4]
        in_q = (float(np.float32(10 ** rng.uniform(-2, 0))), _random_q(rng, dtype)[1])
        beta = [1.0, 0.5, 2.0][trial % 3]
        x = _data(rng, shape, dtype)
        np.testing.assert_array_equal(
            ref.softmax(x, **dataclasses.asdict(softmax_ops.softmax_params(in_q, beta, dtype))),
            _tflite(_softmax_model(shape, in_q, beta, dtype), [x]),
            err_msg=f"SOFTMAX {shape} {in_q} beta={beta}")
        checked += 1
    assert checked > 140


def test_division_by_multiplication_is_exact():
    """AVERAGE_POOL_2D's division (``int8_ops._rounded_average``): for every window size
    up to the limit, SRDHM(2u, ceil(2**30 / count)) (gemmlowp's definition, in NumPy)
    equals TFLite's (u + count // 2) // count at the hardest values of u: around each
    multiple and half multiple of count, and up to 255 * count."""
    from tvm_armq.intrinsics.requant import saturating_rounding_doubling_high_mul as srdhm

    for count in range(1, ops.POOL_MAX_WINDOW + 1):
        recip = -(-(1 << ops.POOL_RECIPROCAL_BITS) // count)
        k = np.arange(256, dtype=np.int64)
        u = np.concatenate([k * count + d for d in (-1, 0, 1, count // 2 - 1, count // 2,
                                                     (count + 1) // 2)])
        u = u[(u >= 0) & (u <= 255 * count)]
        np.testing.assert_array_equal(srdhm(2 * u, recip), (u + count // 2) // count,
                                      err_msg=f"count {count}")


def test_errors_name_the_op():
    with pytest.raises(ValueError, match="ADD: output shape"):
        ops.add_func((1, 4), (1, 4), (1, 5), (0.1, 0), (0.1, 0), (0.1, 0))
    with pytest.raises(ValueError, match="MUL: shapes"):
        ops.mul_func((1, 4), (3,), (1, 4), (0.1, 0), (0.1, 0), (0.1, 0))
    with pytest.raises(TypeError, match="MEAN: dtype"):
        ops.mean_func((1, 4, 4, 8), (1, 2), True, (0.1, 0), (0.1, 0), dtype="int16")
    with pytest.raises(ValueError, match="MEAN: axis 4"):
        ops.mean_func((1, 4, 4, 8), (1, 4), True, (0.1, 0), (0.1, 0))
    with pytest.raises(ValueError, match="AVERAGE_POOL_2D: padding"):
        ops.avg_pool_func((1, 4, 4, 8), (2, 2), (1, 1), (2, 0, 0, 0))
    with pytest.raises(ValueError, match="ADD: the output rescaling factor"):
        ops.add_params((1.0, 0), (1.0, 0), (1e-7, 0))
    with pytest.raises(ValueError, match="QUANTIZE: output zero point 300"):
        ops.requantize_params((0.1, 0), (0.1, 300))


# ------------------------------------------------------------------------------ on device
def _zoo_op(path, op_name: str):
    """The operators ``op_name`` of a .tflite file: for each, its inputs and outputs as
    dicts (tensor index, shape, dtype, (scale, zero point) or None, constant data or None)
    and its builtin options table."""
    import tflite

    model = tflite.Model.GetRootAsModel(path.read_bytes(), 0)
    graph = model.Subgraphs(0)
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    dtypes = {tflite.TensorType.INT8: "int8", tflite.TensorType.UINT8: "uint8",
              tflite.TensorType.INT32: "int32"}

    def tensor(i):
        t = graph.Tensors(int(i))
        q = t.Quantization()
        buf = model.Buffers(t.Buffer()).DataAsNumpy() if t.Buffer() else 0
        dtype = dtypes[t.Type()]
        return dict(index=int(i), shape=tuple(t.ShapeAsNumpy().tolist()), dtype=dtype,
                    q=(q.Scale(0), int(q.ZeroPoint(0))) if q is not None and q.ScaleLength()
                    else None,
                    data=np.frombuffer(buf.tobytes(), dtype) if not isinstance(buf, int) else None)

    found = []
    for k in range(graph.OperatorsLength()):
        op = graph.Operators(k)
        if names[model.OperatorCodes(op.OpcodeIndex()).BuiltinCode()] != op_name:
            continue
        opts = getattr(tflite, {"ADD": "AddOptions", "MEAN": "ReducerOptions",
                                "AVERAGE_POOL_2D": "Pool2DOptions",
                                "CONCATENATION": "ConcatenationOptions"}[op_name])()
        opts.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
        found.append((([tensor(i) for i in op.InputsAsNumpy()],
                       [tensor(i) for i in op.OutputsAsNumpy()], opts)))
    assert found, f"{path.name} has no {op_name}"
    return found


def _zoo_kernel(op_name: str, ins, outs, opts):
    """The PrimFunc of a zoo operator, built from the parameters in the file."""
    out = outs[0]
    if op_name == "ADD":
        act = _act(opts.FusedActivationFunction(), out["q"], out["dtype"])
        return ops.add_func(ins[0]["shape"], ins[1]["shape"], out["shape"], ins[0]["q"],
                            ins[1]["q"], out["q"], act, out["dtype"])
    if op_name == "MEAN":
        return ops.mean_func(ins[0]["shape"], ins[1]["data"].tolist(), bool(opts.KeepDims()),
                             ins[0]["q"], out["q"], out["dtype"])
    if op_name == "AVERAGE_POOL_2D":
        pool, strides = (opts.FilterHeight(), opts.FilterWidth()), (opts.StrideH(), opts.StrideW())
        pad = _pool_padding(ins[0]["shape"], pool, strides, opts.Padding() == PADDING_SAME)
        return ops.avg_pool_func(ins[0]["shape"], pool, strides, pad,
                                 _act(opts.FusedActivationFunction(), out["q"], out["dtype"]),
                                 out["dtype"])
    raise AssertionError(op_name)


ZOO_OPS = {  # model -> the operators it is checked on
    "add": ("ADD",), "mean": ("MEAN",), "avg_pool": ("AVERAGE_POOL_2D",),
    "concat": ("CONCATENATION",),
    "mobilenet_v1_0.25": ("MEAN",),  # MobileNet's global average pool: keep_dims true
    "resnet_block": ("ADD", "MEAN"),  # residual ADDs of differently scaled operands
}
ZOO_SEEDS = 2  # random inputs per model


def _tflite_tensors(model, seed: int):
    """Run ``model`` in TFLite's reference kernels on random inputs; every tensor kept."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_content=model.data, num_threads=1,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF,
                     experimental_preserve_all_tensors=True)
    it.allocate_tensors()
    for d, x in zip(it.get_input_details(), model.random_inputs(seed=seed)):
        it.set_tensor(d["index"], x)
    it.invoke()
    return it


def _zoo_calls(zoo_model):
    """The zoo's operators: (func name, func, args, expected, label) with the operator's
    input and output tensors as TFLite computes them, in the single-op models and nets."""
    from tvm_armq.frontend.model import TFLiteModel

    calls = []
    for model_name, op_names in ZOO_OPS.items():
        path = zoo_model(model_name)
        model = TFLiteModel.load(path)
        runs = [_tflite_tensors(model, seed) for seed in range(ZOO_SEEDS)]
        for op_name in op_names:
            for k, (ins, outs, opts) in enumerate(_zoo_op(path, op_name)):
                name = f"zoo_{model_name.replace('.', '_')}_{op_name.lower()}{k}"
                for seed, it in enumerate(runs):
                    label = f"{model_name} {op_name} #{k} seed {seed}"
                    data = [it.get_tensor(t["index"]) for t in ins if t["data"] is None]
                    expected = it.get_tensor(outs[0]["index"])
                    if op_name != "CONCATENATION":
                        calls.append((name, _zoo_kernel(op_name, ins, outs, opts), data,
                                      expected, label))
                        continue
                    # each input requantized to the output's quantization (the identity
                    # here: the converter gave the three tensors one scale and zero point)
                    axis = opts.Axis() % len(outs[0]["shape"])
                    bounds = np.cumsum([0] + [t["shape"][axis] for t in ins])
                    for i, (t, x) in enumerate(zip(ins, data)):
                        part = np.take(expected, range(bounds[i], bounds[i + 1]), axis=axis)
                        calls.append((f"{name}_input{i}", ops.requantize_func(
                            t["shape"], t["q"], outs[0]["q"]), [x], part, f"{label} input {i}"))
                    # then the copy itself
                    calls.append((f"{name}_copy", ops.concat_func([t["shape"] for t in ins],
                                                                  axis), data, expected,
                                  f"{label} copy"))
    return calls


# The CONCATENATION copy on its own (the reference is np.concatenate): channels of 16 + 4,
# 5 and 16 (whole vectors, remainders, a run narrower than a vector), a middle axis, the
# first axis (one row: no parallel loop), uint8.
CONCAT_CASES = [
    ("concat_channels", [(1, 3, 5, 20), (1, 3, 5, 5), (1, 3, 5, 16)], -1, "int8"),
    ("concat_rows", [(2, 3, 4, 8), (2, 1, 4, 8)], 1, "int8"),
    ("concat_batch", [(1, 2, 3), (2, 2, 3)], 0, "int8"),
    ("concat_u8", [(1, 7, 33), (1, 7, 2)], 2, "uint8"),
]


def _concat_calls():
    rng = np.random.default_rng(11)
    calls = []
    for name, shapes, axis, dtype in CONCAT_CASES:
        info = np.iinfo(dtype)
        xs = [rng.integers(info.min, info.max, sh, endpoint=True, dtype=dtype) for sh in shapes]
        calls.append((name, ops.concat_func(shapes, axis, dtype), xs,
                      np.concatenate(xs, axis=axis), name))
    return calls


_VECTOR_ASM = {  # each must appear in NEON vector form somewhere in the module
    "sqrdmulh": r"v\d+\.4s, v\d+\.4s",  # every requantization (qmuls), the pool's division
    "srshl": r"v\d+\.4s, v\d+\.4s",  # its rounding right shift
    "saddw": r"v\d+\.4s, v\d+\.4s, v\d+\.4h",  # MEAN and AVERAGE_POOL_2D sums
    "smull": r"v\d+\.4s, v\d+\.(4h|8h), v\d+\.(4h|8h)",  # MUL's 16 x 16-bit products
}


@pytest.mark.parametrize("level", DEVICE_LEVELS)
def test_int8_ops_on_device(run_funcs, level, zoo_model, tmp_path, report):
    """Every case and every zoo operator, one module, one session: bit-exact with the
    NumPy reference (= TFLite, ``test_cases_reference_matches_tflite``) and with TFLite's
    outputs on the zoo models; the requantization in NEON vector form."""
    funcs, calls, expected = {}, [], []
    for case, b in zip(CASES, _built(CASES)):
        funcs[case.name] = b.func
        calls.append((case.name, b.args, b.expected.shape, b.expected.dtype))
        expected.append((case.name, b.expected))
    zoo = _zoo_calls(zoo_model)
    for name, func, args, exp, label in zoo + _concat_calls():
        funcs[name] = func
        calls.append((name, args, exp.shape, exp.dtype))
        expected.append((label, exp))
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "int8_ops.so")
    for ins, operands in _VECTOR_ASM.items():
        assert re.search(rf"\b{ins}2?\s+{operands}", asm), f"no vector {ins} at {level}"
    for (name, exp), got in zip(expected, outs):
        np.testing.assert_array_equal(got, exp, err_msg=f"{name} at {level}")
    report(f"int8_ops {level:8s} {len(CASES)} cases + {len(zoo)} zoo operator runs + "
           f"{len(CONCAT_CASES)} concatenations bit-exact")


# ------------------------------------------------------------------ SOFTMAX, every level
def _softmax_sweep():
    """Seeded SOFTMAX cases beyond ``CASES``: the vector kernel's row lengths around its
    16-lane vectors and 8-byte words (16, 17, 24, 31, 33, 64, 65, 96, 197, 257), row
    counts around its groups of four rows and tasks of two groups (1 to 13 rows), input
    scales and betas from probabilities spread over a row to one that takes all,
    int8 and uint8."""
    rng = np.random.default_rng(20260512)
    cases = []
    for k, depth in enumerate((16, 17, 24, 31, 33, 64, 65, 96, 197, 257)):
        rows = int(rng.integers(1, 14))
        dtype = ("int8", "uint8")[k % 2]
        scale = float(np.float32(10 ** rng.uniform(-2.2, -0.3)))
        zp = int(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1))
        beta = (1.0, 0.5, 1.7)[k % 3]
        shape = (rows, depth) if k % 3 else (1, rows, depth)
        cases.append(_softmax_case(f"softmax_sweep_{depth}x{rows}", shape, (scale, zp), beta,
                                   dtype, spread=int(rng.integers(5, 60)) if k % 4 else None))
    return cases


@pytest.mark.parametrize("level", [tier(level, id=level, fast=False) for level in LEVELS])
def test_softmax_every_level(run_funcs, level, tmp_path):
    """SOFTMAX's vector kernel is NEON at every level: every softmax case of ``CASES`` and
    a sweep of row lengths, row counts, scales and betas (``_softmax_sweep``), bit-exact
    with the NumPy reference at each level, and the sweep's references equal to TFLite's
    on the host."""
    cases = [c for c in CASES if c.name.startswith("softmax")] + _softmax_sweep()
    built = _built(cases)
    for case, b in zip(cases, built):
        if case.name.startswith("softmax_sweep"):
            np.testing.assert_array_equal(b.expected, _tflite(b.tflite, b.tflite_inputs),
                                          err_msg=case.name)
    funcs = {c.name: b.func for c, b in zip(cases, built)}
    calls = [(c.name, b.args, b.expected.shape, b.expected.dtype) for c, b in zip(cases, built)]
    _, outs = run_funcs(level, funcs, calls, tmp_path / "softmax.so")
    for case, b, got in zip(cases, built, outs):
        np.testing.assert_array_equal(got, b.expected, err_msg=f"{case.name} at {level}")
