"""uint8 conv2d / dense with asymmetric weights (legacy uint8 TFLite), bit-exact at every level.

Each case is two PrimFuncs of one module per level: the row sums (``conv2d_u8``) and the
uint8 GEMM whose epilogue subtracts zp_w * row_sum (``conv2d_gemm_func(plan, w_zp=...)``),
on the level's best u8 x u8 kernel (umull + uadalp, udot, ummla). The result is compared
exactly with TFLite's uint8 arithmetic in NumPy (``reference.conv2d_nhwc`` with
``w_zp``, then the per-tensor requantization), and the row sums with im2col row sums.
Zero points span 0..255 for input and weights (0 included: no row sums at all), with
padding, strides, dilation, groups, M/N/K remainders and dense.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tvm_armq import targets
from tvm_armq.intrinsics import kernels, requant
from tvm_armq.schedules import gemm_compute, gemm_plan, gemm_schedule
from tvm_armq.schedules.gemm_layout import Conv2DShape, fold_bias, pack_weights
from tvm_armq.schedules.gemm_plan import GemmKnobs
from tvm_armq.schedules import conv2d_u8 as cu
from tvm_armq.schedules import reference as ref

pytestmark = pytest.mark.device

U8 = "uint8"
S = Conv2DShape


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: Conv2DShape
    in_zp: int
    w_zp: int
    out_zp: int
    act_range: tuple[int, int] = (0, 255)


CASES = [
    Case("3x3_same", S(1, 8, 8, 3, 16, 3, 3, padding=(1, 1, 1, 1)), in_zp=0, w_zp=255,
         out_zp=128),
    Case("3x3_stride2_batch2", S(2, 9, 9, 6, 7, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1)),
         in_zp=255, w_zp=1, out_zp=200),  # (a - zp_a) <= 0: acc < 0
    Case("pointwise_relu6", S(1, 4, 4, 20, 8, 1, 1), in_zp=128, w_zp=128, out_zp=3,
         act_range=(3, 200)),
    Case("k_below_block", S(1, 5, 5, 1, 4, 1, 1), in_zp=7, w_zp=200, out_zp=90),
    Case("m_n_remainders", S(1, 5, 3, 8, 11, 1, 1), in_zp=90, w_zp=33, out_zp=20),
    Case("3x3_dilation2", S(1, 9, 10, 4, 5, 3, 3, dilation=(2, 2), padding=(2, 2, 2, 2)),
         in_zp=250, w_zp=3, out_zp=160),
    Case("1x7_strided_w", S(1, 4, 15, 3, 6, 1, 7, strides=(1, 2), padding=(0, 3, 0, 3)),
         in_zp=255, w_zp=255, out_zp=10),
    Case("groups2_3x3", S(1, 6, 6, 8, 10, 3, 3, padding=(1, 1, 1, 1), groups=2), in_zp=33,
         w_zp=97, out_zp=120),
    Case("dense_rows3", S.dense(3, 70, 13), in_zp=200, w_zp=140, out_zp=77),
    # one row: the one-row kernel of the level (kernels.select with rows = 1)
    Case("dense_one_row", S.dense(1, 70, 13), in_zp=10, w_zp=128, out_zp=140),
    Case("dense_one_row_k96", S.dense(1, 96, 24), in_zp=255, w_zp=60, out_zp=200),
    Case("symmetric_weights", S(1, 6, 6, 5, 8, 3, 3, padding=(1, 1, 1, 1)), in_zp=17,
         w_zp=0, out_zp=128),  # zp_w = 0: the GEMM alone, no row sums
]
KNOBS = GemmKnobs(m_tiles=2, n_tiles=2, k_unroll=2)


def _tile(kernel):
    return (kernel.mr, kernel.nr, kernel.kr)


def _row_sums(case: Case, data) -> np.ndarray:
    """[M, groups] row sums of the im2col A (padding = zp_a), straight from the definition."""
    s = case.shape
    cols = ref.im2col_nhwc(data.astype(np.int64), s.kh, s.kw, strides=s.strides,
                           dilation=s.dilation, padding=s.padding, pad_value=case.in_zp)
    cols = cols.reshape(s.gemm_m, s.kh * s.kw, s.groups, s.group_in_c)
    return cols.sum(axis=(1, 3)).astype(np.int32)


def _case_data(case: Case, seed: int, kernel):
    s, rng = case.shape, np.random.default_rng(seed)
    data = rng.integers(0, 255, (s.batch, s.in_h, s.in_w, s.in_c), endpoint=True, dtype=np.uint8)
    weight = rng.integers(0, 255, (s.kh, s.kw, s.group_in_c, s.out_c), endpoint=True,
                          dtype=np.uint8)
    bias = rng.integers(-20000, 20000, s.out_c).astype(np.int32)
    acc = ref.conv2d_nhwc(data, weight, bias, in_zp=case.in_zp, w_zp=case.w_zp,
                          strides=s.strides, dilation=s.dilation, padding=s.padding,
                          groups=s.groups)
    # One scale for the whole tensor (uint8 models quantize per tensor), chosen so the
    # outputs spread over the uint8 range rather than saturate.
    scale = rng.uniform(60, 120) / max(np.abs(acc).max(), 1)
    mult, shift = requant.quantize_multipliers(np.full(s.out_c, scale))
    lo, hi = case.act_range
    expected = ref.requantize(acc, mult, shift, case.out_zp, lo, hi, U8)
    args = [data, pack_weights(weight, _tile(kernel), s.groups),
            fold_bias(weight, bias, case.in_zp, w_zp=case.w_zp),
            mult.astype(np.int32), shift.astype(np.int32)]
    return args, expected


def test_fold_bias_with_weight_zero_point():
    """bias - zp_a * sum_k (w - zp_w) is what is left of TFLite's sum once the GEMM and the
    row sums are taken away: check the identity on one layer, exactly."""
    rng = np.random.default_rng(0)
    w = rng.integers(0, 256, (3, 3, 4, 5), dtype=np.uint8)
    a = rng.integers(0, 256, (7, 36), dtype=np.uint8).astype(np.int64)
    bias, za, zw = rng.integers(-999, 999, 5), 140, 77
    wk = w.reshape(36, 5).astype(np.int64)
    tflite = (a - za) @ (wk - zw) + bias
    ours = a @ wk - zw * a.sum(axis=1, keepdims=True) + fold_bias(w, bias, za, w_zp=zw)
    np.testing.assert_array_equal(ours, tflite)
    np.testing.assert_array_equal(fold_bias(w, bias, za), fold_bias(w, bias, za, w_zp=0))


def test_conv2d_u8_on_device(run_funcs, level, tmp_path, report):
    """Every case, bit-exact, row sums and output, on the level's best u8 x u8 kernel for
    its rows and depth (one-row cases: the one-row kernel), whose instruction the compiled
    module must contain. The GEMM is given the exact row sums, so each of the two kernels
    is checked on its own."""
    target = targets.resolve(level)
    funcs, calls, expected, used = {}, [], [], set()
    for i, c in enumerate(CASES):
        kernel = kernels.select(target, U8, U8, rows=c.shape.gemm_m, depth=c.shape.gemm_k)
        assert kernel.intrin is not None, f"no u8 x u8 instruction selected at {level}"
        assert kernel.one_row == (c.shape.gemm_m == 1), (c.name, kernel.name)
        used.add(kernel)
        plan = gemm_plan.plan(c.shape, kernel, knobs=KNOBS, direct=False)
        f = gemm_compute.conv2d_gemm_func(plan, in_dtype=U8, out_dtype=U8, in_zp=c.in_zp,
                                          out_zp=c.out_zp, act_range=c.act_range, w_zp=c.w_zp)
        assert len(f.params) == (7 if c.w_zp else 6) + (plan.tail is not None)
        funcs[c.name] = gemm_schedule.schedule_conv2d_gemm(f, plan, target)
        args, out = _case_data(c, i, kernel)
        s = c.shape
        if c.w_zp:
            funcs["rs_" + c.name] = cu.schedule_row_sums(cu.row_sums_func(c.shape,
                                                                          in_zp=c.in_zp))
            row_sums = _row_sums(c, args[0])
            calls.append(("rs_" + c.name, args[:1], row_sums.shape, np.int32))
            expected.append((f"row sums of {c.name}", row_sums))
            args = args + [row_sums]
        calls.append((c.name, args, (s.gemm_m, s.groups, s.gemm_n), np.uint8))
        expected.append((c.name, out))
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "conv_u8.so")
    # one-row and multi-row kernels (at neon also the 8-byte one: K = 20, 8, 40 ...)
    assert sorted({k.one_row for k in used}) == [False, True], used
    for kernel in used:
        assert all(ins in asm for ins in kernel.instructions), kernel.instructions
    for (what, want), got in zip(expected, outs):
        assert len(np.unique(want)) > min(8, want.size - 1), f"{what}: a degenerate reference"
        np.testing.assert_array_equal(got.reshape(want.shape), want,
                                      err_msg=f"{what} at {level}")
    names = " + ".join(sorted(k.name for k in used))
    report(f"conv2d_u8 {names} {level:8s} {len(CASES)} cases bit-exact")
