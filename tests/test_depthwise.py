"""int8 depthwise conv2d (channels in NEON lanes, widening MACs), bit-exact on the device.

The sweep covers the geometry (depth multiplier 1 and 2, 3x3 and 5x5, stride 1 and 2,
dilation 2, SAME and VALID padding, symmetric and asymmetric; channel counts that are and
are not multiples of the 16-lane block: 8, 16, 24, 35) and the quantization (input zero
points across the range including -128 and 127, per-channel and per-tensor scales that
spread the outputs over the int8 range, ReLU/ReLU6-style clamps, operands at the int8
extremes for both the int16-pair and the per-product widening, scales above 1 (left
shifts) and the right-shift-only form). All cases of a level are one module, compiled
once, uploaded once, compared exactly with ``schedules.reference``.
Then the zoo's TFLite depthwise models, run by TFLite's reference kernels, are reproduced
bit for bit from the parameters stored in the .tflite files.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from armq_checks import assert_alive, function_asm

from tvm_armq import targets
from tvm_armq.intrinsics import kernels, requant
from tvm_armq.schedules import depthwise as dw
from tvm_armq.schedules import reference as ref
from tvm_armq.schedules.window import same_padding
from tvm_armq.frontend.layers import read_layer

pytestmark = pytest.mark.device

S = dw.DepthwiseShape


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: dw.DepthwiseShape
    in_zp: int
    out_zp: int
    act_range: tuple[int, int] = (-128, 127)
    per_tensor: bool = False  # one multiplier/shift for every channel
    extremes: bool = False  # operands mostly at the ends of the int8 range
    int16_pairs: bool = True  # False: every product widened on its own; weights may be -128
    max_shift: int | None = None  # the func may assume no larger shift (0: no ushl; -1: also
    # the one-instruction rounding fixup)
    small: bool = False  # tiny accumulators: scales above 1, positive (left) shifts
    padded_copy: bool | None = None  # multiplier 1: read a padded copy (None: the default)
    parallel_axis: str | None = None  # multiplier 1 in place: rows or channels (None: default)
    narrow: bool = False  # built for its own shift range, as the compiler builds it: a 3x3
    # kernel's output step then narrows to 16 bits (qmuls.requantize_narrow)
    lane_dots: bool = False  # taps in fours through sdot (lane_dot.lane_dot4): levels with
    # +dotprod only


def _same(h, w, k, s=1, d=1):
    return same_padding((h, w), (k, k), (s, s), (d, d))


CASES = [
    Case("c16_3x3_same", S(1, 7, 9, 16, padding=_same(7, 9, 3)), in_zp=-128, out_zp=5,
         max_shift=0),
    Case("c8_3x3_valid", S(1, 6, 7, 8), in_zp=127, out_zp=-3),
    Case("c24_3x3_s2_same_relu6", S(1, 10, 9, 24, strides=(2, 2),
                                    padding=_same(10, 9, 3, 2)),  # (0, 1, 1, 1): asymmetric
         in_zp=12, out_zp=-128, act_range=(-128, 40), max_shift=-1),
    Case("c35_3x3_d2_same_n2", S(2, 9, 8, 35, dilation=(2, 2), padding=_same(9, 8, 3, 1, 2)),
         in_zp=-1, out_zp=3),
    Case("c16_5x5_same_relu", S(1, 7, 6, 16, kh=5, kw=5, padding=_same(7, 6, 5)),
         in_zp=-20, out_zp=-128, act_range=(-128, 127)),
    Case("c35_5x5_s2_valid", S(1, 11, 10, 35, kh=5, kw=5, strides=(2, 2)), in_zp=40, out_zp=0),
    Case("c16_m2_3x3_same", S(1, 6, 6, 16, multiplier=2, padding=_same(6, 6, 3)), in_zp=0,
         out_zp=-7, max_shift=-1),
    Case("c24_m2_5x5_s2_asym", S(1, 9, 10, 24, multiplier=2, kh=5, kw=5, strides=(2, 2),
                                 padding=(1, 2, 2, 1)), in_zp=-77, out_zp=10),
    Case("c8_m2_3x3_d2_valid_pt", S(1, 8, 9, 8, multiplier=2, dilation=(2, 2)), in_zp=100,
         out_zp=-20, per_tensor=True),
    Case("c35_m2_3x3_s2_same_relu6", S(2, 7, 7, 35, multiplier=2, strides=(2, 2),
                                       padding=_same(7, 7, 3, 2)),
         in_zp=-128, out_zp=-128, act_range=(-128, 60)),
    Case("c16_3x3_extremes", S(1, 5, 5, 16, padding=(1, 1, 1, 1)), in_zp=127, out_zp=0,
         extremes=True),
    Case("c24_5x5_w128_wide", S(1, 6, 6, 24, kh=5, kw=5, padding=(2, 2, 2, 2)), in_zp=-128,
         out_zp=1, extremes=True, int16_pairs=False),
    Case("c24_3x3_small_acc", S(1, 6, 7, 24, padding=(1, 1, 1, 1)), in_zp=-50, out_zp=2,
         small=True),
    Case("c16_m2_3x3_small_acc", S(1, 5, 5, 16, multiplier=2), in_zp=90, out_zp=-2,
         small=True),
    # the two multiplier-1 forms on the shapes the other one is the default of
    Case("c16_5x5_same_in_place", S(1, 7, 6, 16, kh=5, kw=5, padding=_same(7, 6, 5)),
         in_zp=-20, out_zp=3, padded_copy=False),
    Case("c19_3x3_s2_same_padded_copy", S(1, 10, 9, 19, strides=(2, 2),
                                          padding=_same(10, 9, 3, 2)),
         in_zp=12, out_zp=-128, act_range=(-128, 40), padded_copy=True),
    Case("c35_3x3_d2_same_n2_padded_copy", S(2, 9, 8, 35, dilation=(2, 2),
                                             padding=_same(9, 8, 3, 1, 2)),
         in_zp=-1, out_zp=3, max_shift=0, padded_copy=True),
    Case("c40_5x5_same_4x4", S(1, 4, 4, 40, kh=5, kw=5, padding=_same(4, 4, 5)),
         in_zp=77, out_zp=-9),
    # the in-place form's two parallel axes, each on shapes the other is the default of
    # (channel blocks: every row region inside one parallel loop over blocks)
    Case("c64_3x3_same_channels", S(1, 7, 9, 64, padding=_same(7, 9, 3)), in_zp=-3,
         out_zp=8, max_shift=0),
    Case("c48_3x3_s2_same_channels", S(1, 10, 9, 48, strides=(2, 2),
                                       padding=_same(10, 9, 3, 2)),
         in_zp=12, out_zp=-128, act_range=(-128, 40), parallel_axis="channels"),
    Case("c32_3x3_d2_same_n2_channels", S(2, 9, 8, 32, dilation=(2, 2),
                                          padding=_same(9, 8, 3, 1, 2)),
         in_zp=-1, out_zp=3, parallel_axis="channels"),
    Case("c64_3x3_same_rows", S(1, 6, 7, 64, padding=_same(6, 7, 3)), in_zp=50, out_zp=-4,
         parallel_axis="rows"),
    # built for their shift range: the 16-bit output step (3x3: 8- and 4-lane vectors, ReLU6
    # and none, stride 2, multiplier 2), and the 5x5 that keeps the int32 form
    Case("c40_3x3_same_narrow", S(1, 7, 9, 40, padding=_same(7, 9, 3)), in_zp=-5, out_zp=9,
         narrow=True),
    Case("c24_3x3_s2_relu6_narrow", S(1, 10, 9, 24, strides=(2, 2),
                                      padding=_same(10, 9, 3, 2)),
         in_zp=12, out_zp=-128, act_range=(-128, 40), narrow=True),
    Case("c16_m2_3x3_narrow", S(1, 6, 6, 16, multiplier=2, padding=_same(6, 6, 3)), in_zp=0,
         out_zp=-7, narrow=True),
    Case("c16_5x5_narrow_bounds", S(1, 7, 6, 16, kh=5, kw=5, padding=_same(7, 6, 5)),
         in_zp=-20, out_zp=3, narrow=True),
    # taps in fours through sdot (and the ninth / 25th tap widened): in place and the
    # padded copy, a remainder of 8 lanes (the default rule), multiplier 2, weights of
    # -128 at the int8 extremes, per-product widening of the tap left over
    Case("c32_3x3_same_dots", S(1, 7, 9, 32, padding=_same(7, 9, 3)), in_zp=-5, out_zp=9,
         narrow=True, lane_dots=True),
    Case("c24_3x3_s2_relu6_dots", S(1, 10, 9, 24, strides=(2, 2),
                                    padding=_same(10, 9, 3, 2)),
         in_zp=12, out_zp=-128, act_range=(-128, 40), narrow=True, lane_dots=True),
    Case("c16_5x5_same_dots", S(1, 7, 6, 16, kh=5, kw=5, padding=_same(7, 6, 5)),
         in_zp=-20, out_zp=3, narrow=True, lane_dots=True),
    Case("c16_m2_3x3_dots", S(1, 6, 6, 16, multiplier=2, padding=_same(6, 6, 3)), in_zp=0,
         out_zp=-7, lane_dots=True),
    Case("c32_3x3_extremes_dots", S(1, 5, 6, 32, padding=(1, 1, 1, 1)), in_zp=127, out_zp=0,
         extremes=True, int16_pairs=False, lane_dots=True),
    Case("c48_3x3_d2_channels_dots", S(2, 9, 8, 48, dilation=(2, 2),
                                       padding=_same(9, 8, 3, 1, 2)),
         in_zp=-1, out_zp=3, parallel_axis="channels", lane_dots=True),
]


def _case_data(case: Case, seed: int):
    s, rng = case.shape, np.random.default_rng(seed)
    data = rng.integers(-128, 127, (s.batch, s.in_h, s.in_w, s.channels), endpoint=True,
                        dtype=np.int8)
    w_lo = -127 if case.int16_pairs else -128  # TFLite's weights are symmetric
    weight = rng.integers(w_lo, 127, (1, s.kh, s.kw, s.out_c), endpoint=True, dtype=np.int8)
    if case.extremes:  # most products at their largest: (-128) x (+-127), (-128) x (-128)
        ends = rng.random(data.shape) < 0.75
        data[ends] = rng.choice(np.array([-128, 127], np.int8), ends.sum())
        ends = rng.random(weight.shape) < 0.75
        weight[ends] = rng.choice(np.array([w_lo, 127], np.int8), ends.sum())
    if case.extremes:  # the int16 pair sums really reach their bound (see _pair_sums)
        top = np.abs(_pair_sums(case, data, weight)).max()
        assert top == (32512 if case.int16_pairs else 32768), top
    bias = rng.integers(-20000, 20000, s.out_c).astype(np.int32)
    if case.small:  # inputs near the zero point, tiny weights and bias
        data = np.clip(case.in_zp + rng.integers(-6, 6, data.shape, endpoint=True), -128,
                       127).astype(np.int8)
        weight = rng.integers(-2, 2, weight.shape, endpoint=True, dtype=np.int8)
        bias = rng.integers(-30, 30, s.out_c).astype(np.int32)
    acc = ref.depthwise_conv2d_nhwc(data, weight, bias, in_zp=case.in_zp,
                                    multiplier=s.multiplier, strides=s.strides,
                                    dilation=s.dilation, padding=s.padding)
    # Scales chosen so outputs spread over the int8 range, not saturate.
    spread = np.maximum(np.abs(acc).reshape(-1, s.out_c).max(axis=0), 1)
    if case.per_tensor:
        spread = np.full(s.out_c, spread.max())
    scales = rng.uniform(60, 160, 1 if case.per_tensor else s.out_c) / spread
    mult, shift = requant.quantize_multipliers(np.broadcast_to(scales, (s.out_c,)))
    assert (shift > 0).any() == case.small, "small cases (only) must have left shifts"
    lo, hi = case.act_range
    expected = ref.requantize(acc, mult, shift, case.out_zp, lo, hi, "int8")
    args = [data] + dw.pack_params(weight, bias, mult, shift, s, in_zp=case.in_zp,
                                   int16_pairs=case.int16_pairs, **_shift_bounds(case, shift))
    return args, expected


def _shift_bounds(case: Case, shift) -> dict:
    """The shift facts a case's func is built with: its own range for a ``narrow`` case."""
    if case.narrow:
        return dict(max_shift=int(shift.max()), min_shift=int(shift.min()))
    return dict(max_shift=case.max_shift)


