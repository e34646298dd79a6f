"""The opt-in bf16 conv2d / dense (``schedules/conv2d_bf16.py``), bit-exact on the i8mm device.

bf16 results are not integers, so "exact" means: equal, bit for bit, to a NumPy model of
exactly what the hardware does (``schedules.reference.conv2d_bf16_nhwc``): both operands
rounded to bf16 (nearest even), BFMMLA's round-to-odd pair sums with denormals flushed,
then the fp32 bias add and clamp. The model itself is checked against the exact
(Fraction) model of BFMMLA in test_intrinsics.py and against ml_dtypes' rounding. The
cases sweep the geometry (K below, at and above the block; M and N remainders; 1x1, 3x3,
strides, dilation, groups, dense); i8mm is the only level with bf16, and compiling the
bfmmla kernel for the others is a clear error.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from tvm_armq import export, targets
from tvm_armq.intrinsics import kernels
from tvm_armq.schedules import conv2d_bf16 as cb
from tvm_armq.schedules import gemm_plan
from tvm_armq.schedules.gemm_layout import Conv2DShape
from tvm_armq.schedules.gemm_plan import GemmKnobs
from tvm_armq.schedules import reference as ref

pytestmark = pytest.mark.device

LEVEL = "i8mm"  # the only ISA level whose target has +bf16
S = Conv2DShape


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: Conv2DShape
    act_range: tuple | None = None


CASES = [
    Case("k_below_block", S(1, 5, 5, 1, 4, 1, 1)),  # K = 1 < kr, pointwise
    Case("k_at_block", S(1, 4, 4, 4, 6, 1, 1), act_range=(0.0, None)),  # K = kr, ReLU
    Case("k_above_block_relu6", S(1, 6, 6, 5, 8, 1, 1), act_range=(0.0, 6.0)),  # K = 5
    Case("m_n_remainders", S(1, 5, 3, 8, 11, 1, 1)),  # M = 15, N = 11: odd for mr = nr = 2
    Case("1x1_stride2", S(1, 7, 7, 5, 6, 1, 1, strides=(2, 2))),  # 1x1 with an im2col gather
    Case("3x3_same_clamp", S(1, 8, 8, 3, 16, 3, 3, padding=(1, 1, 1, 1)),
         act_range=(-1.5, 1.5)),
    Case("3x3_stride2_batch2", S(2, 9, 9, 6, 7, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1))),
    Case("3x3_dilation2", S(1, 9, 10, 4, 5, 3, 3, dilation=(2, 2), padding=(2, 2, 2, 2))),
    Case("groups2_3x3", S(1, 6, 6, 8, 10, 3, 3, padding=(1, 1, 1, 1), groups=2)),
    Case("groups4_1x1", S(1, 5, 4, 12, 8, 1, 1, groups=4)),
    Case("dense_rows3", S.dense(3, 70, 13)),
    Case("deep_k_3x3", S(1, 5, 5, 64, 6, 3, 3, padding=(1, 1, 1, 1))),  # K = 576
]
# The scalar reference kernel (fp32 multiply-add in K order) on a few of the same cases.
REFERENCE_CASES = ("k_above_block_relu6", "3x3_stride2_batch2", "groups2_3x3")
KNOBS = GemmKnobs(m_tiles=2, n_tiles=2, k_unroll=2)
CONVERT = "convert_fp32_bf16"  # a PrimFunc of the activation rounding alone


def _tile(kernel):
    return (kernel.mr, kernel.nr, kernel.kr)


def _special_values(rng, n: int) -> np.ndarray:
    """fp32 values on the edges of the rounding: exact ties with an even and an odd bf16
    below them, one fp32 ulp off a tie, fp32 denormals, signed zeros."""
    base = rng.standard_normal(n).astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    kind = rng.integers(0, 5, n)
    low = np.select([kind == 0, kind == 1, kind == 2],
                    [np.uint32(0x8000), np.uint32(0x7FFF), np.uint32(0x8001)],
                    np.uint32(0)).astype(np.uint32)
    x = (base | low).view(np.float32)
    x[kind == 3] = (rng.standard_normal((kind == 3).sum()) * 2.0 ** -130).astype(np.float32)
    x[kind == 4] = np.where(rng.random((kind == 4).sum()) < 0.5, -0.0, 0.0)
    return x


def _case_data(case: Case, seed: int, kernel):
    """Arguments (fp32 input, packed bf16 weights, fp32 bias) and the fp32 inputs."""
    s, rng = case.shape, np.random.default_rng(seed)
    data = rng.standard_normal((s.batch, s.in_h, s.in_w, s.in_c)).astype(np.float32)
    flat = data.reshape(-1)
    picks = rng.choice(flat.size, flat.size // 4, replace=False)
    flat[picks] = _special_values(rng, picks.size)
    weight = (rng.standard_normal((s.kh, s.kw, s.group_in_c, s.out_c)) * 0.3).astype(np.float32)
    bias = rng.standard_normal(s.out_c).astype(np.float32)
    args = [data, cb.pack_weights_bf16(weight, _tile(kernel), s.groups), bias]
    return args, (data, weight, bias)


def _expected(case: Case, inputs, matmul=ref.bfmmla_matmul):
    data, weight, bias = inputs
    s = case.shape
    return ref.conv2d_bf16_nhwc(data, weight, bias, strides=s.strides, dilation=s.dilation,
                                padding=s.padding, groups=s.groups, act_range=case.act_range,
                                matmul=matmul)


def fp32_sequential_matmul(a, b) -> np.ndarray:
    """C = A · B^T on bf16 operands the way the scalar reference kernel adds: fp32, k in
    ascending order. Products of two bf16 are exact in fp32 (the test data keep them
    normal), so a fused multiply-add rounds the same."""
    fa, fb = np.asarray(a, np.float32), np.asarray(b, np.float32)
    acc = np.zeros((fa.shape[0], fb.shape[0]), np.float32)
    for k in range(fa.shape[1]):
        acc = acc + fa[:, None, k] * fb[None, :, k]
    return acc


def _conversion_func():
    from tvm import te

    x = te.placeholder((_CONVERSION_BITS.size,), "float32", "x")
    y = te.compute(x.shape, lambda i: cb.fp32_to_bf16_expr(x[i]), name="y")
    return te.create_prim_func([x, y]).with_attr("global_symbol", CONVERT)


# fp32 bit patterns for the rounding alone: specials (zeros, denormals, the largest
# finite values that do and do not round to infinity, infinities, signalling and quiet
# NaNs of both signs) and every low half around ties, on random high halves.
_CONVERSION_BITS = np.concatenate([
    np.array([0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00008000, 0x00018000,
              0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
              0x7F800001, 0x7FC00000, 0xFF800001, 0x7FBFFFFF, 0x7F80FFFF], np.uint32),
    (np.random.default_rng(7).integers(0, 2 ** 32, 512, dtype=np.uint64).astype(np.uint32)
     & np.uint32(0xFFFF0000)) | np.resize(np.array([0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF],
                                                   np.uint32), 512),
]).astype(np.uint32)


# ----------------------------------------------------------------------- host checks
def test_rounding_matches_ml_dtypes():
    """``fp32_to_bf16_bits`` is round-to-nearest-even (ml_dtypes agrees on every non-NaN
    pattern); NaNs stay NaNs, quietened, sign and top payload kept."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    bits = np.concatenate([_CONVERSION_BITS,
                           rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)])
    x = bits.view(np.float32)
    got = cb.fp32_to_bf16_bits(x)
    nan = np.isnan(x)
    want = x[~nan].astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(got[~nan], want)
    assert nan.sum() > 10
    assert (got[nan] == ((bits[nan] >> 16) | 0x0040)).all()
    assert cb.fp32_to_bf16_bits(np.float32([1 + 2 ** -8]))[0] == 0x3F80  # tie -> even (down)
    assert cb.fp32_to_bf16_bits(np.float32([1 + 3 * 2 ** -8]))[0] == 0x3F82  # tie -> even (up)


