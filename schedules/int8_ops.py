"""Quantized int8/uint8 ADD, MUL, PRELU, MAXIMUM, MINIMUM, MEAN, AVERAGE_POOL_2D, requantize
and the CONCATENATION copy as TIR (SOFTMAX has a module of its own: ``softmax.py``).

Read this first. Each function here builds one TFLite operator as a scheduled TIR PrimFunc
that gives, bit for bit, what TFLite's reference kernels (the ``BUILTIN_REF`` op resolver)
give. Each op does its work in two steps, as TFLite does:

* **Prepare** (here: at compile time, in Python). The float32 scales of the tensors become
  integer multipliers and shifts. The real factors are computed in double (or float, where
  TFLite computes in float), then split by ``requant.quantize_multiplier`` (TFLite's
  ``QuantizeMultiplier``). The ``*_params`` functions do this and return dataclasses whose
  fields are the keyword arguments of the NumPy references in ``schedules.reference``.
* **Eval** (the PrimFunc). Integer arithmetic only. Every requantization is
  ``qmuls(x, multiplier, 31, shift)``, TFLite's ``MultiplyByQuantizedMultiplier`` with
  double rounding (``intrinsics.qmuls``: sqrdmulh + rounding shift on aarch64). The
  multipliers, shifts and zero points are immediates in the code.

What each op computes (``zp`` = zero point, ``s`` = float32 scale, ``M(x, m, e)`` = qmuls):

ADD (``add_func``; TFLite's general 8-bit path, ``left_shift`` = 20)
    Prepare: ``twice = 2 * max(s_a, s_b)``; input factors ``s_a / twice`` and
    ``s_b / twice`` (<= 1/2), output factor ``twice / (2**20 * s_out)``, all in double.
    Eval: ``a' = M((a - zp_a) << 20, m_a, e_a)``, same for b,
    ``out = clamp(M(a' + b', m_out, e_out) + zp_out, act_lo, act_hi)``. The input of the
    larger scale has the factor 1/2 exactly (``HALF``): its ``a'`` is ``(a - zp_a) << 19``.
SUB (``add_func(..., op="SUB")``): ADD's Prepare (TFLite's PrepareGeneralSubOp is
    the same for 8-bit tensors), and ``a' - b'`` in Eval.
SQUARED_DIFFERENCE (``add_func(..., op="SQUARED_DIFFERENCE")``; int8 only, as TFLite)
    ADD's recipe with ``left_shift`` = 7: the same input factors, output factor
    ``twice**2 / (2**14 * s_out)``. Eval: ``d = a' - b'``,
    ``out = clamp(M(d * d, m_out, e_out) + zp_out)`` (``|d| <= 255 << 7``: ``d * d``
    fits in int32). TFLite refuses an output factor of 1 or more.
MUL (``mul_func``)
    Prepare: ``s_a * s_b / s_out`` evaluated in **float32** (TFLite multiplies the float
    scales before the result becomes a double), then ``QuantizeMultiplier``.
    Eval: ``out = clamp(M((a - zp_a) * (b - zp_b), m, e) + zp_out, act_lo, act_hi)``.
    Both ADD and MUL broadcast as NumPy does (TFLite's ``BroadcastAdd/Mul*DSlow``).
PRELU (``prelu_func``)
    Prepare: ``s_in / s_out`` and ``s_in * s_alpha / s_out``, each in float32 arithmetic,
    then ``QuantizeMultiplier``. Eval: ``v = x - zp_in``;
    ``out = clamp((v >= 0 ? M(v, m_1, e_1) : M(v * (alpha - zp_alpha), m_2, e_2)) + zp_out)``
    to the dtype (PRELU has no fused activation); ``alpha`` broadcasts.
MAXIMUM, MINIMUM (``min_max_func``)
    ``out = max(a, b)`` / ``min(a, b)`` of the raw 8-bit values, broadcasting: TFLite's
    kernel rescales nothing.
MEAN (``mean_func``)
    TFLite's reference MEAN takes one path for int8/uint8 whatever keep_dims, the axes or
    the scales are (``reference_ops::QuantizedMeanOrSum``; checked against the installed
    TFLite in ``tests/test_int8_ops.py``, for keep_dims true and false, axes [1, 2] and
    others, equal and different scales). Prepare: ``m, e`` of ``s_in / s_out`` (double);
    then, for the n = number of reduced elements, ``k = min(floor(log2 n), 32, 31 + e)``,
    ``m' = (m << k) // n`` (int64, truncating), ``e' = e - k``: the 1/n is folded into the
    multiplier. Eval: ``out = clamp(M(sum(x) - zp_in * n, m', e') + zp_out)`` to the dtype.
AVERAGE_POOL_2D (``avg_pool_func``)
    No rescaling (TFLite requires equal input and output quantization). Per output pixel,
    ``count`` = the window's pixels inside the input (padding is not counted),
    ``acc`` = sum of the raw input values, and the average rounds half away from zero:
    ``acc > 0 ? (acc + count/2) / count : (acc - count/2) / count`` (C division). Then the
    activation clamp. The division is a multiplication (see ``_rounded_average``).
Requantize (``requantize_func``; TFLite's QUANTIZE from an int8/uint8 tensor)
    Prepare: ``m, e`` of ``s_in / s_out`` (double). Eval: ``clamp(M(x - zp_in, m, e) + zp_out)``
    to the output dtype. TFLite's int8 CONCATENATION refuses inputs whose scale or zero
    point differ from the output's; the converter then puts such a QUANTIZE before it,
    so a concatenation needing rescaling is this op on each input, then a plain copy.

Layout and schedules: tensors are dense, row-major (NHWC for MEAN and AVERAGE_POOL_2D).
The last axis ("channels") is the vector axis: 16 int8 lanes per NEON register. Outer
axes are fused into one parallel loop. Element-wise ops split the channel loop into
16-lane vectors plus one narrower vector for the remainder (``Schedule.loop_partition``);
ops with several blocks (MEAN, AVERAGE_POOL_2D) vectorize over 16, 8 or 4
channels, whichever divides the channel count (else its largest divisor below 16:
``channel_block``), with their per-row or per-pixel reductions computed right where the
output uses them.

Every ``*_func`` returns a scheduled PrimFunc (``schedule=False``: the unscheduled one)
whose parameters are its inputs, then its output.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tvm_armq.intrinsics.requant import MAX_SHIFT, MIN_SHIFT, quantize_multiplier

from .tir_util import vectorize_in_registers

LANES = 16  # int8 lanes in one 128-bit NEON register
DTYPES = ("int8", "uint8")
Q31 = 31  # fractional bits of TFLite's multipliers (qmuls' q)

ADD_LEFT_SHIFT = 20  # TFLite's 8-bit ADD works on (x - zp) << 20 (< 2**28: the sum fits)
# SQUARED_DIFFERENCE works on (x - zp) << 7: the square of a difference fits in int32
SQUARED_DIFFERENCE_LEFT_SHIFT = 7
# The largest left shift of an 8-bit value minus an 8-bit zero point that int16 holds:
# |x - zp| <= 255 and 255 << 7 = 32640 (the first of ADD's two widening steps)
WIDEN_SHIFT_16 = 7
# The ops that rescale both inputs to a common scale first (TFLite's ADD recipe), by the
# left shift that keeps the rescaled inputs exact
COMMON_SCALE_OPS = {"ADD": ADD_LEFT_SHIFT, "SUB": ADD_LEFT_SHIFT,
                    "SQUARED_DIFFERENCE": SQUARED_DIFFERENCE_LEFT_SHIFT}
# QuantizeMultiplier(0.5), the input factor of the larger-scale input of ADD's recipe
# (``s / (2 * s)``): qmuls(v << k, *HALF) is v << (k - 1) exactly (sqrdmulh halves an even
# number without rounding, and the shift is 0), so that input is rescaled by a shift
HALF = (1 << (Q31 - 1), 0)

MEAN_MAX_FOLD_SHIFT = 32  # TFLite folds 1/n into the multiplier with at most 32 extra bits

# AVERAGE_POOL_2D divides by the pixel count as a multiplication by ceil(2**30 / count),
# exact for 8-bit inputs and windows up to POOL_MAX_WINDOW pixels (see _rounded_average)
POOL_RECIPROCAL_BITS = 30
POOL_MAX_WINDOW = 1024



def _dtype(dtype: str, op: str) -> np.iinfo:
    if dtype not in DTYPES:
        raise TypeError(f"{op}: dtype must be one of {DTYPES}, got {dtype!r}")
    return np.iinfo(dtype)


def _f32(scale) -> float:
    """A scale as TFLite holds it: a float32 (read as a double when TFLite computes in double)."""
    return float(np.float32(scale))


def _quant(q, op: str, what: str, info: np.iinfo) -> tuple[float, int]:
    scale, zp = q
    if not (math.isfinite(float(scale)) and float(scale) > 0):
        raise ValueError(f"{op}: {what} scale must be a positive number, got {scale}")
    if not info.min <= int(zp) <= info.max:
        raise ValueError(f"{op}: {what} zero point {zp} is outside {info.dtype}")
    return _f32(scale), int(zp)


def _act_range(act_range, info: np.iinfo, op: str) -> tuple[int, int]:
    lo, hi = (int(info.min), int(info.max)) if act_range is None else map(int, act_range)
    if not info.min <= lo <= hi <= info.max:
        raise ValueError(f"{op}: activation range ({lo}, {hi}) is not inside {info.dtype}")
    return lo, hi


def _check_shift(shift: int, op: str, what: str) -> int:
    if not MIN_SHIFT <= shift <= MAX_SHIFT["double"]:
        raise ValueError(f"{op}: the {what} scale needs a shift of {shift}, outside TFLite's "
                         f"[{MIN_SHIFT}, {MAX_SHIFT['double']}]")
    return shift


# ----------------------------------------------------------------------------- Prepare
@dataclasses.dataclass(frozen=True)
class AddParams:
    """TFLite's ADD parameters (fields = keyword arguments of ``reference.broadcast_add``)."""

    a_zp: int
    b_zp: int
    out_zp: int
    left_shift: int
    a_multiplier: int
    a_shift: int
    b_multiplier: int
    b_shift: int
    out_multiplier: int
    out_shift: int
    act_range: tuple[int, int]
    out_dtype: str = "int8"
    op: str = "ADD"  # or SUB, SQUARED_DIFFERENCE: how the rescaled inputs combine