def _pair_sums(case: Case, data, weight):
    """x0*w0 + x1*w1 for every tap pair (taps in (ky, kx) order, as the kernel pairs them)
    and output element: the int16 intermediate of the paired form, computed in int64.
    With weights of -128 (the per-product case) it reaches 32768, which the paired form
    could not hold."""
    s = case.shape
    zero = np.zeros(s.out_c, np.int64)
    products = []
    for ky in range(s.kh):
        for kx in range(s.kw):
            w = np.zeros((1, s.kh, s.kw, s.out_c), np.int8)
            w[0, ky, kx] = weight[0, ky, kx]
            # one tap's raw products x * w: the accumulator of that tap alone, zp 0
            products.append(ref.depthwise_conv2d_nhwc(
                data, w, zero, in_zp=0, multiplier=s.multiplier, strides=s.strides,
                dilation=s.dilation, padding=s.padding).astype(np.int64))
    products += [np.zeros_like(products[0])] * (len(products) % 2)
    return np.stack(products[0::2]) + np.stack(products[1::2])


def _func(shape, padded_copy=None, parallel_axis=None, **quant):
    f = dw.depthwise_func(shape, **quant)
    return dw.schedule_depthwise(f, shape, padded_copy=padded_copy,
                                 parallel_axis=parallel_axis)


