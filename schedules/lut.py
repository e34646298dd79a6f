"""Quantized 8-bit unary ops (LOGISTIC, TANH, EXP, GELU, HARD_SWISH, LEAKY_RELU, RELU,
RELU6, RELU_N1_TO_1, RSQRT, and the float islands a converter leaves between a DEQUANTIZE
and a QUANTIZE) as one table lookup per element.

Read this first. Every one of these TFLite operators maps one 8-bit input value to one
8-bit output value, through arithmetic that depends only on that value and on the
quantization parameters fixed in the model. So the whole op is a table of 256 entries:
evaluate TFLite's own arithmetic once per possible input, at compile time, in NumPy, and
the kernel is ``out[i] = table[x[i] - dtype_min]``. The table *is* the reference: each
``*_table`` function below is TFLite's Prepare and Eval for that op, written out for all
256 inputs at once, and the tests compare it with TFLite's ``BUILTIN_REF`` kernels on
every input value for swept scales and zero points.

What each table computes (``s``/``zp`` = float32 scale / zero point, ``x`` = input value,
``M(v, m, e)`` = TFLite's MultiplyByQuantizedMultiplier, ``round`` = half away from zero):

LOGISTIC, TANH, EXP (``float_table``; TFLite's reference kernels build exactly this
    table in their Prepare, ``PopulateLookupTable``; EXP: int8 only)
    ``clamp(round(f(s_in * (x - zp_in)) * (1 / s_out)) + zp_out)``, every step in float32,
    f = ``1 / (1 + expf(-v))``, ``tanhf(v)`` or ``expf(v)``. The float functions are the C
    library's own ``expf`` / ``tanhf`` (loaded with ctypes): TFLite calls those, so a result that
    lies one float32 ulp from a rounding boundary rounds the same way here.
GELU (``float_table``; TFLite's GELU builds the same table in its Prepare, ``LUTPopulate``)
    As LOGISTIC, with f = ``0.5 v erfcf(v * -sqrt(1/2))`` or, ``approximate``, its tanh
    form ``0.5 v (1 + tanhf(sqrt(2/pi) (v + 0.044715 v^3)))``, each product in float32 in
    TFLite's order (``_gelu``).
NEG island (``island_table``; DEQUANTIZE -> NEG -> QUANTIZE, TFLite's reference kernels
    one after the other: a LayerNorm's converter leaves NEG in float)
    ``d = (float)((double)s_in * (x - zp_in))``, ``y = -d``,
    ``clamp(round(y / s_out) + zp_out)`` with the quotient in float32.
HARD_SWISH (``hard_swish_table``; ``reference_ops::HardSwish``, int16 fixed point)
    Prepare: ``hires = s_in / 128`` (float32); two multipliers, ``hires / s_out`` and
    ``hires / (3 / 32768)``, each split by QuantizeMultiplier and cut to 16 bits (rounded).
    Eval: ``v = (x - zp_in) * 128``; ``p = SRDHM16(v, m_out)``; the "relu-ish" value is
    ``v`` rescaled so that 3.0 is 32768 (saturating), then mapped from [-1, 1] to [0, 1];
    ``out = clamp(RDPOT(SDHM16(reluish, p), -e_out) + zp_out)``.
LEAKY_RELU (``leaky_relu_table``; ``reference_ops::QuantizeLeakyRelu``)
    Prepare (float32 products and quotients, then QuantizeMultiplier):
    identity ``s_in / s_out``, alpha ``s_in * alpha / s_out``.
    Eval: ``d = x - zp_in``; ``clamp(M(d, identity if d >= 0 else alpha) + zp_out)``.
RELU, RELU6, RELU_N1_TO_1 (``relu_table``; TFLite's ``ReluX``)
    Prepare: ``s_in / s_out`` (float32) split by QuantizeMultiplier; the clamp (lo, hi)
    is the activation's range in output units, ``zp_out + roundf(bound / s_out)`` within
    the dtype, which the caller passes as ``act_range``: the same range TFLite computes
    for a fused activation (``frontend.layers.activation_range``).
    Eval: ``clamp(M(x - zp_in, m, e) + zp_out, lo, hi)``.
RSQRT (``rsqrt_table``; int8 only, TFLite's ``RsqrtEvalQuantizedInt8``)
    Prepare: ``1 / (sqrtf(s_in) * s_out)`` (the root and the product in float32, the
    quotient in double) split by QuantizeMultiplier into ``m, e``.
    Eval: ``v = x - zp_in``; ``v = 0`` gives the dtype maximum; otherwise ``1/sqrt(v)``
    as a multiplier and shift (``inv_sqrt_multiplier``: gemmlowp fixed point, five
    Newton steps), applied to ``1 << 20``, then ``M(., m, e - 20) + zp_out``, clamped.
    TFLite refuses to run on an input below its zero point (a negative real value); the
    table gives the dtype maximum there too.

The kernel (``lut_func``): ``out[...] = table[x[...] - dtype_min]``, the table an int8
operand of 256 entries indexed from the dtype's minimum. On aarch64 the 256 bytes live in
16 NEON registers, four groups of four, and 16 elements are looked up at once the way
TFLite's and XNNPACK's optimized kernels do it: ``tbl`` over the first group (64 entries;
an index past 63 gives 0), then ``tbx`` over each next group with the index lowered by 64
more (``tbx`` leaves a lane whose index is out of range as it was). One load, three
subtractions, one ``tbl``, three ``tbx`` and one store per 16 elements, where a gather
is a load, an address and a load per element. The index is the input's raw byte: for
uint8 that is the table's index; for int8 the raw byte ``u`` (``x`` mod 256) stands for
entry ``u + 128`` below 128 and ``u - 128`` above, so rather than adjusting every input
the kernel loads the groups rotated by half the table (group g holds the entries from
``(64 g + 128) % 256`` on). Tensors of 16 elements or more are covered by 16-element
vectors, the last one ending at the last element (it overlaps the one before it: both
write the same bytes); smaller ones by a scalar gather. ``lut_func(schedule=False)`` is the plain gather, the readable definition.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools

import numpy as np

from tvm_armq.intrinsics.requant import (multiply_by_quantized_multiplier,
                                         quantize_multiplier, rounding_divide_by_pot,
                                         saturating_rounding_doubling_high_mul)
from tvm_armq.schedules.reference import round_half_away

DTYPES = ("int8", "uint8")
TABLE_SIZE = 256  # one entry per 8-bit input value

# HARD_SWISH's fixed point (reference_ops::HardSwish)
HARD_SWISH_HIRES_SHIFT = 7     # the input difference is scaled by 2**7 in int16
HARD_SWISH_RELUISH_ONE = 3.0   # the real value that the "relu-ish" scale maps to 2**15
INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
INT32_MAX = (1 << 31) - 1

# RSQRT's fixed point (TFLite's GetInvSqrtQuantizedMultiplierExp and its int8 Eval)
RSQRT_SHIFT = 20               # kShift: 1/sqrt(v) is applied to 1 << 20 to stay integer
INV_SQRT_START_SHIFT = 11      # the output shift before normalization
INV_SQRT_NORMALIZED_BITS = 29  # v is normalized into [2**27, 2**29) by pairs of bits
INV_SQRT_NEWTON_STEPS = 5
Q3_ONE = 1 << 28                       # 1.0 with 3 integer bits
Q3_THREE_HALVES = (1 << 28) + (1 << 27)  # 1.5 with 3 integer bits
Q0_HALF_SQRT2 = 1518500250             # sqrt(2) / 2 in Q0.31

# The TFLite op -> the float function its 8-bit reference kernel tabulates
FLOAT_FUNCTIONS = ("LOGISTIC", "TANH", "EXP", "GELU")
# RELU family: requantize and clamp to the activation's range (passed in as act_range)
RELU_OPS = ("RELU", "RELU6", "RELU_N1_TO_1")


def _inputs(dtype: str) -> np.ndarray:
    if dtype not in DTYPES:
        raise TypeError(f"table lookup: dtype must be one of {DTYPES}, got {dtype!r}")
    info = np.iinfo(dtype)
    return np.arange(int(info.min), int(info.max) + 1, dtype=np.int64)


def _clamp(v, dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(np.asarray(v, np.int64), int(info.min), int(info.max)).astype(dtype)


def _f32(v) -> np.float32:
    return np.float32(v)


# ----------------------------------------------------------------------------- LOGISTIC, TANH
@functools.lru_cache(maxsize=None)
def _libm():
    lib = ctypes.CDLL(ctypes.util.find_library("m"))
    for name in ("expf", "tanhf", "erfcf"):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lib


# GELU's constants as TFLite's reference kernel (``reference_ops::GeluTransform*``) writes
# them: each rounded to float32 once, from the double expression.
GELU_MINUS_SQRT1_2 = np.float32(-np.sqrt(0.5))              # erfc's argument scale
GELU_SQRT_2_OVER_PI = np.float32(2 / np.sqrt(np.pi) * np.sqrt(0.5))  # tanh form's scale
GELU_CUBIC = np.float32(0.044715)


def _gelu(lib, approximate: bool):
    """TFLite's GELU in float32, operation by operation: ``0.5 x erfc(-x / sqrt 2)``, or
    ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` with the cube multiplied left to
    right."""
    half, one = _f32(0.5), _f32(1.0)
    if approximate:
        def f(v):
            cube = _f32(_f32(_f32(GELU_CUBIC * v) * v) * v)
            inner = _f32(GELU_SQRT_2_OVER_PI * _f32(v + cube))
            return _f32(_f32(half * v) * _f32(one + _f32(lib.tanhf(float(inner)))))
        return f
    return lambda v: _f32(_f32(half * v) * _f32(lib.erfcf(float(_f32(v * GELU_MINUS_SQRT1_2)))))


def _float_function(op: str, approximate: bool = False):
    lib = _libm()
    if op == "GELU":
        return _gelu(lib, approximate)
    if op == "LOGISTIC":
        return lambda v: _f32(_f32(1.0) / (_f32(1.0) + _f32(lib.expf(float(-v)))))
    if op == "TANH":
        return lambda v: _f32(lib.tanhf(float(v)))
    if op == "EXP":
        return lambda v: _f32(lib.expf(float(v)))
    raise ValueError(f"no float function for {op}: expected one of {FLOAT_FUNCTIONS}")


def float_table(op: str, in_q, out_q, dtype: str = "int8", approximate: bool = False
                ) -> np.ndarray:
    """TFLite's table of LOGISTIC, TANH, EXP or GELU (``approximate``: its tanh form) for
    8-bit tensors (``PopulateLookupTable`` / ``LUTPopulate``)."""
    (s_in, zp_in), (s_out, zp_out) = in_q, out_q
    f, x = _float_function(op, approximate), _inputs(dtype)
    inverse = _f32(1.0) / _f32(s_out)
    out = []
    for v in x:
        real = _f32(s_in) * _f32(int(v) - int(zp_in))
        rescaled = round_half_away(_f32(f(real) * inverse))
        out.append(float(_f32(_f32(rescaled) + _f32(zp_out))))  # float + zp, then (int)
    return _clamp(np.trunc(np.array(out)), dtype)


# ----------------------------------------------------------------------------- float islands
# Float ops the converter leaves between a DEQUANTIZE and a QUANTIZE, each exact in float32
ISLAND_FUNCTIONS = {"NEG": np.negative}


def island_table(op: str, in_q, out_q, dtype: str = "int8") -> np.ndarray:
    """DEQUANTIZE -> ``op`` (float32) -> QUANTIZE as TFLite's reference kernels compute it:
    ``d = (float)((double)s_in * (x - zp_in))``; ``y = op(d)``;
    ``clamp(round(y / s_out) + zp_out)``, the quotient in float32, rounded half away."""
    (s_in, zp_in), (s_out, zp_out) = in_q, out_q
    x = _inputs(dtype)
    d = (np.float64(np.float32(s_in)) * (x - int(zp_in))).astype(np.float32)
    y = ISLAND_FUNCTIONS[op](d).astype(np.float32)
    q = round_half_away(y / np.float32(s_out))
    return _clamp(q.astype(np.int64) + int(zp_out), dtype)


# ----------------------------------------------------------------------------- HARD_SWISH
@dataclasses.dataclass(frozen=True)
class HardSwishParams:
    """TFLite's HardSwishParams for 8-bit tensors (HardSwishPrepare)."""

    in_zp: int
    out_zp: int
    reluish_multiplier: int  # int16
    reluish_exponent: int
    output_multiplier: int   # int16
    output_exponent: int     # <= 0


def _int16_multiplier(m32: int) -> int:
    """TFLite's DownScaleInt32ToInt16Multiplier: the top 16 bits, rounded, saturated."""
    rounding = 1 << 15
    if m32 >= (1 << 31) - 1 - rounding:
        return INT16_MAX
    return (m32 + rounding) >> 16


def hard_swish_params(in_q, out_q) -> HardSwishParams:
    (s_in, zp_in), (s_out, zp_out) = in_q, out_q
    hires = _f32(_f32(1.0 / (1 << HARD_SWISH_HIRES_SHIFT)) * _f32(s_in))
    reluish_scale = _f32(_f32(HARD_SWISH_RELUISH_ONE) / _f32(1 << 15))
    m_out, e_out = quantize_multiplier(float(_f32(hires / _f32(s_out))))
    m_rel, e_rel = quantize_multiplier(float(_f32(hires / reluish_scale)))
    if e_out > 0:
        raise ValueError(f"HARD_SWISH: input scale {s_in} / output scale {s_out} is too large "
                         "for TFLite's 8-bit kernel (it rejects this model)")
    return HardSwishParams(int(zp_in), int(zp_out), _int16_multiplier(m_rel), e_rel,
                           _int16_multiplier(m_out), e_out)


def _wrap16(v) -> np.ndarray:
    return ((np.asarray(v, np.int64) - INT16_MIN) & 0xFFFF) + INT16_MIN


def _srdhm16(a, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul for int16 (nudge, truncating division)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    num = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    high = np.where(num >= 0, num >> 15, -((-num) >> 15))
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, high)


def _sdhm16(a, b) -> np.ndarray:
    """TFLite's SaturatingDoublingHighMul (int16, truncating toward zero, no nudge)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    high = np.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, high)


def _saturating_shl16(v, amount: int) -> np.ndarray:
    return np.clip(np.asarray(v, np.int64) << amount, INT16_MIN, INT16_MAX)


def hard_swish_table(in_q, out_q, dtype: str = "int8") -> np.ndarray:
    """TFLite's 8-bit HARD_SWISH (``reference_ops::HardSwish``) for every input value."""
    p = hard_swish_params(in_q, out_q)
    v = _wrap16((_inputs(dtype) - p.in_zp) << HARD_SWISH_HIRES_SHIFT)
    preshift = _srdhm16(v, p.output_multiplier)
    reluish = v
    if p.reluish_exponent > 0:
        reluish = _saturating_shl16(reluish, p.reluish_exponent - 1)
    reluish = _srdhm16(reluish, p.reluish_multiplier)
    if p.reluish_exponent > 0:
        reluish = _saturating_shl16(reluish, 1)
    if p.reluish_exponent < 0:
        reluish = rounding_divide_by_pot(reluish, -p.reluish_exponent)
    reluish = (reluish + (1 << 15)) >> 1  # [-1, 1] -> [0, 1] in Q0.15
    out = rounding_divide_by_pot(_sdhm16(reluish, preshift), -p.output_exponent)
    return _clamp(_wrap16(out + p.out_zp), dtype)  # the sum is an int16 in TFLite


# ----------------------------------------------------------------------------- LEAKY_RELU, RELU
def _mbqm(x, real: np.float32) -> np.ndarray:
    m, e = quantize_multiplier(float(real))
    return multiply_by_quantized_multiplier(x, m, e).astype(np.int64)


def leaky_relu_table(in_q, out_q, alpha: float, dtype: str = "int8") -> np.ndarray:
    """TFLite's 8-bit LEAKY_RELU (``reference_ops::QuantizeLeakyRelu``)."""
    (s_in, zp_in), (s_out, zp_out) = in_q, out_q
    identity = _f32(_f32(s_in) / _f32(s_out))
    scaled_alpha = _f32(_f32(_f32(s_in) * _f32(alpha)) / _f32(s_out))
    d = _inputs(dtype) - int(zp_in)
    out = np.where(d >= 0, _mbqm(d, identity), _mbqm(d, scaled_alpha)) + int(zp_out)
    return _clamp(out, dtype)


def relu_table(in_q, out_q, act_range, dtype: str = "int8") -> np.ndarray:
    """TFLite's 8-bit RELU, RELU6 or RELU_N1_TO_1 (``ReluX``): requantize, then clamp to
    ``act_range``, the activation's (lo, hi) in output units."""
    (s_in, zp_in), (s_out, zp_out) = in_q, out_q
    out = _mbqm(_inputs(dtype) - int(zp_in), _f32(_f32(s_in) / _f32(s_out))) + int(zp_out)
    return np.clip(out, *act_range).astype(dtype)


# ----------------------------------------------------------------------------- RSQRT
def _srdhm(a: int, b: int) -> int:
    return int(saturating_rounding_doubling_high_mul(a, b))


def _saturating_shl32(v: int, k: int) -> int:
    """gemmlowp's SaturatingRoundingMultiplyByPOT<k>, k > 0, on an int32."""
    limit = (1 << (31 - k)) - 1
    return INT32_MAX if v > limit else -INT32_MAX - 1 if v < -limit else v << k


def _wrap32(v: int) -> int:
    return ((v + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def inv_sqrt_multiplier(v: int) -> tuple[int, int]:
    """1/sqrt(``v``), ``v`` >= 0, as TFLite's (multiplier, left shift) pair
    (``GetInvSqrtQuantizedMultiplierExp`` with its reverse shift of -1): ``v`` is
    normalized into [2**27, 2**29) by pairs of bits, read as a number with 3 integer
    bits, and 1/sqrt of half of it is found by Newton's iteration from 1, then times
    sqrt(2)/2."""
    if v <= 1:  # 0 and 1 both give the largest multiplier (TFLite: avoids an overflow)
        return INT32_MAX, 0
    shift = INV_SQRT_START_SHIFT
    while v >= 1 << INV_SQRT_NORMALIZED_BITS:
        v //= 4
        shift += 1
    leading_zeros = 32 - v.bit_length()
    pairs = (leading_zeros - 1) // 2 - 1
    shift -= pairs
    v <<= 2 * pairs
    half_input = int(rounding_divide_by_pot(v >> 1, 1))
    x = Q3_ONE
    for _ in range(INV_SQRT_NEWTON_STEPS):
        # x3 = x**3 (9 integer bits back to 3); x = 1.5 x - (v / 2) x3 (6 bits back to 3)
        x3 = _saturating_shl32(_srdhm(_srdhm(x, x), x), 6)
        x = _saturating_shl32(_wrap32(_srdhm(Q3_THREE_HALVES, x) - _srdhm(half_input, x3)), 3)
    x = _srdhm(x, Q0_HALF_SQRT2)
    if shift < 0:
        x, shift = _wrap32(x << -shift), 0
    return x, -shift


def rsqrt_table(in_q, out_q, dtype: str = "int8") -> np.ndarray:
    """TFLite's int8 RSQRT (``RsqrtEvalQuantizedInt8``), for every input value."""
    if dtype != "int8":
        raise ValueError(f"RSQRT: TFLite has no {dtype} kernel (int8 only)")
    (s_in, zp_in), (s_out, zp_out) = in_q, out_q
    m, e = quantize_multiplier(1.0 / float(_f32(np.sqrt(_f32(s_in)) * _f32(s_out))))
    top = int(np.iinfo(dtype).max)
    out = []
    for x in _inputs(dtype):
        v = int(x) - int(zp_in)
        if v <= 0:  # 0: TFLite's "close to 0 is the maximum"; below: TFLite refuses to run
            out.append(top)
            continue
        inv_m, inv_e = inv_sqrt_multiplier(v)
        root = multiply_by_quantized_multiplier(1, inv_m, inv_e + RSQRT_SHIFT)
        out.append(int(multiply_by_quantized_multiplier(root, m, e - RSQRT_SHIFT)) + int(zp_out))
    return _clamp(np.array(out), dtype)


def table(op: str, in_q, out_q, dtype: str = "int8", **options) -> np.ndarray:
    """The 256-entry table of TFLite op ``op`` (``"LOGISTIC"``, ``"HARD_SWISH"``, ...),
    entry ``k`` for input value ``dtype_min + k``; ``options``: LEAKY_RELU's ``alpha``,
    the RELU family's ``act_range``."""
    if op in FLOAT_FUNCTIONS:
        return float_table(op, in_q, out_q, dtype, **options)
    if op == "HARD_SWISH":
        return hard_swish_table(in_q, out_q, dtype)
    if op == "LEAKY_RELU":
        return leaky_relu_table(in_q, out_q, options["alpha"], dtype)
    if op in RELU_OPS:
        return relu_table(in_q, out_q, options["act_range"], dtype)
    if op == "RSQRT":
        return rsqrt_table(in_q, out_q, dtype)
    if op in ISLAND_FUNCTIONS:
        return island_table(op, in_q, out_q, dtype)
    raise ValueError(f"no table for TFLite op {op}: expected one of {', '.join(OPS)}")


# Every op with a table, in the order the tests sweep them
OPS = ("LOGISTIC", "TANH", "EXP", "HARD_SWISH", "LEAKY_RELU", *RELU_OPS, "RSQRT", "GELU",
       *ISLAND_FUNCTIONS)
assert set(OPS) >= set(FLOAT_FUNCTIONS)
INT8_ONLY = ("RSQRT", "EXP", *ISLAND_FUNCTIONS)  # TFLite has no uint8 kernel for these


def dtypes(op: str) -> tuple[str, ...]:
    """The 8-bit dtypes TFLite has a kernel of ``op`` for."""
    return ("int8",) if op in INT8_ONLY else DTYPES


# ----------------------------------------------------------------------------- the kernel
LANES = 16  # bytes per NEON register: elements looked up by one tbl/tbx
GROUP = 4  # registers per tbl4/tbx4 table: 64 entries
GROUP_ENTRIES = GROUP * LANES
# Vectors one parallel task does: it loads the table's 16 registers once for all of them
BLOCK_VECTORS = 64


def lut_func(shape, dtype: str = "int8", *, schedule: bool = True):
    """``out = table[x - dtype_min]`` over a tensor of ``shape``: a PrimFunc
    ``(x, table, out)``, the table a ``dtype`` vector of 256 entries (``table(...)``).
    Scheduled, it is the ``tbl``/``tbx`` kernel of the module docstring (a tensor of fewer
    than 16 elements: the gather, vectorized); with ``schedule=False`` the plain gather it
    computes."""
    from tvm import te

    from .int8_ops import elementwise_schedule

    _inputs(dtype)
    shape = tuple(int(d) for d in shape)
    if schedule and int(np.prod(shape)) >= LANES:
        return _tbl_func(shape, dtype)
    low = int(np.iinfo(dtype).min)
    x = te.placeholder(shape, dtype, "x")
    tab = te.placeholder((TABLE_SIZE,), dtype, "table")
    out = te.compute(x.shape, lambda *i: tab[x[i].astype("int32") - low], name="lut")
    func = te.create_prim_func([x, tab, out])
    return elementwise_schedule(func) if schedule else func


def _tbl_func(shape: tuple[int, ...], dtype: str):
    """The tbl/tbx kernel over a tensor of ``shape`` (16 elements or more)."""
    from tvm import tirx
    from tvm.script import tirx as T

    n = int(np.prod(shape))
    vec = f"{dtype}x{LANES}"
    # entry of the table for raw byte 0 (the input value 0 - dtype_min)
    start = -int(np.iinfo(dtype).min)
    vectors = -(-n // LANES)
    blocks = -(-vectors // BLOCK_VECTORS)

    @T.prim_func(private=True)
    def func(x_h: T.handle, t_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        x = T.match_buffer(x_h, shape, dtype)
        t = T.match_buffer(t_h, (TABLE_SIZE,), dtype)
        o = T.match_buffer(o_h, shape, dtype)
        xf = T.decl_buffer((n,), dtype, data=x.data)
        of = T.decl_buffer((n,), dtype, data=o.data)
        for b in T.parallel(blocks):
            regs = T.meta_var([T.bind(v) for g in range(TABLE_SIZE // GROUP_ENTRIES)
                               for v in _group(t, g, start, vec)])
            for v in T.serial(b * BLOCK_VECTORS, T.min((b + 1) * BLOCK_VECTORS, vectors)):
                at = T.bind(T.min(v * LANES, n - LANES))
                raw = T.bind(xf.vload([at], vec))
                T.buffer_store(of, _lookup(regs, raw, vec), [tirx.Ramp(at, 1, LANES)])

    return func


def _group(t, g: int, start: int, vec: str):
    """The four table registers of group ``g``: entries for raw bytes 64 g .. 64 g + 63."""
    first = (g * GROUP_ENTRIES + start) % TABLE_SIZE
    return [t.vload([first + r * LANES], vec) for r in range(GROUP)]


def _lookup(regs, raw, vec: str):
    """tbl over the first group, tbx over each next with the index lowered by 64 more
    (in uint8, where the subtraction wraps: an index that was below the group's start
    becomes 192 or more, out of range)."""
    from tvm import tirx

    index = tirx.reinterpret(f"uint8x{LANES}", raw)
    out = tirx.call_llvm_pure_intrin(vec, "llvm.aarch64.neon.tbl4", *regs[:GROUP], index)
    for g in range(1, len(regs) // GROUP):
        index = index - tirx.Broadcast(tirx.const(GROUP_ENTRIES, "uint8"), LANES)
        out = tirx.call_llvm_pure_intrin(vec, "llvm.aarch64.neon.tbx4", out,
                                         *regs[g * GROUP:(g + 1) * GROUP], index)
    return out