def add_params(a_q, b_q, out_q, act_range=None, dtype: str = "int8",
               op: str = "ADD") -> AddParams:
    """TFLite's Prepare of an op of ``COMMON_SCALE_OPS`` for 8-bit tensors (ADD; SUB's is
    the same; SQUARED_DIFFERENCE's with its own left shift and a squared output factor);
    ``*_q`` = (float32 scale, zero point)."""
    if op not in COMMON_SCALE_OPS:
        raise ValueError(f"{op} is not one of {', '.join(COMMON_SCALE_OPS)}")
    if op == "SQUARED_DIFFERENCE" and dtype != "int8":
        raise ValueError(f"SQUARED_DIFFERENCE: TFLite has no {dtype} kernel (int8 only)")
    info = _dtype(dtype, op)
    (sa, za), (sb, zb), (so, zo) = (_quant(q, op, w, info)
                                    for q, w in ((a_q, "input 1"), (b_q, "input 2"),
                                                 (out_q, "output")))
    left_shift = COMMON_SCALE_OPS[op]
    twice_max = 2 * max(sa, sb)
    out_factor = twice_max * twice_max / ((1 << 2 * left_shift) * so) \
        if op == "SQUARED_DIFFERENCE" else twice_max / ((1 << left_shift) * so)
    mults = [quantize_multiplier(sa / twice_max), quantize_multiplier(sb / twice_max),
             quantize_multiplier(out_factor)]
    for (_, e), what in zip(mults, ("input 1", "input 2", "output")):
        if e > 0:  # TFLite's QuantizeMultiplierSmallerThanOneExp refuses these
            raise ValueError(f"{op}: the {what} rescaling factor is not below 1 "
                             f"(scales {sa}, {sb} -> {so}); TFLite rejects this model")
        _check_shift(e, op, what)
    (ma, ea), (mb, eb), (mo, eo) = mults
    return AddParams(za, zb, zo, left_shift, ma, ea, mb, eb, mo, eo,
                     _act_range(act_range, info, op), dtype, op)