# ------------------------------------------------------------------ host-side checks
def test_reference_on_known_values():
    """The yardstick first: a hand-checkable depthwise conv, and agreement with the
    grouped conv2d reference (groups = C), an independent formulation."""
    data = np.array([[[[1, 10], [2, 20]], [[3, 30], [4, 40]]]], np.int8)  # 1x2x2x2
    weight = np.ones((1, 2, 2, 4), np.int8)
    weight[..., 1] = 2  # channel 0, m = 1
    acc = ref.depthwise_conv2d_nhwc(data, weight, [0, 0, 0, 5], in_zp=1, multiplier=2)
    assert acc.tolist() == [[[[6, 12, 96, 101]]]]  # (0+1+2+3), 2*(..), (9+19+29+39), +5
    rng = np.random.default_rng(7)
    data = rng.integers(-128, 127, (2, 7, 6, 5), endpoint=True, dtype=np.int8)
    weight = rng.integers(-127, 127, (1, 3, 3, 10), endpoint=True, dtype=np.int8)
    bias = rng.integers(-999, 999, 10)
    kw = dict(in_zp=-9, strides=(2, 1), dilation=(1, 2), padding=(1, 0, 2, 3))
    grouped = ref.conv2d_nhwc(data, weight.reshape(3, 3, 1, 10), bias, groups=5, **kw)
    np.testing.assert_array_equal(
        ref.depthwise_conv2d_nhwc(data, weight, bias, multiplier=2, **kw), grouped)