def test_bfmmla_model_matches_the_exact_model():
    """The vectorized model (``reference.bfmmla_matmul``) equals the Fraction-exact BFMMLA
    model of test_intrinsics.py, with exponents spread far enough for inexact pair sums,
    flushed products and a cancelling accumulator."""
    import ml_dtypes
    from test_intrinsics import bfmmla_model

    kernel = kernels.get(kernels.GEMM_BF16BF16F32_2X2X4_BF16)
    rng = np.random.default_rng(1)
    for spread in (0, 12, 40, 64):
        for _ in range(3):
            m, n, k = rng.integers(1, 4, 2).tolist() + [int(rng.integers(1, 23))]

            def operand(rows):
                x = rng.standard_normal((rows, k)) * 2.0 ** rng.integers(-spread, spread + 1,
                                                                         (rows, k))
                return x.astype(np.float32).astype(ml_dtypes.bfloat16)

            a, b = operand(m), operand(n)
            np.testing.assert_array_equal(ref.bfmmla_matmul(a, b), bfmmla_model(kernel, a, b),
                                          err_msg=f"spread 2**{spread}, K={k}")


def test_errors_name_the_op():
    int8 = kernels.get(kernels.GEMM_S8S8S32_2X2X8_I8MM)
    bf16 = kernels.get(kernels.GEMM_BF16BF16F32_2X2X4_BF16)
    func = cb.conv2d_bf16_func(gemm_plan.plan(S(1, 4, 4, 4, 4, 1, 1), bf16))
    with pytest.raises(ValueError, match="conv2d_bf16.*gemm_s8s8s32_2x2x8_i8mm"):
        cb.schedule_conv2d_bf16(func, gemm_plan.plan(S(1, 4, 4, 4, 4, 1, 1), int8),
                                targets.resolve(LEVEL))
    with pytest.raises(TypeError, match="conv2d_bf16.*float32"):
        cb.pack_weights_bf16(np.zeros((1, 1, 4, 4), np.float64), _tile(bf16))