@dataclasses.dataclass(frozen=True)
class MulParams:
    """TFLite's MUL parameters (fields = keyword arguments of ``reference.broadcast_mul``)."""

    a_zp: int
    b_zp: int
    out_zp: int
    multiplier: int
    shift: int
    act_range: tuple[int, int]
    out_dtype: str = "int8"


def mul_params(a_q, b_q, out_q, act_range=None, dtype: str = "int8") -> MulParams:
    """TFLite's MUL Prepare: ``s_a * s_b / s_out`` in float32 arithmetic, then split."""
    info = _dtype(dtype, "MUL")
    (sa, za), (sb, zb), (so, zo) = (_quant(q, "MUL", w, info)
                                    for q, w in ((a_q, "input 1"), (b_q, "input 2"),
                                                 (out_q, "output")))
    f = np.float32
    real = float(f(f(sa) * f(sb)) / f(so))  # each step rounded to float32, as TFLite's C++
    m, e = quantize_multiplier(real)
    return MulParams(za, zb, zo, m, _check_shift(e, "MUL", "output"),
                     _act_range(act_range, info, "MUL"), dtype)


@dataclasses.dataclass(frozen=True)
class PreluParams:
    """TFLite's PRELU parameters (fields = keyword arguments of ``reference.prelu``)."""

    in_zp: int
    alpha_zp: int
    out_zp: int
    identity_multiplier: int  # x >= zp: s_in / s_out
    identity_shift: int
    alpha_multiplier: int     # x < zp: s_in * s_alpha / s_out
    alpha_shift: int
    out_dtype: str = "int8"


def prelu_params(in_q, alpha_q, out_q, dtype: str = "int8") -> PreluParams:
    """TFLite's PRELU Prepare: both factors in float32 arithmetic (TFLite divides and
    multiplies the float scales, then widens the result to double), then split."""
    info = _dtype(dtype, "PRELU")
    (si, zi), (sa, za), (so, zo) = (_quant(q, "PRELU", w, info)
                                    for q, w in ((in_q, "input"), (alpha_q, "alpha"),
                                                 (out_q, "output")))
    f = np.float32
    m1, e1 = quantize_multiplier(float(f(si) / f(so)))
    m2, e2 = quantize_multiplier(float(f(f(si) * f(sa)) / f(so)))
    return PreluParams(zi, za, zo, m1, _check_shift(e1, "PRELU", "identity"),
                       m2, _check_shift(e2, "PRELU", "alpha"), dtype)


@dataclasses.dataclass(frozen=True)
class MeanParams:
    """TFLite's MEAN parameters with 1/n folded in (keywords of ``reference.mean``)."""

    in_zp: int
    out_zp: int
    multiplier: int
    shift: int
    out_dtype: str = "int8"


def mean_params(count: int, in_q, out_q, dtype: str = "int8") -> MeanParams:
    """TFLite's MEAN: Prepare's multiplier for ``s_in / s_out``, then its Eval's folding of
    1/``count`` (the number of elements averaged) into that multiplier."""
    info = _dtype(dtype, "MEAN")
    (si, zi), (so, zo) = _quant(in_q, "MEAN", "input", info), _quant(out_q, "MEAN", "output", info)
    if count < 1:
        raise ValueError(f"MEAN: nothing to average ({count} elements)")
    m, e = quantize_multiplier(si / so)
    fold = min(count.bit_length() - 1, MEAN_MAX_FOLD_SHIFT, MAX_SHIFT["double"] + e)
    return MeanParams(zi, zo, (m << fold) // count, _check_shift(e - fold, "MEAN", "output"),
                      dtype)


@dataclasses.dataclass(frozen=True)
class RequantizeParams:
    """TFLite's QUANTIZE parameters, 8-bit to 8-bit (``reference.requantize_tensor``'s
    keywords)."""

    in_zp: int
    out_zp: int
    multiplier: int
    shift: int
    out_dtype: str = "int8"


