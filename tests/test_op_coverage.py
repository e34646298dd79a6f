"""Quantized ops that real CNNs use around their convolutions, each as a single-op model,
compiled for every ISA level (in the fast tier, a case whose kernels are the same at every
level for one of them: ``TIERED``), run on the emulated device and compared with TFLite's
reference kernels, bit for bit; the compile report must show no layer left in float.

The cases are data (``CASES``: name, op, tensors, inputs, outputs, options): data
movement the frontend imports exactly (STRIDED_SLICE, SLICE, TRANSPOSE, SQUEEZE,
EXPAND_DIMS, GATHER, SPLIT, PACK, PAD), MAXIMUM / MINIMUM (broadcast and constant
forms), ADD / MUL / SUB with a constant per-channel operand (a batch-norm the converter
folded; SUB's constant first as well), SUB of two tensors (and broadcast),
SQUARED_DIFFERENCE (two tensors, broadcast, a constant either side), SPACE_TO_DEPTH and
DEPTH_TO_SPACE (data movement the frontend imports exactly), PRELU (alpha per channel,
and one alpha for all), TRANSPOSE_CONV (per-channel weights, bias, SAME and VALID, the
output sizes TFLite accepts past the usual one, a fused ReLU), RESIZE_BILINEAR and
RESIZE_NEAREST_NEIGHBOR (up and down, align_corners, half_pixel_centers), MAX_POOL_2D
with SAME and VALID padding whose windows cross every border, and a two-input op of one
tensor and a table op of it (swish, ``x * LOGISTIC(x)``, either operand order; ``x +
TANH(x)``; ``x - RELU6(x)``; the table op's output also a model output), which the pass
folds into one table: ``test_an_op_of_one_tensor_and_its_table_op_is_one_lookup``
checks the fold, the cases that it is TFLite's arithmetic.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from armq_checks import one_level_in_turn, same_code_at_every_level, tier
from tvm_armq import build
from tvm_armq.targets import LEVELS as _LEVELS
from tvm_armq.frontend.model import TFLiteModel
from tvm_armq.frontend.writer import Operator, graph_model, single_op_model
from tvm_armq.report import Fallback

pytestmark = pytest.mark.device

Q_IN, Q_B, Q_OUT = (0.05, 3), (0.02, -7), (0.04, -2)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    op: str                  # tflite.BuiltinOperator name
    tensors: tuple = ()      # dicts for frontend.writer.single_op_model
    inputs: tuple = ()
    outputs: tuple = ()
    options: object = None   # (BuiltinOptions name, function(tflite, builder) -> offset)
    written: bytes | None = None  # or the model, from the op's own test module's writer


def _i32(values):
    values = np.asarray(values, np.int32)
    return dict(shape=values.shape, dtype="int32", data=values)


def _t(shape, q=Q_IN, data=None):
    return dict(shape=shape, dtype="int8", q=q, data=data)


def _const_int8(shape, seed):
    return np.random.RandomState(seed).randint(-128, 128, shape).astype(np.int8)


def _strided_slice_options(tfl, b):
    tfl.StridedSliceOptionsStart(b)
    return tfl.StridedSliceOptionsEnd(b)


def _split_options(n):
    def build_options(tfl, b):
        tfl.SplitOptionsStart(b)
        tfl.SplitOptionsAddNumSplits(b, n)
        return tfl.SplitOptionsEnd(b)
    return build_options


def _squeeze_options(tfl, b):
    tfl.SqueezeOptionsStartSqueezeDimsVector(b, 1)
    b.PrependInt32(2)
    dims = b.EndVector()
    tfl.SqueezeOptionsStart(b)
    tfl.SqueezeOptionsAddSqueezeDims(b, dims)
    return tfl.SqueezeOptionsEnd(b)


def _pack_options(tfl, b):
    tfl.PackOptionsStart(b)
    tfl.PackOptionsAddValuesCount(b, 2)
    tfl.PackOptionsAddAxis(b, 1)
    return tfl.PackOptionsEnd(b)


def _gather_options(tfl, b):
    tfl.GatherOptionsStart(b)
    tfl.GatherOptionsAddAxis(b, 3)
    return tfl.GatherOptionsEnd(b)


def _pool_options(pool, stride, same):
    def build_options(tfl, b):
        tfl.Pool2DOptionsStart(b)
        tfl.Pool2DOptionsAddPadding(b, tfl.Padding.SAME if same else tfl.Padding.VALID)
        tfl.Pool2DOptionsAddStrideH(b, stride)
        tfl.Pool2DOptionsAddStrideW(b, stride)
        tfl.Pool2DOptionsAddFilterHeight(b, pool)
        tfl.Pool2DOptionsAddFilterWidth(b, pool)
        return tfl.Pool2DOptionsEnd(b)
    return build_options


def _binary(name, op, a_shape, b_shape, out_shape, b_const=False, options=None):
    b = _t(b_shape, Q_B, _const_int8(b_shape, len(name)) if b_const else None)
    return Case(name, op, (_t(a_shape), b, _t(out_shape, Q_OUT)), (0, 1), (2,), options)


def _minmax(name, op, a_shape, b_shape, out_shape, b_const=False):
    """MAXIMUM / MINIMUM: one quantization for every tensor, as TFLite's converter gives."""
    b = _t(b_shape, Q_IN, _const_int8(b_shape, len(name)) if b_const else None)
    return Case(name, op, (_t(a_shape), b, _t(out_shape)), (0, 1), (2,))