@pytest.mark.parametrize("level", ["neon", "dotprod"])
def test_bfmmla_needs_bf16(level):
    """Below i8mm the targets have no +bf16: scheduling with bfmmla is a
    MissingTargetFeature naming the kernel and the target, before LLVM sees anything."""
    kernel = kernels.get(kernels.GEMM_BF16BF16F32_2X2X4_BF16)
    target = targets.resolve(level)
    plan = gemm_plan.plan(S(1, 4, 4, 8, 4, 3, 3), kernel, knobs=KNOBS)
    func = cb.conv2d_bf16_func(plan)
    with pytest.raises(kernels.MissingTargetFeature) as err:
        cb.schedule_conv2d_bf16(func, plan, target)
    msg = str(err.value)
    assert kernel.name in msg and str(targets.resolve(target)) in msg and "+bf16" in msg
    assert kernels.select(target, "bfloat16", "bfloat16").intrin is None  # the fallback


# ------------------------------------------------------------------------- the device
def test_conv2d_bf16_on_device(devices, tmp_path, report):
    """Every case through bfmmla (and some through the scalar reference kernel), plus the
    activation rounding alone on special bit patterns, bit-exact on the i8mm device."""
    import tvm

    target = targets.resolve(LEVEL)
    kernel = kernels.select(target, "bfloat16", "bfloat16")
    assert kernel.name == kernels.GEMM_BF16BF16F32_2X2X4_BF16
    scalar = kernels.get(kernels.GEMM_BF16BF16F32_1X1X1_REF)
    runs, funcs = [], {CONVERT: _conversion_func()}
    for i, case in enumerate(CASES):
        for k, suffix in ((kernel, ""), (scalar, "__ref")):
            if k is scalar and case.name not in REFERENCE_CASES:
                continue
            plan = gemm_plan.plan(case.shape, k, knobs=KNOBS)
            f = cb.conv2d_bf16_func(plan, act_range=case.act_range)
            name = case.name + suffix
            funcs[name] = cb.schedule_conv2d_bf16(f, plan, target).with_attr(
                "global_symbol", name)
            args, inputs = _case_data(case, i, k)
            matmul = ref.bfmmla_matmul if k is kernel else fp32_sequential_matmul
            runs.append((name, case, args, _expected(case, inputs, matmul)))
    ex = tvm.compile(tvm.IRModule(funcs), target=target)
    asm = ex.mod.inspect_source("asm")
    assert re.search(r"\tbfmmla\tv\d+\.4s, v\d+\.8h, v\d+\.8h\n", asm), "no bfmmla in the code"
    lib = export.export_aarch64(ex, tmp_path / "conv_bf16.so")
    sess = devices.session(LEVEL)
    sess.upload(str(lib))
    rlib = sess.load_module(lib.name)
    dev = sess.cpu(0)

    x = _CONVERSION_BITS.view(np.float32)
    y = tvm.runtime.tensor(np.zeros(x.shape, cb.to_bf16(np.zeros(1, np.float32)).dtype), dev)
    rlib[CONVERT](tvm.runtime.tensor(x, dev), y)
    np.testing.assert_array_equal(y.numpy().view(np.uint16), cb.fp32_to_bf16_bits(x))

    for name, case, args, expected in runs:
        s = case.shape
        out = tvm.runtime.tensor(np.zeros((s.gemm_m, s.groups, s.gemm_n), np.float32), dev)
        rlib[name](*[tvm.runtime.tensor(a, dev) for a in args], out)
        np.testing.assert_array_equal(out.numpy().reshape(expected.shape), expected,
                                      err_msg=f"{name} at {LEVEL}")
    # The model must tell BFMMLA's rounding from plain fp32 sums, or the test proves little.
    deep = next(r for r in runs if r[0] == "deep_k_3x3")
    case, inputs = deep[1], _case_data(deep[1], CASES.index(deep[1]), kernel)[1]
    assert (_expected(case, inputs, fp32_sequential_matmul) != deep[3]).any()
    report(f"conv2d_bf16 {kernel.name:28s} {LEVEL:8s} {len(CASES)} cases (+"
           f"{len(REFERENCE_CASES)} scalar) bit-exact vs the bfmmla model")