def requantize_params(in_q, out_q, in_dtype: str = "int8",
                      out_dtype: str = "int8") -> RequantizeParams:
    """TFLite's QUANTIZE Prepare for a quantized input: ``s_in / s_out`` in double."""
    (si, zi) = _quant(in_q, "QUANTIZE", "input", _dtype(in_dtype, "QUANTIZE"))
    (so, zo) = _quant(out_q, "QUANTIZE", "output", _dtype(out_dtype, "QUANTIZE"))
    m, e = quantize_multiplier(si / so)
    return RequantizeParams(zi, zo, m, _check_shift(e, "QUANTIZE", "output"), out_dtype)


# ----------------------------------------------------------------------------- TIR helpers
def _clamp_cast(x, lo: int, hi: int, dtype: str):
    from tvm import tirx

    return tirx.max(tirx.min(x, hi), lo).astype(dtype)


def _requantized(x, multiplier: int, shift: int, zp: int, act_range, dtype: str):
    """``clamp(qmuls(x, multiplier, 31, shift) + zp)`` to ``act_range`` as ``dtype``: int8
    through ``qmuls.requantize_narrow`` (16-bit lanes after a saturating narrow on aarch64)."""
    from tvm_armq.intrinsics.qmuls import requantize, requantize_narrow

    if dtype == "int8":
        return requantize_narrow(x, multiplier, shift, zp, *act_range)
    return requantize(x, multiplier, shift, zp, *act_range).astype(dtype)


def _broadcast_index(shape, out_shape, idx):
    """Index into a NumPy-broadcast operand of ``shape`` at output index ``idx``."""
    lead = len(out_shape) - len(shape)
    return [0 if n == 1 else idx[lead + d] for d, n in enumerate(shape)]


def _check_broadcast(op: str, a_shape, b_shape, out_shape):
    try:
        expected = tuple(np.broadcast_shapes(tuple(a_shape), tuple(b_shape)))
    except ValueError:
        raise ValueError(f"{op}: shapes {tuple(a_shape)} and {tuple(b_shape)} do not "
                         "broadcast") from None
    if tuple(out_shape) != expected:
        raise ValueError(f"{op}: output shape {tuple(out_shape)} is not the broadcast shape "
                         f"{expected} of {tuple(a_shape)} and {tuple(b_shape)}")