def _add_options(tfl, b):
    tfl.AddOptionsStart(b)
    return tfl.AddOptionsEnd(b)


def _mul_options(tfl, b):
    tfl.MulOptionsStart(b)
    return tfl.MulOptionsEnd(b)


def _sub_options(tfl, b):
    tfl.SubOptionsStart(b)
    return tfl.SubOptionsEnd(b)


def _squared_difference_options(tfl, b):
    tfl.SquaredDifferenceOptionsStart(b)
    return tfl.SquaredDifferenceOptionsEnd(b)


def _block_options(kind, size):
    def build_options(tfl, b):
        getattr(tfl, f"{kind}OptionsStart")(b)
        getattr(tfl, f"{kind}OptionsAddBlockSize")(b, size)
        return getattr(tfl, f"{kind}OptionsEnd")(b)
    return (f"{kind}Options", build_options)


Q_SQUARE = (0.4, -120)  # the squares of differences of Q_IN and Q_B values: 0 to ~160


def _squared_difference(name, a_shape, b_shape, b_const=False, const_first=False):
    """SQUARED_DIFFERENCE (no activation), its output scale fitted to the squares."""
    b = _t(b_shape, Q_B, _const_int8(b_shape, len(name)) if b_const else None)
    out = _t(np.broadcast_shapes(a_shape, b_shape), Q_SQUARE)
    tensors = (b, _t(a_shape), out) if const_first else (_t(a_shape), b, out)
    return Case(name, "SQUARED_DIFFERENCE", tensors, (0, 1), (2,),
                ("SquaredDifferenceOptions", _squared_difference_options))


def _transpose_conv(name, in_shape, out_c, k, stride, same, extra=0, act=0):
    """TRANSPOSE_CONV with per-channel int8 weights and an int32 bias; ``extra`` output
    rows and columns past the usual size (down to 1 - stride for SAME, up to stride - 1 for
    VALID: what TFLite accepts). The output scale is fitted to TFLite's accumulators on a random
    input, so that the outputs spread over the 8-bit range."""
    from test_transpose_conv import transpose_conv_model

    from tvm_armq.schedules import reference as ref
    from tvm_armq.schedules.window import transpose_conv_padding

    n, h, w, c = in_shape
    rng = np.random.RandomState(len(name))
    weights = rng.randint(-127, 128, (out_c, k, k, c)).astype(np.int8)
    w_scales = (0.002 + 0.004 * rng.rand(out_c)).astype(np.float32)
    bias = rng.randint(-500, 500, out_c).astype(np.int32)
    out_hw = [(d * stride if same else (d - 1) * stride + k) + extra for d in (h, w)]
    pad_top, pad_left = (transpose_conv_padding(o, k, stride, same) for o in out_hw)
    acc = ref.transpose_conv_nhwc(rng.randint(-128, 128, in_shape), weights, bias, out_hw,
                                  in_zp=Q_IN[1], strides=(stride,) * 2, pad_top=pad_top,
                                  pad_left=pad_left)
    out_q = (float(np.float32((acc * (Q_IN[0] * w_scales)).std() / 40)), -5)
    return Case(name, "TRANSPOSE_CONV", written=transpose_conv_model(
        in_shape, weights, bias, (n, *out_hw, out_c), Q_IN, w_scales, out_q, (stride,) * 2,
        same, act))


def _resize(name, op, in_shape, out_hw, align_corners=False, half_pixel=False):
    """RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR; one quantization in and out, as TFLite's
    converter gives."""
    from test_resize import resize_model

    return Case(name, op, written=resize_model(op, in_shape, out_hw, Q_IN, "int8",
                                               align_corners, half_pixel))


