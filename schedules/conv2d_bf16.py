"""fp32 NHWC conv2d / dense computed in bf16 on ``bfmmla``, fp32 accumulation (opt-in precision).

Read ``conv2d_gemm.py`` first: this is the same packed GEMM (same A_packed / B_packed
layouts, same schedule), with float operands instead of int8 ones.

    A[M, K]  im2col of the fp32 input, rounded to bf16 per inference; padded pixels are 0
    B[K, N]  the fp32 weights, rounded to bf16 once, at compile time (``pack_weights_bf16``)

    out[m, n] = clamp(gemm[m, n] + bias[n], lo, hi)      fp32, bias fp32 per output channel

Rounding, all of it deterministic and modelled bit for bit by ``schedules.reference``:

* fp32 -> bf16 (weights in NumPy, activations in the compiled code, the same rule):
  round to nearest, ties to even, on the bit pattern: ``(bits + 0x7FFF + lsb) >> 16``
  with lsb the lowest kept bit. It is what Arm's BFCVT does in Linux's default FPCR
  (RMode = nearest-even, FZ = 0, DN = 0): fp32 denormals round to bf16 denormals, overflow
  rounds to infinity, and a NaN stays a NaN (quietened: top 16 bits | 0x0040, sign and
  payload top kept). It is computed with integer instructions on the fp32 bits because
  TVM 0.27's code generator has no bfloat type (and its own bf16 cast forgets NaNs).
* the GEMM: BFMMLA with FPCR.EBF = 0, each output element
  ``acc = R(acc + R(R(a0*b0) + R(a1*b1)))`` for consecutive pairs of k in ascending order,
  from acc = 0, R = round to fp32 with round-to-odd, denormal inputs and results flushed to
  zero (``intrinsics/mmla.py``). K is zero-padded to the block: pairs of zeros add nothing.
* the epilogue: ordinary IEEE fp32 (round to nearest even), bias add then clamp.

A dense layer is ``Conv2DShape.dense(rows, k, n)``. Groups work as in the int8 path.
"""

from __future__ import annotations

import numpy as np

from .gemm_compute import im2col_packed_te, packed_gemm_te
from .gemm_layout import pack_weights
from .gemm_plan import GemmPlan
from .gemm_schedule import schedule_conv2d_gemm
from .tir_util import largest_divisor

OP = "conv2d_bf16"
ACC_DTYPE = "float32"
BF16 = "bfloat16"
ROUNDING_STAGE = "data_bf16"
NEON_FP32_LANES = 4  # fp32 lanes of one 128-bit NEON register
# IEEE binary32 -> bfloat16 (its top 16 bits), as unsigned integers on the bit pattern.
_HALF_BITS = 16
_ROUND_BIAS = 0x7FFF  # one less than half a bf16 ulp in fp32 bits; + lsb breaks ties to even
_ABS_MASK = 0x7FFFFFFF
_INF_BITS = 0x7F800000
_BF16_QUIET = 0x0040  # the bf16 quiet-NaN bit (top mantissa bit)


# ------------------------------------------------------------------ NumPy side
def fp32_to_bf16_bits(x) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), round to nearest even, NaNs quietened: the
    conversion the compiled code does on activations (see the module docstring)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> _HALF_BITS) & 1
    rounded = (bits + _ROUND_BIAS + lsb) >> _HALF_BITS
    nan = (bits & _ABS_MASK) > _INF_BITS
    quiet = (bits >> _HALF_BITS) | _BF16_QUIET
    return np.where(nan, quiet, rounded).astype(np.uint16)


def to_bf16(x) -> np.ndarray:
    """``fp32_to_bf16_bits`` as an ``ml_dtypes.bfloat16`` array (what TVM takes for a
    bfloat16 tensor)."""
    import ml_dtypes

    return fp32_to_bf16_bits(x).view(ml_dtypes.bfloat16)


def pack_weights_bf16(weight_hwio: np.ndarray, mr_nr_kr, groups: int = 1) -> np.ndarray:
    """fp32 HWIO weights -> bf16 B_packed[groups, N/nr, K/kr, nr, kr] (``pack_weights``'s
    layout, zero padded), rounded to nearest even. Runs once, at compile time."""
    w = np.asarray(weight_hwio)
    if w.dtype != np.float32:
        raise TypeError(f"{OP}: weights must be float32, got {w.dtype}")
    return pack_weights(to_bf16(w), mr_nr_kr, groups)


# ------------------------------------------------------------------------ TIR
def fp32_to_bf16_expr(value):
    """The TIR form of ``fp32_to_bf16_bits``: an fp32 expression -> a bfloat16 one (integer
    instructions on the bits, then a reinterpret, which costs nothing)."""
    from tvm import tirx

    def u32(v):
        return tirx.const(v, "uint32")

    bits = tirx.reinterpret("uint32", value)
    lsb = (bits >> u32(_HALF_BITS)) & u32(1)
    rounded = (bits + u32(_ROUND_BIAS) + lsb) >> u32(_HALF_BITS)
    nan = (bits & u32(_ABS_MASK)) > u32(_INF_BITS)
    quiet = (bits >> u32(_HALF_BITS)) | u32(_BF16_QUIET)
    return tirx.reinterpret(BF16, tirx.Select(nan, quiet, rounded).astype("uint16"))