def channel_block(channels: int) -> int:
    """Vector width for the channel loop of multi-block ops, a divisor of ``channels`` (no
    remainder loop): 16, 8 or 4 lanes (whole int32x4 registers for the epilogue) when one
    divides, else the largest divisor up to 16."""
    for lanes in (LANES, LANES // 2, LANES // 4):
        if channels % lanes == 0:
            return lanes
    return max(d for d in range(1, min(channels, LANES) + 1) if channels % d == 0)


def elementwise_schedule(func):
    """One block over the output: outer axes fused and parallel; the last axis in 16-lane
    vectors, and its remainder (last % 16) as one narrower vector."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    (block,) = [b for b in sch.get_child_blocks(sch.get_sblock("root"))]
    loops = sch.get_loops(block)
    inner = loops[-1]
    if len(loops) > 1:
        outer = sch.fuse(*loops[:-1])
        if int(sch.get(outer).extent) > 1:
            sch.parallel(outer)
    channels = int(sch.get(inner).extent)
    vectors = vectorize_in_registers(sch, inner, LANES)
    if (vectors is not None and channels % LANES == 0 and len(loops) == 1
            and int(sch.get(vectors).extent) > 1):
        sch.parallel(vectors)  # a 1-D tensor: its vectors are the outer axis
    return sch.mod["main"]


def finish_func(tensors, schedule, scheduler):
    """The PrimFunc of TE ``tensors`` (inputs, then outputs), scheduled by ``scheduler``
    if ``schedule`` (the unscheduled func otherwise): every elementwise op's last step."""
    from tvm import te

    func = te.create_prim_func(list(tensors))
    return scheduler(func) if schedule else func


# ----------------------------------------------------------------------------- ADD, MUL
def common_scale(v, zp: int, multiplier: int, shift: int, left_shift: int):
    """One 8-bit input ``v`` of ADD's recipe on the common scale, ``M((v - zp) <<
    left_shift)`` as int32 (``add_func``; ``layer_norm`` runs the recipe too). The input of
    the larger scale has the factor 1/2 exactly (``HALF``): its rescaling is ``(v - zp) <<
    (left_shift - 1)``, no rounding."""
    from tvm_armq.intrinsics.qmuls import qmuls

    if (multiplier, shift) == HALF:
        return _shifted_centred(v, zp, left_shift - 1, by_multiply=True)
    return qmuls(_shifted_centred(v, zp, left_shift), multiplier, Q31, shift)


def add_output(a_, b_, p: AddParams, dtype: str):
    """ADD's recipe's output (``p.op``: ADD, SUB or SQUARED_DIFFERENCE) from its two inputs
    on the common scale (``common_scale``)."""
    total = a_ + b_ if p.op == "ADD" else a_ - b_
    if p.op == "SQUARED_DIFFERENCE":
        total = total * total
    # a fused ReLU drops the rounding fixup (qmuls.requantize)
    return _requantized(total, p.out_multiplier, p.out_shift, p.out_zp, p.act_range, dtype)


def mul_output(x16, y16, p: MulParams, dtype: str):
    """MUL's output from its two inputs minus their zero points as int16 (``|v - zp| <=
    255``): their product is one 16 x 16 -> 32-bit multiply (``widening_mul``: smull),
    where int32 operands take a 32-bit one; ``|x * y| <= 255 * 255``."""
    from tvm_armq.intrinsics.widen import widening_mul

    return _requantized(widening_mul(x16, y16), p.multiplier, p.shift, p.out_zp, p.act_range,
                        dtype)


def _shifted_centred(v, zp: int, shift: int, *, by_multiply: bool = False):
    """``(v - zp) << shift`` as int32 for an 8-bit ``v``, exactly, in two widening steps:
    ``(v - zp) << WIDEN_SHIFT_16`` in int16 (it fits), then the rest of the shift on the
    way to int32. LLVM makes each step one shift-and-widen (sshll/ushll with the shift as
    its immediate), where one int32 shift after two plain widenings costs a third
    instruction per vector on the shift pipe, which bounds ADD's loop on every core.
    ``by_multiply``: the second step is a widening multiply by ``1 << rest`` (smull), on
    the multiply pipe instead (ADD's half-scale input, whose partner's rescaling keeps the
    shift pipe the busier: measured in docs/performance.md)."""
    from tvm import tirx

    from tvm_armq.intrinsics.widen import widening_mul

    first = min(shift, WIDEN_SHIFT_16)
    rest = shift - first
    centred = (v.astype("int16") << first) - tirx.const(zp << first, "int16")
    if by_multiply and rest > 0:
        return widening_mul(centred, tirx.const(1 << rest, "int16"))
    return centred.astype("int32") << rest


def add_func(a_shape, b_shape, out_shape, a_q, b_q, out_q, act_range=None,
             dtype: str = "int8", *, schedule: bool = True, op: str = "ADD",
             b_first: bool = False, constant: np.ndarray | None = None):
    """TFLite's 8-bit ADD (broadcasting, fused activation ``act_range``) as a PrimFunc
    ``(a, b, out)``; ``*_q`` = (float32 scale, zero point), ``act_range`` = (lo, hi) in
    output units (``frontend.layers.activation_range``), None for no activation.
    ``op``: "ADD", "SUB" (``a' - b'``) or "SQUARED_DIFFERENCE" (``(a' - b')**2``), each
    with its Prepare (``add_params``). ``b_first``: the PrimFunc takes ``(b, a, out)`` (a
    SUB whose first operand is a constant: call_tir passes constants last).

    ``constant``: the values of the operand that is a compile-time constant (``b``, or
    ``a`` with ``b_first``: the PrimFunc's second parameter either way). Its rescaling,
    ``M((v - zp) << left_shift)``, is then done here, once per value, with the reference
    arithmetic, and the PrimFunc takes the int32 results in its place: one of the three
    requantizations per element is gone. Returns ``(func, rescaled values)`` then."""
    from tvm import te

    _check_broadcast(op, a_shape, b_shape, out_shape)
    p = add_params(a_q, b_q, out_q, act_range, dtype, op)
    rescaled_const = None
    if constant is not None:
        from .reference import rescale_add_input

        zp, m, e = ((p.a_zp, p.a_multiplier, p.a_shift) if b_first
                    else (p.b_zp, p.b_multiplier, p.b_shift))
        values = np.asarray(constant)
        rescaled_const = np.asarray(
            rescale_add_input(values, zp=zp, left_shift=p.left_shift, multiplier=m, shift=e),
            np.int32).reshape(values.shape)  # 0-d too
    const_dtype = dtype if constant is None else "int32"
    a = te.placeholder(tuple(a_shape), const_dtype if b_first else dtype, "a")
    b = te.placeholder(tuple(b_shape), dtype if b_first else const_dtype, "b")

    def rescaled(t, shape, zp, m, e, idx):
        v = t[tuple(_broadcast_index(shape, out_shape, idx))]
        if t.dtype == "int32":  # the constant, rescaled at compile time
            return v
        return common_scale(v, zp, m, e, p.left_shift)

    def element(*idx):
        return add_output(rescaled(a, a_shape, p.a_zp, p.a_multiplier, p.a_shift, idx),
                          rescaled(b, b_shape, p.b_zp, p.b_multiplier, p.b_shift, idx),
                          p, dtype)

    out = te.compute(tuple(out_shape), element, name=op.lower())
    func = finish_func((b, a, out) if b_first else (a, b, out), schedule, elementwise_schedule)
    return func if constant is None else (func, rescaled_const)


def mul_func(a_shape, b_shape, out_shape, a_q, b_q, out_q, act_range=None,
             dtype: str = "int8", *, schedule: bool = True):
    """TFLite's 8-bit MUL (broadcasting, fused activation) as a PrimFunc ``(a, b, out)``;
    arguments as ``add_func``."""
    from tvm import te, tirx

    _check_broadcast("MUL", a_shape, b_shape, out_shape)
    p = mul_params(a_q, b_q, out_q, act_range, dtype)
    a = te.placeholder(tuple(a_shape), dtype, "a")
    b = te.placeholder(tuple(b_shape), dtype, "b")

    def centred(t, shape, zp, idx):
        """t - zp as int16 (``mul_output``'s operands)."""
        v = t[tuple(_broadcast_index(shape, out_shape, idx))].astype("int16")
        return v - tirx.const(zp, "int16")

    def element(*idx):
        # a fused ReLU drops the rounding fixup (qmuls.requantize)
        return mul_output(centred(a, a_shape, p.a_zp, idx), centred(b, b_shape, p.b_zp, idx),
                          p, dtype)

    out = te.compute(tuple(out_shape), element, name="mul")
    return finish_func((a, b, out), schedule, elementwise_schedule)


def prelu_func(x_shape, alpha_shape, x_q, alpha_q, out_q, dtype: str = "int8", *,
               schedule: bool = True):
    """TFLite's 8-bit PRELU as a PrimFunc ``(x, alpha, out)``: ``alpha`` (8-bit, its own
    quantization) broadcasts against ``x`` (per channel in Keras' PReLU); the output has
    ``x``'s shape. Each element takes one of two rescalings by the sign of ``x - zp``."""
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import qmuls

    _check_broadcast("PRELU", x_shape, alpha_shape, x_shape)
    p = prelu_params(x_q, alpha_q, out_q, dtype)
    x = te.placeholder(tuple(x_shape), dtype, "x")
    alpha = te.placeholder(tuple(alpha_shape), dtype, "alpha")
    info = np.iinfo(dtype)

    def element(*idx):
        v = x[idx].astype("int32") - p.in_zp
        a = alpha[tuple(_broadcast_index(alpha_shape, x_shape, idx))].astype("int32") - p.alpha_zp
        r = tirx.Select(v >= 0, qmuls(v, p.identity_multiplier, Q31, p.identity_shift),
                        qmuls(v * a, p.alpha_multiplier, Q31, p.alpha_shift))  # |v*a| <= 255**2
        return _clamp_cast(r + p.out_zp, int(info.min), int(info.max), dtype)

    out = te.compute(tuple(x_shape), element, name="prelu")
    return finish_func((x, alpha, out), schedule, elementwise_schedule)


def min_max_func(op: str, a_shape, b_shape, out_shape, dtype: str = "int8", *,
                 schedule: bool = True):
    """TFLite's 8-bit MAXIMUM or MINIMUM (``op`` = "maximum" / "minimum", broadcasting) as a
    PrimFunc ``(a, b, out)``. TFLite compares the raw 8-bit values and rescales nothing
    (its converter gives both inputs and the output one quantization), so neither does
    this."""
    from tvm import te, tirx

    _dtype(dtype, op.upper())
    _check_broadcast(op.upper(), a_shape, b_shape, out_shape)
    pick = {"maximum": tirx.max, "minimum": tirx.min}[op]
    a = te.placeholder(tuple(a_shape), dtype, "a")
    b = te.placeholder(tuple(b_shape), dtype, "b")
    out = te.compute(tuple(out_shape),
                     lambda *i: pick(a[tuple(_broadcast_index(a_shape, out_shape, i))],
                                     b[tuple(_broadcast_index(b_shape, out_shape, i))]),
                     name=op)
    return finish_func((a, b, out), schedule, elementwise_schedule)


# ----------------------------------------------------------------------------- requantize
def requantize_func(shape, in_q, out_q, in_dtype: str = "int8", out_dtype: str = "int8", *,
                    schedule: bool = True):
    """TFLite's QUANTIZE of an 8-bit tensor to new quantization (``in_q`` -> ``out_q``) as a
    PrimFunc ``(x, out)``. In front of a CONCATENATION input whose scale or zero point
    differ from the output's, this is what TFLite runs (int8 CONCATENATION itself refuses
    to rescale)."""
    from tvm import te

    p = requantize_params(in_q, out_q, in_dtype, out_dtype)
    info = np.iinfo(out_dtype)
    x = te.placeholder(tuple(shape), in_dtype, "x")

    def element(*idx):
        return _requantized(x[idx].astype("int32") - p.in_zp, p.multiplier, p.shift,
                            p.out_zp, (int(info.min), int(info.max)), out_dtype)

    out = te.compute(tuple(shape), element, name="requantize")
    return finish_func((x, out), schedule, elementwise_schedule)


# ----------------------------------------------------------------------------- CONCATENATION
def concat_func(shapes, axis: int, dtype: str = "int8"):
    """CONCATENATION along ``axis`` of tensors of ``shapes`` (same dtype, same quantization:
    requantize_func first for the others) as a PrimFunc ``(x0, x1, ..., out)``: a copy.

    Seen as 2-D, every tensor is [outer, width] with outer the product of the axes before
    ``axis`` and width its elements from ``axis`` on; the output's row o is the inputs'
    rows o side by side. So each input is one loop over the rows (parallel) copying its
    contiguous run into the output at its offset, in ``LANES``-element vectors and one
    narrower vector for the rest: no per-element test of which input an element comes
    from (what a generic concatenate computes).
    """
    from tvm.script import tirx as T
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder.tirx import prim_func

    shapes = [tuple(int(d) for d in sh) for sh in shapes]
    rank = len(shapes[0])
    axis = _normalize_axes([axis], rank, "concat")[0]
    if any(len(sh) != rank or sh[:axis] + sh[axis + 1:] != shapes[0][:axis] +
           shapes[0][axis + 1:] for sh in shapes):
        raise ValueError(f"concat: shapes {shapes} differ off axis {axis}")
    outer = int(np.prod(shapes[0][:axis], dtype=np.int64))
    widths = [int(np.prod(sh[axis:], dtype=np.int64)) for sh in shapes]
    total = sum(widths)
    out_shape = shapes[0][:axis] + (sum(sh[axis] for sh in shapes),) + shapes[0][axis + 1:]
    with IRBuilder() as ib:
        with prim_func():
            T.func_name("concat")
            T.func_attr({"tirx.noalias": True})
            ins = [T.arg(f"x{i}", T.buffer(sh, dtype)) for i, sh in enumerate(shapes)]
            out = T.arg("out", T.buffer(out_shape, dtype))
            dst = T.decl_buffer((outer, total), dtype, data=out.data)
            offset = 0
            for src_buf, width in zip(ins, widths):
                src = T.decl_buffer((outer, width), dtype, data=src_buf.data)
                vectors, rest = divmod(width, LANES)
                rows = T.parallel(outer) if outer > 1 else T.serial(outer)
                with rows as o:
                    if vectors:
                        with T.serial(vectors) as v:
                            with T.vectorized(LANES) as lane:
                                at = v * LANES + lane
                                T.buffer_store(dst, src[o, at], [o, offset + at])
                    if rest:
                        with T.vectorized(rest) as lane:
                            at = vectors * LANES + lane
                            T.buffer_store(dst, src[o, at], [o, offset + at])
                offset += width
    return ib.get()


# ----------------------------------------------------------------------------- MEAN
def _normalize_axes(axes, rank: int, op: str) -> tuple[int, ...]:
    """Axes in [0, rank), sorted, duplicates dropped (as TFLite resolves them)."""
    norm = set()
    for a in axes:
        if not -rank <= int(a) < rank:
            raise ValueError(f"{op}: axis {a} is not an axis of a rank-{rank} tensor")
        norm.add(int(a) % rank)
    if not norm:
        raise ValueError(f"{op}: no axis to reduce")
    return tuple(sorted(norm))


def mean_func(in_shape, axes, keepdims: bool, in_q, out_q, dtype: str = "int8", *,
              schedule: bool = True):
    """TFLite's 8-bit MEAN over ``axes`` as a PrimFunc ``(x, out)``; the output has the
    reduced axes as 1 (``keepdims``) or removed. MobileNet's global average pool is
    axes (1, 2) of NHWC, keep_dims true; Keras' GlobalAveragePooling2D gives false."""
    from tvm import te

    in_shape = tuple(int(n) for n in in_shape)
    axes = _normalize_axes(axes, len(in_shape), "MEAN")
    count = int(np.prod([in_shape[a] for a in axes]))
    p = mean_params(count, in_q, out_q, dtype)
    info = np.iinfo(dtype)
    kept = [d for d in range(len(in_shape)) if d not in axes]
    x = te.placeholder(in_shape, dtype, "x")
    rax = {a: te.reduce_axis((0, in_shape[a]), f"r{a}") for a in axes}

    def total(*k):
        where = dict(zip(kept, k))
        idx = tuple(where[d] if d in where else rax[d] for d in range(len(in_shape)))
        return te.sum(x[idx].astype("int32"), axis=list(rax.values()))

    sums = te.compute(tuple(in_shape[d] for d in kept), total, name="sum")
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(in_shape)) if keepdims \
        else tuple(in_shape[d] for d in kept)

    def element(*o):
        k = [o[d] for d in kept] if keepdims else list(o)
        shifted = sums[tuple(k)] - p.in_zp * count  # sum of (x - zp_in); fits int32
        return _requantized(shifted, p.multiplier, p.shift, p.out_zp,
                            (int(info.min), int(info.max)), dtype)

    out = te.compute(out_shape, element, name="mean")
    last_kept = bool(kept) and kept[-1] == len(in_shape) - 1
    return finish_func((x, out), schedule, lambda f: _schedule_mean(f, last_kept))