def _pool(name, in_hw, pool, stride, same):
    out = [(n + stride - 1) // stride if same else (n - pool) // stride + 1 for n in in_hw]
    return Case(name, "MAX_POOL_2D", (_t((1, *in_hw, 19)), _t((1, *out, 19))), (0,), (1,),
                ("Pool2DOptions", _pool_options(pool, stride, same)))


# what the converter gives LOGISTIC and TANH outputs (TFLite's fixed quantization)
Q_LOGISTIC, Q_TANH = (1 / 256, -128), (1 / 128, 0)


def _of_one_tensor(name, unary, unary_q, binary, options, x_first=True, both_out=False):
    """``binary(x, unary(x))`` (or ``binary(unary(x), x)``) on a 1x8x8x24 tensor: tensors
    x, u = unary(x), out; the model's outputs ``out`` (and ``u`` if ``both_out``)."""
    import tflite

    op = tflite.BuiltinOperator
    kind, make = options
    opts = (getattr(tflite.BuiltinOptions, kind), lambda b: make(tflite, b))
    shape = (1, 8, 8, 24)
    tensors = [_t(shape), _t(shape, unary_q), _t(shape, Q_OUT)]
    tensors = [{k: v for k, v in t.items() if v is not None} for t in tensors]
    operators = [Operator(getattr(op, unary), (0,), (1,), None, 1),
                 Operator(getattr(op, binary), (0, 1) if x_first else (1, 0), (2,), opts, 1)]
    return Case(name, binary, written=graph_model(tensors, operators, [0],
                                                  [1, 2] if both_out else [2]))


ONE_TENSOR_CASES = [
    _of_one_tensor("swish", "LOGISTIC", Q_LOGISTIC, "MUL", ("MulOptions", _mul_options)),
    _of_one_tensor("swish_table_first", "LOGISTIC", Q_LOGISTIC, "MUL",
                   ("MulOptions", _mul_options), x_first=False),
    _of_one_tensor("x_plus_tanh", "TANH", Q_TANH, "ADD", ("AddOptions", _add_options)),
    _of_one_tensor("relu6_minus_x", "RELU6", Q_IN, "SUB", ("SubOptions", _sub_options),
                   x_first=False),
    _of_one_tensor("swish_and_logistic_out", "LOGISTIC", Q_LOGISTIC, "MUL",
                   ("MulOptions", _mul_options), both_out=True),
]

CASES = ONE_TENSOR_CASES + [
    Case("strided_slice", "STRIDED_SLICE",
         (_t((1, 9, 10, 7)), _i32([0, 1, 2, 0]), _i32([1, 8, 10, 7]), _i32([1, 2, 3, 1]),
          _t((1, 4, 3, 7))), (0, 1, 2, 3), (4,),
         ("StridedSliceOptions", _strided_slice_options)),
    Case("slice", "SLICE", (_t((1, 8, 8, 21)), _i32([0, 2, 1, 3]), _i32([1, 5, 6, 17]),
                            _t((1, 5, 6, 17))), (0, 1, 2), (3,)),
    Case("transpose", "TRANSPOSE", (_t((1, 5, 6, 17)), _i32([0, 3, 1, 2]), _t((1, 17, 5, 6))),
         (0, 1), (2,)),
    Case("squeeze", "SQUEEZE", (_t((1, 7, 1, 19)), _t((1, 7, 19))), (0,), (1,),
         ("SqueezeOptions", _squeeze_options)),
    Case("expand_dims", "EXPAND_DIMS", (_t((1, 7, 19)), _i32([2]), _t((1, 7, 1, 19))), (0, 1),
         (2,)),
    Case("gather", "GATHER", (_t((1, 4, 5, 9)), _i32([8, 0, 3, 3, 5]), _t((1, 4, 5, 5))),
         (0, 1), (2,), ("GatherOptions", _gather_options)),
    Case("split", "SPLIT", (_i32(3), _t((1, 4, 4, 24)), _t((1, 4, 4, 8)), _t((1, 4, 4, 8)),
                            _t((1, 4, 4, 8))), (0, 1), (2, 3, 4),
         ("SplitOptions", _split_options(3))),
    Case("pack", "PACK", (_t((3, 17)), _t((3, 17)), _t((3, 2, 17))), (0, 1), (2,),
         ("PackOptions", _pack_options)),
    _minmax("maximum", "MAXIMUM", (1, 5, 6, 19), (1, 5, 6, 19), (1, 5, 6, 19)),
    _minmax("minimum_broadcast", "MINIMUM", (1, 5, 6, 19), (1, 1, 1, 19), (1, 5, 6, 19)),
    _minmax("maximum_const", "MAXIMUM", (1, 5, 6, 19), (19,), (1, 5, 6, 19), b_const=True),
    _binary("mul_per_channel_const", "MUL", (1, 6, 5, 21), (21,), (1, 6, 5, 21), True,
            ("MulOptions", _mul_options)),
    _binary("add_per_channel_const", "ADD", (1, 6, 5, 21), (21,), (1, 6, 5, 21), True,
            ("AddOptions", _add_options)),
    _binary("mul_const_first_axes", "MUL", (2, 3, 33), (1, 3, 1), (2, 3, 33), True,
            ("MulOptions", _mul_options)),
    _binary("sub", "SUB", (1, 6, 5, 21), (1, 6, 5, 21), (1, 6, 5, 21), False,
            ("SubOptions", _sub_options)),
    _binary("sub_broadcast", "SUB", (1, 6, 5, 21), (1, 1, 1, 21), (1, 6, 5, 21), False,
            ("SubOptions", _sub_options)),
    _binary("sub_per_channel_const", "SUB", (1, 6, 5, 21), (21,), (1, 6, 5, 21), True,
            ("SubOptions", _sub_options)),
    Case("sub_const_first", "SUB", (_t((21,), Q_B, _const_int8((21,), 5)), _t((1, 6, 5, 21)),
                                    _t((1, 6, 5, 21), Q_OUT)), (0, 1), (2,),
         ("SubOptions", _sub_options)),
    _squared_difference("squared_difference", (1, 6, 5, 21), (1, 6, 5, 21)),
    _squared_difference("squared_difference_broadcast", (2, 3, 33), (1, 3, 1)),
    _squared_difference("squared_difference_const", (1, 6, 5, 21), (21,), b_const=True),
    _squared_difference("squared_difference_const_first", (1, 4, 4, 19), (19,), b_const=True,
                        const_first=True),
    Case("space_to_depth", "SPACE_TO_DEPTH", (_t((2, 6, 4, 7)), _t((2, 3, 2, 28))), (0,), (1,),
         _block_options("SpaceToDepth", 2)),
    Case("depth_to_space", "DEPTH_TO_SPACE", (_t((1, 3, 2, 36)), _t((1, 9, 6, 4))), (0,), (1,),
         _block_options("DepthToSpace", 3)),
    Case("prelu", "PRELU", (_t((1, 6, 5, 21)), _t((1, 1, 21), Q_B, _const_int8((1, 1, 21), 9)),
                            _t((1, 6, 5, 21), Q_OUT)), (0, 1), (2,)),
    Case("prelu_shared_axes", "PRELU", (_t((1, 4, 6, 19)), _t((1, 1, 1), Q_B, np.array(
        [[[-77]]], np.int8)), _t((1, 4, 6, 19), Q_OUT)), (0, 1), (2,)),
    _transpose_conv("transpose_conv_3x3_s2_same_relu", (1, 5, 6, 8), 12, 3, 2, True, act=1),
    _transpose_conv("transpose_conv_2x2_s2_valid", (1, 4, 4, 16), 8, 2, 2, False),
    _transpose_conv("transpose_conv_1x1_s2_same", (1, 4, 5, 24), 16, 1, 2, True),
    _transpose_conv("transpose_conv_4x4_s2_same_short", (1, 3, 4, 8), 5, 4, 2, True, extra=-1),
    _transpose_conv("transpose_conv_3x3_s2_valid_long", (1, 3, 3, 8), 7, 3, 2, False, extra=1),
    # one phase: the convolution is the layer; 20 channels: a vector and a rest per pixel
    _transpose_conv("transpose_conv_3x3_s1_same", (1, 6, 7, 12), 20, 3, 1, True),
    # kernel 2 < stride 3: every third row and column is the bias alone
    _transpose_conv("transpose_conv_2x2_s3_valid_long", (1, 3, 4, 8), 6, 2, 3, False, extra=1),
    # SAME 3x3 stride 3 two rows short: a phase's convolution starts a row early
    _transpose_conv("transpose_conv_3x3_s3_same_short", (1, 2, 3, 8), 6, 3, 3, True, extra=-2),
    _resize("resize_bilinear_2x", "RESIZE_BILINEAR", (1, 5, 6, 19), (10, 12)),
    _resize("resize_bilinear_align_corners", "RESIZE_BILINEAR", (1, 5, 6, 19), (9, 13), True),
    _resize("resize_bilinear_half_pixel", "RESIZE_BILINEAR", (2, 5, 6, 19), (12, 7),
            half_pixel=True),
    _resize("resize_bilinear_down", "RESIZE_BILINEAR", (1, 9, 8, 33), (4, 5), half_pixel=True),
    _resize("resize_nearest_2x", "RESIZE_NEAREST_NEIGHBOR", (1, 5, 6, 19), (10, 12)),
    _resize("resize_nearest_align_corners", "RESIZE_NEAREST_NEIGHBOR", (1, 5, 6, 19), (9, 13),
            True),
    _resize("resize_nearest_half_pixel", "RESIZE_NEAREST_NEIGHBOR", (2, 5, 6, 19), (12, 7),
            half_pixel=True),
    _pool("max_pool_same_3x3_s2", (9, 10), 3, 2, True),
    _pool("max_pool_same_2x2_s2_odd", (7, 7), 2, 2, True),
    _pool("max_pool_same_3x3_s1", (5, 6), 3, 1, True),
    _pool("max_pool_valid_3x3_s2", (9, 10), 3, 2, False),
]


def _model(case: Case) -> bytes:
    import tflite

    if case.written is not None:
        return case.written

    options = None
    if case.options is not None:
        kind, make = case.options
        options = (getattr(tflite.BuiltinOptions, kind), lambda b: make(tflite, b))
    tensors = [{k: v for k, v in t.items() if v is not None} for t in case.tensors]
    return single_op_model(getattr(tflite.BuiltinOperator, case.op), tensors,
                           list(case.inputs), list(case.outputs), options, version=1)


# Ops whose kernels differ between ISA levels (a GEMM per level): their cases run at every
# level in the fast tier; every other case compiles to the same ``_neon`` kernels (or to
# TVM's own code) at each level and runs at one level, in turn, the other two in the
# exhaustive tier (``test_level_independent_cases_are`` checks the split).
LEVEL_DEPENDENT_OPS = {"TRANSPOSE_CONV"}
LEVELS = tuple(_LEVELS)


def _fast_levels(i: int, case: Case) -> tuple[str, ...]:
    return LEVELS if case.op in LEVEL_DEPENDENT_OPS else (one_level_in_turn(i),)


TIERED = [tier(level, case.name, id=f"{level}-{case.name}", fast=level in _fast_levels(i, case))
          for i, case in enumerate(CASES) for level in LEVELS]
BY_NAME = {c.name: c for c in CASES}
SEEDS = (0, 1)


@pytest.mark.parametrize("level, name", TIERED)
def test_op_is_integer_and_bit_exact(compiled_models, level, name):
    report, runs = compiled_models(level, name, _model(BY_NAME[name]), SEEDS)
    floats = [r.line() for r in report if isinstance(r, Fallback)]
    assert floats == [], floats
    assert len(runs) == len(SEEDS)
    for seed, (got, expected) in zip(SEEDS, runs):
        assert len(got) == len(expected) > 0
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype
            np.testing.assert_array_equal(g, e, err_msg=f"{name} at {level}, seed {seed}")
            assert len(np.unique(e)) > min(16, e.size // 4), "outputs must vary"


def test_level_independent_cases_are():
    """The cases the fast tier runs at one level compile to the same ``_neon`` kernels (or
    TVM's own code) at every level; the others' kernels differ between levels. Nothing is
    built."""
    for case in CASES:
        independent = same_code_at_every_level(TFLiteModel.load(_model(case)))
        assert independent == (case.op not in LEVEL_DEPENDENT_OPS), case.name


@pytest.mark.parametrize("case", ONE_TENSOR_CASES, ids=lambda c: c.name)
def test_an_op_of_one_tensor_and_its_table_op_is_one_lookup(case):
    model, report, kernels = TFLiteModel.load(_model(case)), [], {}
    build.compile_tflite(model, "neon", report=report, kernels=kernels)
    binary = [r for r in report if r.op in ("multiply", "add", "subtract")]
    assert [r.kernel for r in binary] == ["lut_s8_neon"], [r.line() for r in report]
    # the table op's own lookup is left only where the model outputs its result
    both_out = len(model.signature()[1]) == 2
    assert sorted(kernels.values()) == [("logistic", "lut_s8_neon")] * both_out + \
        [(binary[0].op, "lut_s8_neon")], kernels