def test_same_padding_is_tensorflows():
    assert same_padding((16, 16), (3, 3), (2, 2)) == (0, 0, 1, 1)  # odd pixel last
    assert same_padding((7, 9), (3, 3)) == (1, 1, 1, 1)
    assert same_padding((9, 8), (3, 3), (1, 1), (2, 2)) == (2, 2, 2, 2)
    assert same_padding((10, 9), (5, 5), (2, 2)) == (1, 2, 2, 2)
    for h, w, k, st, d in [(10, 9, 3, 2, 1), (9, 8, 3, 1, 2), (7, 7, 5, 2, 1), (6, 6, 3, 1, 1)]:
        s = S(1, h, w, 8, kh=k, kw=k, strides=(st, st), dilation=(d, d),
              padding=same_padding((h, w), (k, k), (st, st), (d, d)))
        assert (s.out_h, s.out_w) == (-(-h // st), -(-w // st))  # SAME: ceil(in / stride)


def test_packing_layout():
    s = S(1, 4, 4, 3, multiplier=2)
    w = np.arange(1 * 3 * 3 * 6, dtype=np.int8).reshape(1, 3, 3, 6)
    packed = dw.pack_weights(w, s, channel_block=8)
    assert packed.shape == (3, 3, 2, 8)
    for ky in range(3):
        for kx in range(3):
            for c in range(3):
                for m in range(2):
                    assert packed[ky, kx, m, c] == w[0, ky, kx, c * 2 + m]
    assert not packed[..., 3:].any()  # zero channels up to the block
    params = dw.pack_params(w, np.arange(6), [1 << 30] * 6, [-1] * 6, s, in_zp=2,
                            channel_block=8)
    assert [p.shape for p in params[1:]] == [(16,)] * 3 and not params[1][6:].any()
    assert params[1][0] == 0 - 2 * w[0, :, :, 0].astype(int).sum()  # folded bias


def test_paired_products_refuse_minus_128():
    """Two (-128) x (-128) products sum to 32768, which int16 cannot hold."""
    s = S(1, 4, 4, 16)
    w = np.full((1, 3, 3, 16), -128, np.int8)
    with pytest.raises(ValueError, match="int16_pairs=False"):
        dw.pack_weights(w, s, 16)
    assert dw.pack_weights(w, s, 16, int16_pairs=False).min() == -128


def test_bounded_shift_forms_refuse_larger_shifts():
    s = S(1, 4, 4, 16)
    w = np.ones((1, 3, 3, 16), np.int8)
    args = (w, np.zeros(16), np.full(16, 1 << 30), np.full(16, 1), s)
    with pytest.raises(ValueError, match="exceeds the func's max_shift=0"):
        dw.pack_params(*args, in_zp=0, max_shift=0)
    assert dw.pack_params(*args, in_zp=0)[3].max() == 1
    zero = (w, np.zeros(16), np.full(16, 1 << 30), np.zeros(16), s)
    with pytest.raises(ValueError, match="max_shift=-1"):
        dw.pack_params(*zero, in_zp=0, max_shift=-1)
    assert dw.pack_params(*zero, in_zp=0, max_shift=0)[3].max() == 0


def test_int16_pair_bound():
    """The exactness argument in numbers: products of int8 x symmetric int8 and their
    pairwise sums stay inside int16; only (-128) x (-128) twice would not."""
    x = np.arange(-128, 128, dtype=np.int64)
    p = np.outer(x, np.arange(-127, 128, dtype=np.int64))
    assert p.min() + p.min() >= -(1 << 15) and p.max() + p.max() <= (1 << 15) - 1
    assert 2 * (-128 * -128) == 1 << 15  # the one overflow the pairing must avoid


# ------------------------------------------------------------------------ on device
_VECTOR_ASM = {  # instruction -> operand arrangement: each must appear in vector form
    "smull": r"\.8h, v\d+\.8b",  # int8 x int8 -> int16
    "smlal": r"\.8h, v\d+\.8b",  # + a second product, in int16 (paired taps)
    "saddw": r"\.4s, v\d+\.4s, v\d+\.4h",  # int16 -> int32 accumulation
    "sqrdmulh": r"\.4s, v\d+\.4s",  # the requantization (qmuls)
    "srshl": r"\.4s, v\d+\.4s",
    "sqshrn": r"\.4h, v\d+\.4s",  # the 16-bit output step of the narrow cases
}


def _cases(level: str) -> list[Case]:
    """The cases a level runs: the sdot ones where the level has +dotprod."""
    dots = kernels.target_has(targets.resolve(level), "has_dotprod")
    return [c for c in CASES if dots or not c.lane_dots]


def test_depthwise_on_device(run_funcs, level, tmp_path, report):
    """Every case, bit-exact, with the widening multiply-accumulates and the qmuls
    sequence in NEON vector form in the compiled module (and sdot where the level has it)."""
    funcs, datasets, expected = {}, [], []
    cases = _cases(level)
    for i, case in enumerate(cases):
        args, exp = _case_data(case, CASES.index(case))
        funcs[case.name] = _func(case.shape, in_zp=case.in_zp, out_zp=case.out_zp,
                                 act_range=case.act_range, int16_pairs=case.int16_pairs,
                                 padded_copy=case.padded_copy,
                                 parallel_axis=case.parallel_axis, lane_dots=case.lane_dots,
                                 **_shift_bounds(case, args[4][:case.shape.out_c]))
        datasets.append((case.name, args, exp.shape, np.int8))
        expected.append(exp)
    asm, outs = run_funcs(level, funcs, datasets, tmp_path / "depthwise.so")
    for ins, operands in _VECTOR_ASM.items():
        assert re.search(rf"\b{ins}2?\s+v\d+{operands}", asm), f"no vector {ins} at {level}"
    if len(cases) > len(CASES) - sum(c.lane_dots for c in CASES):
        assert re.search(r"\bsdot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b\n", asm), \
            f"no vector-form sdot at {level}"
    for case, got, exp in zip(cases, outs, expected):
        assert len(np.unique(exp)) > 8, "the case must exercise the output range"
        np.testing.assert_array_equal(got, exp, err_msg=f"{case.name} at {level}")
    report(f"depthwise {level:8s} {len(cases)} cases bit-exact")


def test_parallel_axis_rule():
    """The in-place form runs channel blocks in parallel where they split more evenly
    than the rows at 2 and 4 threads (MobileNetV2's 28x28 and smaller maps), rows where
    the border rows are a small share (its 112x112 and 56x56 maps); the cases above use
    both axes on shapes whose default is each; the forced axis is what gets built."""
    def axis(h, c, stride=1, **kw):
        shape = S(1, h, h, c, strides=(stride, stride), padding=_same(h, h, 3, stride), **kw)
        return dw.default_parallel_axis(shape, dw.default_channel_block(shape))

    assert [axis(112, 32), axis(112, 96, 2), axis(56, 144)] == ["rows"] * 3
    assert [axis(28, 192), axis(14, 576, 2), axis(7, 960), axis(14, 128)] == ["channels"] * 4
    assert axis(14, 136) == "rows"  # 8.5 blocks: the remainder is not in a whole block
    assert axis(14, 384, multiplier=2) == "rows"  # the staged form's rows
    by_case = {c.name: c for c in CASES}
    for name, want in (("c64_3x3_same_channels", "channels"), ("c64_3x3_same_rows", "rows")):
        shape = by_case[name].shape
        assert (by_case[name].parallel_axis or
                dw.default_parallel_axis(shape, dw.default_channel_block(shape))) == want
    assert dw.default_parallel_axis(by_case["c64_3x3_same_rows"].shape, 16) == "channels"
    assert "for oc_0 in T.parallel" in _func(by_case["c64_3x3_same_channels"].shape,
                                             in_zp=0, out_zp=0).script()
    with pytest.raises(ValueError, match="136 channels"):
        _func(S(1, 6, 6, 136, padding=(1, 1, 1, 1)), in_zp=0, out_zp=0,
              parallel_axis="channels")
    with pytest.raises(ValueError, match="parallel_axis"):
        _func(S(1, 6, 6, 16), in_zp=0, out_zp=0, parallel_axis="pixels")


def test_inner_loop_is_vectorized():
    """The 3x3, 16-channel kernel's loops over output pixels, one 16-channel block per
    iteration: in the interior rows 9 taps in 5 pairs, i.e. 5 smull + 5 smull2 with
    4 smlal + 4 smlal2 adding the partners in int16, widened into int32 by saddw/saddw2,
    then 4 sqrdmulh (one per int32x4) and one 16-byte store. The top and bottom border
    rows read 6 taps (3 pairs; the padded row's products are constants). No loop of them
    has a scalar byte load or store. The per-channel left shift (ushl) is there by default
    and gone for max_shift=0; for max_shift=-1 the rounding fixup's ``and`` goes too."""
    import tvm

    def hot_loops(**kw):
        """The function's innermost loops that multiply: in every form, the same three
        (top and bottom border rows, interior rows), so that the counts below are taken
        over them and cannot pass on an empty list."""
        f = _func(S(1, 12, 12, 16, padding=(1, 1, 1, 1)), in_zp=3, out_zp=-1, **kw)
        asm = tvm.compile(tvm.IRModule({"dw": f.with_attr("global_symbol", "dw")}),
                          target=targets.resolve("dotprod")).mod.inspect_source("asm")
        loops = [body for body in _innermost_loops(function_asm(asm, "dw"))
                 if _count(body, "smull") > 0]
        macs = sorted((_count(b, "smull"), _count(b, "smull2"), _count(b, "smlal"),
                       _count(b, "smlal2")) for b in loops)
        assert macs == [(3, 3, 3, 3), (3, 3, 3, 3), (5, 5, 4, 4)], (kw, macs)
        return loops

    hot = hot_loops()
    assert all(_count(b, "ushl") == 4 for b in hot)
    assert all(_count(b, "and") == 4 for b in hot)
    no_left = hot_loops(max_shift=0)
    assert all(_count(b, "ushl") == 0 and _count(b, "and") == 4 for b in no_left)
    right = hot_loops(max_shift=-1)
    assert all(_count(b, "ushl") == 0 and _count(b, "and") == 0 for b in right)

    for body in hot:
        assert _count(body, "sqrdmulh") == 4 and _count(body, "saddw") >= 4
        assert _count(body, "ldrb") == 0 and _count(body, "strb") == 0
        assert re.search(r"^\s+(str|stur)\s+q\d+", body, re.M), "one 16-byte store per pixel"


def _count(body: str, ins: str) -> int:
    """How many times instruction ``ins`` occurs in an asm fragment, by mnemonic
    (``smull`` does not count ``smull2``)."""
    return len(re.findall(rf"^\s+{ins}\s", body, re.M))


def _innermost_loops(asm: str) -> list[str]:
    """Bodies of backward branches' loops: from a label to the branch that jumps back to it."""
    lines = asm.splitlines()
    labels = {ln[:-1]: i for i, ln in enumerate(lines) if re.match(r"^\.LBB\w+:$", ln)}
    bodies = []
    for i, ln in enumerate(lines):
        m = re.match(r"^\s+b(?:\.\w+)?\s+(\.LBB\w+)$", ln) or \
            re.match(r"^\s+(?:cbn?z|tbn?z)\s+.*,\s*(\.LBB\w+)$", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            body = "\n".join(lines[labels[m.group(1)]:i + 1])
            if not any(re.match(r"^\.LBB\w+:$", x) for x in lines[labels[m.group(1)] + 1:i]):
                bodies.append(body)
    return bodies


# --------------------------------------------------------------------- TFLite itself
TFLITE_MODELS = ("depthwise_3x3", "depthwise_3x3_s2")


def _tflite_layer(path):
    """Everything the kernel needs, read from the .tflite file (``frontend.layers.read_layer``)."""
    layer = read_layer(path)
    assert layer.op == "DEPTHWISE_CONV_2D"
    _, h, w, c = layer.input_shape
    _, kh, kw, out_c = layer.weight.shape
    shape = S(1, h, w, c, multiplier=out_c // c, kh=kh, kw=kw, strides=layer.strides,
              dilation=layer.dilation, padding=layer.padding)
    mult, shift = requant.quantize_multipliers(layer.real_scales())
    return dict(shape=shape, weight=layer.weight, bias=layer.bias, mult=mult, shift=shift,
                in_zp=layer.in_zp, out_zp=layer.out_zp, act_range=layer.act_range)


def test_depthwise_matches_tflite(run_funcs, level, zoo_model, tmp_path, report):
    """The zoo's DEPTHWISE_CONV_2D models (3x3 SAME + ReLU; 3x3 SAME stride 2 + ReLU6)
    through this kernel on the device equal TFLite's reference kernels, bit for bit."""
    from tvm_armq.frontend.model import TFLiteModel

    funcs, datasets, expected = {}, [], []
    for name in TFLITE_MODELS:
        path = zoo_model(name)
        layer = _tflite_layer(path)
        s = layer["shape"]
        model = TFLiteModel.load(path)
        inputs = [model.random_inputs(seed=seed)[0] for seed in range(2)]
        refs = [model.reference_outputs([x])[0] for x in inputs]
        # Both requantization forms: for any shift, and for the layer's largest one (what
        # the compiler builds; these layers' shifts are all <= -1); and where the level
        # has +dotprod, what the compiler builds there: taps in fours through sdot.
        top = int(layer["shift"].max())
        assert top <= -1
        dots = kernels.target_has(targets.resolve(level), "has_dotprod")
        for bound, lane_dots in ((None, False), (top, False), (top, True))[:3 if dots else 2]:
            sym = (f"{name}_{'any' if bound is None else 'bounded'}_shift"
                   f"{'_dots' if lane_dots else ''}")
            funcs[sym] = _func(s, in_zp=layer["in_zp"], out_zp=layer["out_zp"],
                               act_range=layer["act_range"], max_shift=bound,
                               lane_dots=lane_dots)
            params = dw.pack_params(layer["weight"], layer["bias"], layer["mult"],
                                    layer["shift"], s, in_zp=layer["in_zp"], max_shift=bound)
            for seed, (x, y) in enumerate(zip(inputs, refs)):
                datasets.append((sym, [x] + params, y.shape, np.int8))
                expected.append((f"{sym} seed {seed}", y))
    _, outs = run_funcs(level, funcs, datasets, tmp_path / "depthwise.so")
    for (what, y), got in zip(expected, outs):
        assert_alive(y, what)  # the zoo layer's output really varies
        np.testing.assert_array_equal(got, y, err_msg=f"{what} at {level}")
    report(f"depthwise vs TFLite {level:8s} {', '.join(TFLITE_MODELS)} bit-exact")