def _schedule_mean(func, channels_kept: bool):
    """``sum`` computed per vector of channels right where ``mean`` needs it::

        for outer (the kept axes but the channels, fused, parallel):
          for c in channel_block (vectorized): sum[c] = 0
          for reduced axes: for c (vectorized): sum[c] += x[..., c]
          for c (vectorized): mean[c] = clamp(qmuls(sum[c] - zp_in * n) + zp_out)

    Without a kept channel axis (the last axis reduced) the loops stay in order.
    """
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    if not channels_kept:
        return sch.mod["main"]
    loops = sch.get_loops(sch.get_sblock("mean"))  # [..., c], unit loops for keep_dims
    co, ci = sch.split(loops[-1], [None, channel_block(int(sch.get(loops[-1]).extent))])
    outer = sch.fuse(*loops[:-1], co)
    if int(sch.get(outer).extent) > 1:
        sch.parallel(outer)
    _reduce_at(sch, sch.get_sblock("sum"), outer)
    sch.vectorize(ci)
    return sch.mod["main"]


def _reduce_at(sch, block, loop):
    """Compute reduction ``block`` under ``loop`` (of its consumer) with the reduction loops
    outside and its channel loop innermost and vectorized::

        for reduction loops: for channels (vectorized): acc = (first ? 0 : acc) + ...

    The init stays in the block (its test is on the outer loops, so the vector loop keeps
    one branch per reduction step): TVM vectorizes a reduction block only with its init.
    """
    sch.compute_at(block, loop, preserve_unit_loops=True)
    n_red = sum(1 for iv in sch.get(block).iter_vars if iv.iter_type == iv.CommReduce)
    loops = sch.get_loops(block)
    channel, red = loops[-1 - n_red], loops[-n_red:]
    sch.reorder(*red, channel)
    sch.vectorize(channel)