def conv2d_bf16_te(plan: GemmPlan, *, act_range=None):
    """TE tensors of the bf16 conv2d of ``plan`` (``gemm_plan.plan`` with a bf16 kernel):
    (data, B_packed, bias, output).

    Inputs: data fp32 NHWC, B_packed bf16 (``pack_weights_bf16``), bias fp32 [out_c]
    (zeros for a layer without one). Output: fp32 NHWC viewed as
    [batch * out_h * out_w, groups, out_c / groups], as in ``gemm_compute.conv2d_gemm_te``.
    ``act_range`` = (lo, hi) clamps the output (fused ReLU / ReLU6; either side None:
    unbounded); None: no clamp.
    Stages, by name: ``data_bf16`` (the rounding, once per input element; for a 1x1 kernel
    it is done inside the next stage instead), ``A_packed`` (im2col + pack), ``gemm`` (fp32
    blocks), ``output``.
    """
    from tvm import te, tirx

    mr_nr_kr = plan.main.tile
    _, nr, kr = mr_nr_kr
    s, G = plan.shape, plan.shape.groups
    copy = dict(copy=plan.input_copy, rows_layout=plan.rows_copy)
    nb, kb = -(-s.gemm_n // nr), s.packed_k(kr, BF16) // kr
    data = te.placeholder((s.batch, s.in_h, s.in_w, s.in_c), "float32", "data")
    b_packed = te.placeholder((G, nb, kb, nr, kr), BF16, "B_packed")
    bias = te.placeholder((s.out_c,), ACC_DTYPE, "bias")
    if s.kh * s.kw == 1:  # each input element is read at most once: round it as it is packed
        a_packed = im2col_packed_te(s, mr_nr_kr, data, tirx.const(0.0, "float32"),
                                    convert=fp32_to_bf16_expr, **copy)
    else:  # rounded once per input element, not once per im2col copy (a 3x3 has 9)
        data_bf16 = te.compute(data.shape, lambda *i: fp32_to_bf16_expr(data[i]),
                               name=ROUNDING_STAGE)
        a_packed = im2col_packed_te(s, mr_nr_kr, data_bf16, tirx.const(0, BF16), **copy)
    acc = packed_gemm_te(a_packed, b_packed, ACC_DTYPE)
    mr = mr_nr_kr[0]
    lo, hi = act_range if act_range is not None else (None, None)

    def out_element(m, g, n):
        c = g * s.gemm_n + n
        x = acc[g, m // mr, n // nr, m % mr, n % nr] + bias[c]
        if hi is not None:
            x = tirx.min(x, tirx.const(float(hi), ACC_DTYPE))
        if lo is not None:
            x = tirx.max(x, tirx.const(float(lo), ACC_DTYPE))
        return x

    out = te.compute((s.gemm_m, G, s.gemm_n), out_element, name="output")
    return data, b_packed, bias, out


def conv2d_bf16_func(plan: GemmPlan, *, act_range=None):
    """The bf16 conv2d of ``plan`` as one TIR PrimFunc, unscheduled; signature
    ``(data, B_packed, bias, output)`` as in ``conv2d_bf16_te``."""
    from tvm import te

    return te.create_prim_func(list(conv2d_bf16_te(plan, act_range=act_range)))


def schedule_conv2d_bf16(func, plan: GemmPlan, target=None):
    """Schedule ``conv2d_bf16_func(plan)``: ``schedule_conv2d_gemm``'s loop nest (the
    plan's macro tiles, epilogue where the tile is computed, the block tensorized with its
    kernel), plus the input rounding stage: vectorized, rows in parallel; inlined into the
    packing for a 1x1 kernel, which reads each input element at most once.

    The plan's kernel is a bf16 record of ``tvm_armq.intrinsics.kernels``
    (``kernels.select(target, "bfloat16", "bfloat16")``). Raises ``MissingTargetFeature``
    (naming the kernel and the target) when the target lacks its instruction (bfmmla
    needs +bf16).
    """
    from tvm import s_tir

    from tvm_armq.intrinsics import kernels

    kernel = plan.kernel
    if (kernel.a_dtype, kernel.b_dtype, kernel.acc_dtype) != (BF16, BF16, ACC_DTYPE):
        raise ValueError(f"{OP}: kernel {kernel.name} multiplies {kernel.a_dtype} by "
                         f"{kernel.b_dtype}; the bf16 conv2d needs a bfloat16 x bfloat16 -> "
                         f"float32 kernel")
    b_block = tuple(int(d) for d in func.params[1].shape[-2:])  # B_packed[..., nr, kr]
    if b_block != (kernel.nr, kernel.kr):
        raise ValueError(f"{OP}: the func packs B in {b_block[0]}x{b_block[1]} blocks, "
                         f"kernel {kernel.name} takes {kernel.nr}x{kernel.kr}")
    if kernel.intrin is not None:
        kernels.require(kernel, target)  # before any work: the error names kernel and target

    sch = s_tir.Schedule(func)
    if plan.shape.kh * plan.shape.kw != 1:  # a 1x1 kernel is rounded inside A_packed
        fused = sch.fuse(*sch.get_loops(sch.get_sblock(ROUNDING_STAGE)))
        # One fp32 register of elements per step; its rows of registers in parallel.
        lanes = largest_divisor(sch.get(fused).extent.value, NEON_FP32_LANES)
        outer, inner = sch.split(fused, [None, lanes])
        sch.vectorize(inner)
        if plan.parallel:
            sch.parallel(outer)
    return schedule_conv2d_gemm(sch.mod["main"], plan, target)