# ----------------------------------------------------------------------------- AVERAGE_POOL_2D
def _rounded_average(acc, count, count_max: int):
    """TFLite's ``acc > 0 ? (acc + count/2) / count : (acc - count/2) / count`` (C division)
    without a division: ``sign(acc) * qmuls(|acc|, R, 31, 1)`` with ``R = ceil(2**30 / count)``.

    Why it is exact. TFLite's magnitude ``floor((u + floor(count/2)) / count)``, u = |acc|,
    is u / count rounded half up (for odd counts u / count is never a tie). The qmuls is
    ``SRDHM(2u, R) = floor(u * R / 2**30 + 1/2)``. Write ``R * count = 2**30 + r`` with
    0 <= r < count: ``u * R / 2**30 = u / count + d``, ``d = u * r / (count * 2**30)``.
    ``u / count + 1/2`` is a multiple of 1/(2 count), so adding d does not change its floor
    as long as d < 1/(2 count), i.e. ``u * r < 2**29``. With 8-bit inputs u <= 255 * count,
    so ``count <= 1024`` (``POOL_MAX_WINDOW``) is enough. One scalar R per output pixel
    (a constant when no window crosses the border); the rest is sqrdmulh on int32 lanes.
    A larger window (a global pool over more than 32x32 pixels; found by scripts/fuzz.py)
    divides as TFLite does, one integer division per lane: slower, as exact.
    """
    from tvm import tirx

    from tvm_armq.intrinsics.qmuls import qmuls

    if count_max > POOL_MAX_WINDOW:
        half = tirx.truncdiv(count, 2)
        return tirx.Select(acc > 0, tirx.truncdiv(acc + half, count),
                           tirx.truncdiv(acc - half, count))
    one = 1 << POOL_RECIPROCAL_BITS
    recip = (one + count - 1) // count  # ceil(2**30 / count), Q0.30
    # qmuls reads R as Q0.31, so R / 2 really: the left shift by 1 makes up for it
    q = qmuls(tirx.abs(acc), recip, Q31, Q31 - POOL_RECIPROCAL_BITS)
    return tirx.Select(acc > 0, q, -q)


def avg_pool_func(in_shape, pool, strides, padding, act_range=None, dtype: str = "int8", *,
                  schedule: bool = True):
    """TFLite's 8-bit AVERAGE_POOL_2D of an NHWC tensor as a PrimFunc ``(x, out)``.

    ``pool`` = (kh, kw), ``strides`` = (sh, sw), ``padding`` = (top, left, bottom, right)
    (``window.same_padding`` for SAME, zeros for VALID), ``act_range`` = the fused
    activation's (lo, hi) or None. Input and output share their quantization (TFLite's
    requirement), so no quantization parameter is needed.
    """
    from tvm import te, tirx

    from .window import output_size

    info = _dtype(dtype, "AVERAGE_POOL_2D")
    lo, hi = _act_range(act_range, info, "AVERAGE_POOL_2D")
    if len(in_shape) != 4:
        raise ValueError(f"AVERAGE_POOL_2D: the input must be NHWC, got shape {tuple(in_shape)}")
    n, h, w, c = (int(v) for v in in_shape)
    (kh, kw), (sh, sw) = pool, strides
    pt, pl, pb, pr = padding
    oh, ow = output_size(h, kh, sh, 1, pt, pb), output_size(w, kw, sw, 1, pl, pr)
    if oh < 1 or ow < 1:
        raise ValueError(f"AVERAGE_POOL_2D: {in_shape} with pool {pool}, strides {strides}, "
                         f"padding {padding} has an empty output")

    def extent(o, stride, k, pad, size):  # input pixels of window o along one axis
        start = o * stride - pad
        return min(start + k, size) - max(start, 0)

    if min(extent(o, sh, kh, pt, h) for o in range(oh)) < 1 or \
            min(extent(o, sw, kw, pl, w) for o in range(ow)) < 1:
        raise ValueError(f"AVERAGE_POOL_2D: padding {padding} leaves a window with no input "
                         "pixel (TFLite fails on it)")
    # Which borders a window can cross: only those get a bounds test.
    top, left = pt > 0, pl > 0
    bottom, right = (oh - 1) * sh - pt + kh > h, (ow - 1) * sw - pl + kw > w
    x = te.placeholder((n, h, w, c), dtype, "x")
    ky, kx = te.reduce_axis((0, kh), "ky"), te.reduce_axis((0, kw), "kx")

    def window_sum(b, y, xo, ch):
        iy, ix = y * sh + ky - pt, xo * sw + kx - pl
        tests = ([iy >= 0] if top else []) + ([iy < h] if bottom else []) + \
            ([ix >= 0] if left else []) + ([ix < w] if right else [])
        v = x[b, iy, ix, ch].astype("int32")
        if tests:  # if_then_else does not read the input outside the test
            v = tirx.if_then_else(tirx.all(*tests), v, tirx.const(0, "int32"))
        return te.sum(v, axis=[ky, kx])

    acc = te.compute((n, oh, ow, c), window_sum, name="acc")

    def count_along(o, stride, k, pad, size, before, after):
        start = o * stride - pad
        end = tirx.min(start + k, size) if after else start + k
        return end - (tirx.max(start, 0) if before else start)

    def element(b, y, xo, ch):
        if top or bottom or left or right:
            count = (count_along(y, sh, kh, pt, h, top, bottom)
                     * count_along(xo, sw, kw, pl, w, left, right))
        else:
            count = kh * kw
        return _clamp_cast(_rounded_average(acc[b, y, xo, ch], count, kh * kw), lo, hi, dtype)

    out = te.compute((n, oh, ow, c), element, name="avg_pool")
    return finish_func((x, out), schedule, _schedule_pool)


def _schedule_pool(func):
    """Rows in parallel; per output pixel and vector of channels, the window sum in
    registers (taps outside, channels vectorized), then the rounded average::

        for n, oh (fused, parallel): for ow: for channel vectors:
          for ky, kx: for c (vectorized): acc[c] = (first ? 0 : acc[c]) + x[n, ih, iw, c]
          for c (vectorized): out[c] = clamp(sign(acc) * qmuls(|acc|, R, 31, 1))
    """
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    b, y, xo, ch = sch.get_loops(sch.get_sblock("avg_pool"))
    co, ci = sch.split(ch, [None, channel_block(int(sch.get(ch).extent))])
    rows = sch.fuse(b, y)
    if int(sch.get(rows).extent) > 1:
        sch.parallel(rows)
    _reduce_at(sch, sch.get_sblock("acc"), co)
    sch.vectorize(ci)
    return sch.mod["main"]
