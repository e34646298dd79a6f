"""``qmuls``: TFLite's requantization as one TIR operator, lowered to sqrdmulh + srshl on aarch64.

What it computes
----------------
``qmuls(x, m, q, s)`` multiplies the int32 ``x`` by the fixed-point number ``m`` (an int32
with ``q`` fractional bits, i.e. the real value ``m / 2**q``) and then shifts the result by
``s`` bits with rounding (``s < 0`` shifts right). Only ``q = 31`` (TFLite's Q0.31
multipliers) is accepted; any other ``q`` is rejected with an error. With ``q = 31`` the
result is bit for bit TFLite's

    MultiplyByQuantizedMultiplier(x, m, s)          # m, s from QuantizeMultiplier(scale)

which approximates ``round(x * scale)`` for ``scale = m * 2**(s - 31)``. It is the last step of
every quantized TFLite convolution, dense layer and depthwise convolution: the int32
accumulator times ``in_scale * w_scale / out_scale``, in integers only.

Two rounding modes, as TFLite has (``rounding=``; the NumPy references are in ``requant``):

* ``"double"`` (the default; TFLite's reference kernels, which tvm_armq is checked against,
  use it: ``tests/test_qmuls.py`` shows it on a real model)::

      a = x * 2**max(s, 0)                     int32, wraps like TFLite's x * (1 << s)
      h = round_half_up(a * m / 2**31)         SaturatingRoundingDoublingHighMul
      r = round_half_away(h / 2**max(-s, 0))   RoundingDivideByPOT

  The product is rounded once to 32 bits and then once more by the shift. Why twice:
  gemmlowp designed the scheme for NEON, where each step is one instruction (``sqrdmulh``,
  then a rounding shift). The result is not always the correctly rounded ``x * scale``
  (near a tie it can land one step off), but a quantized model means whatever arithmetic
  its runtime performs, so qmuls reproduces it exactly, double rounding included.

* ``"single"`` (TFLite built with ``TFLITE_SINGLE_ROUNDING``; LiteRT's default XNNPACK path
  matched this one, not double rounding, on the zoo's convolutions)::

      r = int32((x * m + 2**(30 - s)) >> (31 - s))    in int64: one rounding, half up

Shifts: ``s`` in [-31, 31] for double rounding and [-31, 30] for single rounding (what
TFLite's arithmetic is defined for; ``requant.quantize_multiplier`` says which shifts real
scales give). A constant ``s`` outside is an error; a run-time ``s`` outside gives an
unspecified value.

How it is lowered
-----------------
``qmuls`` is a TIR operator of its own, registered from Python (TVM 0.27 creates an ``Op``
the first time an attribute is registered under a new name, ``tvm.ir.register_op_attr``):

* ``tvm_armq.qmuls`` (double) and ``tvm_armq.qmuls_single`` (single), each with
  ``TCallEffectKind = Pure`` (so passes may move, merge or drop it) and
  ``TVectorizable = True`` (so ``T.vectorized`` loops turn it into one call on int32xN);
* a ``default.FLowerIntrinsic`` rule (``tvm.tirx.register_intrin_lowering(op, "default")``):
  64-bit integer arithmetic in plain TIR, correct on every target (x86 llvm, c, ...);
* an ``llvm.aarch64.FLowerIntrinsic`` rule. The ``LowerIntrin`` pass tries
  ``<kind>.FLowerIntrinsic``, then ``<kind>.aarch64.FLowerIntrinsic`` only when the target's
  ``mtriple`` contains ``aarch64``, then ``default.FLowerIntrinsic``; a rule that returns the
  call unchanged passes it on to the next. So x86 never sees the aarch64 form (nor does an
  ``arm64-apple-*`` triple, which gets the correct but slower default form), and the aarch64
  rule can decline (lanes it does not handle, or ``portable_lowering()``), leaving the call
  to the default rule. Rules see only the call, not the target: the mtriple test inside
  ``LowerIntrin`` is the only way a rule is chosen per target.

The aarch64 form of double rounding, one int32x4 register per operand::

    lane           0        1        2        3
    x         [   x0   |   x1   |   x2   |   x3   ]   int32 accumulators
    m         [   m0   |   m1   |   m2   |   m3   ]   Q0.31 multipliers (per channel, or a splat)
    s         [   s0   |   s1   |   s2   |   s3   ]   shifts (per channel, or a splat)
       a = x << max(s, 0)                  ushl     (omitted when s <= 0: a constant, or
                                                     bounded, e.g. s = min(shift, 0))
       h = sqrdmulh(a, m)                  sqrdmulh  = sat((2*a*m + 2**31) >> 32), half up
       f = (h & min(s, 0)) >> 31           and, sshr = -1 in lanes with h < 0 and s < 0
                                           (h >> 31 alone when s < 0 is known: ssra)
       r = srshl(h + f, min(s, 0))         srshl     = (h + f + 2**(e-1)) >> e, e = -min(s, 0)

``srshl`` rounds ties up; subtracting one from negative lanes first turns that into TFLite's
ties-away-from-zero (gemmlowp's NEON fixup). ``h + f`` cannot overflow: ``sqrdmulh``
returns INT32_MIN only for ``a * m < -2**62 + 2**30``, and int32 operands go no lower than
``-2**62 + 2**31`` (their one product of 2**62 saturates to INT32_MAX instead), so a plain
add does what gemmlowp's saturating add does. Scalars use the scalar forms
(``sqrdmulh s``, then ``srshl d`` on the sign-extended value); int32x2 uses the 64-bit
registers; int32x(4k) is cut into int32x4 pieces, since LLVM cannot split these intrinsics
itself. Single rounding on aarch64 is one rounding shift of the exact 64-bit product:
``smull``/``smull2`` then ``srshl`` on int64x2 by ``s - 31`` and a narrowing ``uzp1``.

Use it from TIR as ``qmuls(x, m, 31, s)`` (also inside ``@T.prim_func``) or as
``T.call_intrin("int32", "tvm_armq.qmuls", x, m, 31, s)`` once this module is imported.

Requantization under a ReLU floor: ``qmuls_relu``
-------------------------------------------------
``qmuls_relu(x, m, 31, s) = max(qmuls(x, m, 31, s), 0)`` (double rounding), op
``tvm_armq.qmuls_relu``. Under that floor the ties-away fixup is not needed: for h < 0
both roundings of ``h / 2**e`` give a result <= 0, which the floor makes 0, and for h >= 0
they agree. So its aarch64 form is sqrdmulh, srshl, smax with zero: one instruction per
int32x4 fewer than qmuls and a clamp. ``requantize`` uses it where the output clamp's
floor is at or above the output zero point (fused ReLU and ReLU6 put it exactly there),
since every negative qmuls result lands on the floor then.

The int8 output step: ``requantize_narrow``
--------------------------------------------
``requantize_narrow(x, m, s, zp, lo, hi)`` = ``clamp(qmuls(x, m, 31, s) + zp, lo, hi)`` as
int8 (op ``tvm_armq.requantize_narrow``), the last step of every int8 kernel. Where the
shift's range is known (``bounded_shift`` with both bounds, at most 7 apart, all right
shifts) and the vector is whole int32x4 registers, aarch64 narrows first and finishes on
16-bit lanes (``_aarch64_narrow``, ``_narrow_split``): half the cost of ``srshl`` and the
clamp on int32 lanes in the A72, N1 and N2 models. Elsewhere it is ``requantize`` and a cast.
"""

from __future__ import annotations

import contextlib
import contextvars

from tvm import tirx
from tvm.ir import Op, register_op_attr
from tvm.tirx import Broadcast, Cast, IntImm, Shuffle
from tvm.tirx.expr import CallEffectKind

from . import requant
from .requant import INT32_MAX, MAX_SHIFT, MIN_SHIFT, check_rounding

OP_NAMES = {"double": "tvm_armq.qmuls", "single": "tvm_armq.qmuls_single"}
RELU_OP = "tvm_armq.qmuls_relu"  # max(qmuls(x, m, 31, s), 0), double rounding
ROUNDING_OF_OP = {**{name: mode for mode, name in OP_NAMES.items()}, RELU_OP: "double"}
Q31 = 31  # fractional bits of TFLite's multipliers: m represents m / 2**31
NEON_INT32_LANES = 4  # int32 lanes in one 128-bit NEON register
NEON_INT64_LANES = 2  # int64 lanes in one 128-bit NEON register
HALF_Q31 = 1 << (Q31 - 1)  # 0.5 in Q0.31: the rounding term of the doubling high multiply
SIGN_BIT = 31  # arithmetic shift right by this spreads an int32's sign over all bits
SIGN_BIT_64 = 63  # the same for an int64

SQRDMULH = "llvm.aarch64.neon.sqrdmulh"
SRSHL = "llvm.aarch64.neon.srshl"
SQSHRN = "llvm.aarch64.neon.sqshrn"  # saturating narrow by an immediate right shift
SQXTN = "llvm.aarch64.neon.sqxtn"  # saturating narrow
SQRSHRN = "llvm.aarch64.neon.sqrshrn"  # saturating narrow by an immediate rounding shift
SQADD = "llvm.aarch64.neon.sqadd"

# clamp(qmuls(x, m, 31, s) + zp, lo, hi) as int8
REQUANT_NARROW_OP = "tvm_armq.requantize_narrow"
INT16_LANES = 8  # int16 lanes in one 128-bit NEON register
NARROW_SHIFT_MAX = 16  # sqshrn's immediate from int32 to int16: 1..16
NARROW_SHIFT_SPREAD = 7  # the most an int16 lane is rounded right after its saturating narrow
INT8_MIN, INT8_MAX = -128, 127

_portable = contextvars.ContextVar("tvm_armq_qmuls_portable", default=False)


@contextlib.contextmanager
def portable_lowering():
    """Within this block, ``tvm.compile`` lowers qmuls by the 64-bit default rule on aarch64 too.

    The aarch64 rule declines, so the default rule takes the call: a way to run both
    lowerings of the same code on one device and compare them.
    """
    token = _portable.set(True)
    try:
        yield
    finally:
        _portable.reset(token)


# ----------------------------------------------------------------------------- helpers
def _dtype(e):
    return e.ty.dtype


def lanes_of(e) -> int:
    """The lane count of a TIR expression (1 for a scalar)."""
    return int(_dtype(e).lanes)


def _vec(base: str, lanes: int) -> str:
    return base if lanes == 1 else f"{base}x{lanes}"


def _const(value: int, base: str, lanes: int):
    return tirx.const(value, _vec(base, lanes))


def _const_int(e) -> int | None:
    """The value of an integer constant or of a splat of one; None for anything else."""
    if isinstance(e, Broadcast):
        e = e.value
    return int(e.value) if isinstance(e, IntImm) else None


def _to_int32(e, lanes: int, what: str):
    """``e`` as an int32 expression of ``lanes`` lanes (a Python int becomes a constant)."""
    if isinstance(e, int):
        return _const(e, "int32", lanes)
    d = _dtype(e)
    if str(d.with_lanes(1)) != "int32":
        raise TypeError(f"qmuls: {what} must be int32, got {d}")
    n = int(d.lanes)
    if n == lanes:
        return e
    if n == 1:
        return Broadcast(e, lanes)
    raise TypeError(f"qmuls: {what} has {n} lanes where x has {lanes}")


def _check_q(q) -> None:
    value = q if isinstance(q, int) else _const_int(q)
    if value != Q31:
        raise ValueError(f"qmuls supports Q0.31 multipliers only (q = {Q31}, TFLite's format), "
                         f"got q = {q}")


def _check_constant_shift(s, rounding: str) -> None:
    k = _const_int(s)
    if k is not None and not MIN_SHIFT <= k <= MAX_SHIFT[rounding]:
        raise ValueError(f"qmuls: shift {k} is outside [{MIN_SHIFT}, {MAX_SHIFT[rounding]}], "
                         f"where {rounding} rounding is defined")


# ----------------------------------------------------------------------------- builder
def qmuls(x, m, q, s, rounding: str = "double"):
    """TIR expression for TFLite's ``MultiplyByQuantizedMultiplier(x, m, s)`` (see the module).

    ``x``: int32 expression (scalar or int32xN); ``m``: Q0.31 multiplier and ``s``: shift,
    int32 expressions or Python ints, scalar (broadcast) or with ``x``'s lanes; ``q``: must
    be 31; ``rounding``: ``"double"`` (TFLite's default) or ``"single"``.
    """
    check_rounding(rounding)
    _check_q(q)
    if isinstance(x, int):
        x = _const(x, "int32", 1)
    lanes = lanes_of(x)
    x = _to_int32(x, lanes, "x")
    m = _to_int32(m, lanes, "the multiplier m")
    s = _to_int32(s, lanes, "the shift s")
    _check_constant_shift(s, rounding)
    return tirx.call_intrin(_vec("int32", lanes), OP_NAMES[rounding], x, m,
                            IntImm("int32", Q31), s)


def qmuls_relu(x, m, q, s):
    """TIR expression for ``max(qmuls(x, m, q, s), 0)`` with double rounding (see the
    module: the ties-away fixup is not needed under the floor). Arguments as ``qmuls``."""
    call = qmuls(x, m, q, s, "double")
    return tirx.call_intrin(call.ty.dtype, RELU_OP, *call.args)


def requantize(x, m, s, out_zp: int, lo: int, hi: int, rounding: str = "double"):
    """``clamp(qmuls(x, m, 31, s) + out_zp, lo, hi)`` as int32: every quantized kernel's
    output step. With double rounding and a floor at or above the zero point (a fused
    ReLU or ReLU6: ``lo == out_zp``), a negative qmuls result always lands on ``lo``, so
    ``qmuls_relu`` takes qmuls' place and the floor is left out when it is the zero
    point itself: the same values, one instruction per int32x4 fewer."""
    if rounding == "double" and lo >= out_zp:
        r = qmuls_relu(x, m, Q31, s) + out_zp  # >= out_zp
        r = tirx.min(r, hi)
        return tirx.max(r, lo) if lo > out_zp else r
    r = qmuls(x, m, Q31, s, rounding) + out_zp
    return tirx.max(tirx.min(r, hi), lo)


def requantize_narrow(x, m, s, out_zp: int, lo: int, hi: int):
    """``requantize(x, m, s, out_zp, lo, hi)`` (double rounding) narrowed to int8, as one
    op (``REQUANT_NARROW_OP``): the same values. On aarch64, in whole int32x4 registers and
    with the shift's range known (``bounded_shift`` with both bounds), the rounding shift,
    the zero point and the clamp run on 16-bit lanes after a saturating narrow
    (``_aarch64_narrow``); otherwise it is ``requantize`` and a cast."""
    call = qmuls(x, m, Q31, s)  # checks and broadcasts the operands
    x, m, _, s = call.args
    return tirx.call_intrin(_vec("int8", lanes_of(x)), REQUANT_NARROW_OP, x, m, s,
                            *(IntImm("int32", int(v)) for v in (out_zp, lo, hi)))


def bounded_shift(s, max_shift: int | None, min_shift: int | None = None):
    """The shift ``s`` with compile-time facts written into it: every value it takes is at
    most ``max_shift`` (and at least ``min_shift``). It becomes ``min(s, max_shift)``
    (``max(min(s, max_shift), min_shift)``), which equals ``s`` for those values and whose
    bounds the aarch64 lowering reads (``_shift_bounds``): at most 0, no left shift; at
    most -1, a cheaper rounding fixup; both bounds within ``NARROW_SHIFT_SPREAD``, the int8
    narrowing of ``requantize_narrow``. ``None`` or a bound above 0 changes nothing. A func
    built so must only be given such shifts (its ``pack_params`` checks)."""
    if max_shift is None or max_shift > 0:
        return s
    s = tirx.min(s, max_shift)
    return s if min_shift is None else tirx.max(s, min_shift)


def _operands(call):
    """(rounding, x, m, s, lanes) of a qmuls call, m and s broadcast to x's lanes."""
    rounding = ROUNDING_OF_OP[call.op.name]
    if len(call.args) != 4:
        raise ValueError(f"{call.op.name} takes (x, m, q, s), got {len(call.args)} arguments")
    x, m, q, s = call.args
    _check_q(q)
    lanes = lanes_of(call)
    _check_constant_shift(s, rounding)
    return (rounding, _to_int32(x, lanes, "x"), _to_int32(m, lanes, "the multiplier m"),
            _to_int32(s, lanes, "the shift s"), lanes)


# ----------------------------------------------------------- default (64-bit) lowering
def _portable_double(x, m, s, lanes: int):
    i64 = _vec("int64", lanes)
    k = _const_int(s)
    if k is not None:  # a constant shift folds into immediates
        left, right = max(k, 0), max(-k, 0)
        a = x << _const(left, "int32", lanes) if left else x
    else:
        zero = _const(0, "int32", lanes)
        left, right = tirx.max(s, zero), tirx.max(zero - s, zero)
        a = x << left  # int32 shift: wraps exactly as TFLite's x * (1 << left_shift)
    # SaturatingRoundingDoublingHighMul: |a * m| <= 2**62 fits int64; rounding half up is
    # (a*m + 2**30) >> 31, and only a == m == INT32_MIN reaches 2**31, clamped to INT32_MAX.
    ab = Cast(i64, a) * Cast(i64, m)
    h = tirx.min((ab + _const(HALF_Q31, "int64", lanes)) >> _const(Q31, "int64", lanes),
                 _const(INT32_MAX, "int64", lanes))
    # RoundingDivideByPOT in 64 bits, where nothing overflows: add half of 2**right, and one
    # less for negative values, so that ties go away from zero; then shift.
    negative = h >> _const(SIGN_BIT_64, "int64", lanes)  # -1 for h < 0, else 0
    if k is not None:
        if right == 0:
            return Cast(_vec("int32", lanes), h)
        rounded = h + _const(1 << (right - 1), "int64", lanes) + negative
        return Cast(_vec("int32", lanes), rounded >> _const(right, "int64", lanes))
    right64 = Cast(i64, right)
    one = _const(1, "int64", lanes)
    half = (one << right64) >> one  # 0 when right == 0: no rounding, no fixup
    fixup = tirx.Select(right64 > _const(0, "int64", lanes), negative,
                        _const(0, "int64", lanes))
    return Cast(_vec("int32", lanes), (h + half + fixup) >> right64)


def _portable_single(x, m, s, lanes: int):
    i64 = _vec("int64", lanes)
    k = _const_int(s)
    product = Cast(i64, x) * Cast(i64, m)  # exact: |x * m| <= 2**62
    if k is not None:
        total = Q31 - k  # in [1, 62]
        rounder = _const(1 << (total - 1), "int64", lanes)
        shifted = (product + rounder) >> _const(total, "int64", lanes)
    else:
        total = _const(Q31, "int64", lanes) - Cast(i64, s)
        one = _const(1, "int64", lanes)
        shifted = (product + (one << (total - one))) >> total
    return Cast(_vec("int32", lanes), shifted)  # truncation, as TFLite's static_cast<int32_t>


def _floor_zero(e, lanes: int):
    return tirx.max(e, _const(0, "int32", lanes))


def lower_portable(call):
    """``default.FLowerIntrinsic`` of qmuls: plain TIR over int64, for any target and lanes."""
    rounding, x, m, s, lanes = _operands(call)
    if rounding == "single":
        return _portable_single(x, m, s, lanes)
    r = _portable_double(x, m, s, lanes)
    return _floor_zero(r, lanes) if call.op.name == RELU_OP else r


# ------------------------------------------------------------------ aarch64 lowering
def _llvm(dtype: str, name: str, *args):
    return tirx.call_llvm_pure_intrin(dtype, name, *args)


def _shift_bounds(s) -> tuple[int, int]:
    """The smallest and largest values the shift expression ``s`` can take, by TVM's bound
    analysis: a func that knows its layer's shifts writes ``min(shift[c], bound)`` (see
    ``conv2d_gemm_te``'s ``max_shift``), and the lowering then leaves out what cannot occur."""
    from tvm.sym.analyzer import Analyzer

    b = Analyzer().const_int_bound(s)
    return int(b.min_value), int(b.max_value)


def _shift_max(s) -> int:
    """The largest value the shift expression ``s`` can take (``_shift_bounds``)."""
    return _shift_bounds(s)[1]


def _aarch64_double(x, m, s, lanes: int, s_max: int = MAX_SHIFT["double"],
                    relu: bool = False):
    """sqrdmulh + srshl with the ties-away fixup; lanes is 1, 2 or 4. ``s_max`` bounds a
    run-time shift: <= 0, no left shift (ushl); <= -1, the fixup is h's sign alone.
    ``relu``: the result floored at 0, and no fixup (it only moves negative ties)."""
    i32 = _vec("int32", lanes)
    k = _const_int(s)
    if k is not None:
        a = x << _const(k, "int32", lanes) if k > 0 else x
        right_neg = _const(min(k, 0), "int32", lanes)
    elif s_max <= 0:
        a, right_neg = x, s
    else:
        zero = _const(0, "int32", lanes)
        a = x << tirx.max(s, zero)
        right_neg = tirx.min(s, zero)  # srshl shifts right by minus this, rounding
    h = _llvm(i32, SQRDMULH, a, m)
    if k is not None and k >= 0:
        return _floor_zero(h, lanes) if relu else h  # no right shift, no second rounding
    if relu:
        rounded = h  # under the floor, negative ties may round either way
    else:
        sign = _const(SIGN_BIT, "int32", lanes)
        # -1 in the lanes to round away from zero (h < 0 and a real right shift), else 0.
        # For a constant negative shift the mask is all ones in its sign bit: h's sign.
        rounded = h + (h >> sign if k is not None or s_max < 0 else (h & right_neg) >> sign)
    if lanes == 1:  # srshl has no 32-bit scalar form: use the 64-bit one, exact here
        r = Cast("int32", _llvm("int64", SRSHL, Cast("int64", rounded),
                                Cast("int64", right_neg)))
    else:
        r = _llvm(i32, SRSHL, rounded, right_neg)
    return _floor_zero(r, lanes) if relu else r


def _aarch64_single(x, m, s, lanes: int, s_max: int = MAX_SHIFT["single"]):
    """One rounding shift of the exact product: smull, srshl on int64 by s - 31, narrow."""
    i64 = _vec("int64", lanes)
    product = Cast(i64, x) * Cast(i64, m)
    k = _const_int(s)
    amount = (_const(k - Q31, "int64", lanes) if k is not None
              else Cast(i64, s) - _const(Q31, "int64", lanes))  # in [-62, -1]: right shifts
    if lanes in (1, NEON_INT64_LANES):  # one register: the scalar d or the int64x2 form
        return Cast(_vec("int32", lanes), _llvm(i64, SRSHL, product, amount))
    # int64x4 is two registers, and LLVM cannot split the intrinsic: shift each half.
    halves = []
    for start in range(0, lanes, NEON_INT64_LANES):
        idx = [IntImm("int32", start + i) for i in range(NEON_INT64_LANES)]
        halves.append(_llvm(_vec("int64", NEON_INT64_LANES), SRSHL,
                            take_lanes(product, idx), take_lanes(amount, idx)))
    whole = Shuffle(halves, [IntImm("int32", i) for i in range(lanes)])
    return Cast(_vec("int32", lanes), whole)  # narrowing: uzp1, TFLite's static_cast


def take_lanes(e, idx):
    """Lanes ``idx`` of vector ``e`` (a splat stays a splat)."""
    if isinstance(e, Broadcast):
        return Broadcast(e.value, len(idx))
    return Shuffle([e], idx)


def lane_range(start: int, count: int) -> list:
    """Lane indices start .. start + count - 1 (for ``take_lanes``)."""
    return [IntImm("int32", start + i) for i in range(count)]


def join_lanes(pieces: list):
    """Vectors one after another as one vector: a lowering's register-sized pieces joined
    back into the lanes of the call (one piece is itself)."""
    if len(pieces) == 1:
        return pieces[0]
    return Shuffle(pieces, lane_range(0, sum(lanes_of(p) for p in pieces)))


def lower_aarch64(call):
    """``llvm.aarch64.FLowerIntrinsic`` of qmuls; returns ``call`` itself to decline."""
    if _portable.get():
        return call
    rounding, x, m, s, lanes = _operands(call)
    if call.op.name == RELU_OP:
        def body(x, m, s, lanes, s_max):
            return _aarch64_double(x, m, s, lanes, s_max, relu=True)
    else:
        body = _aarch64_double if rounding == "double" else _aarch64_single
    s_max = _shift_max(s)
    if lanes in (1, 2, NEON_INT32_LANES):
        return body(x, m, s, lanes, s_max)
    if lanes % NEON_INT32_LANES:
        return call  # odd vector widths: the default rule handles them
    # LLVM cannot split an int32x8 sqrdmulh: do one int32x4 register at a time.
    pieces = []
    for start in range(0, lanes, NEON_INT32_LANES):
        idx = lane_range(start, NEON_INT32_LANES)
        pieces.append(body(take_lanes(x, idx), take_lanes(m, idx), take_lanes(s, idx),
                           NEON_INT32_LANES, s_max))
    return join_lanes(pieces)


# ------------------------------------------------------ requantize_narrow (int8 result)
def _narrow_operands(call):
    x, m, s, zp, lo, hi = call.args
    return x, m, s, int(zp.value), int(lo.value), int(hi.value)


def lower_narrow_portable(call):
    """``default.FLowerIntrinsic`` of requantize_narrow: ``requantize`` and a cast (its qmuls
    calls are lowered in turn)."""
    x, m, s, zp, lo, hi = _narrow_operands(call)
    return Cast(call.ty.dtype, requantize(x, m, s, zp, lo, hi))


def _narrow_split(r_min: int, r_max: int) -> int | None:
    """k for the int8 narrowing of right shifts in [r_min, r_max], or None: the int32
    value is shifted right by k (truncating, k <= r_min - 1, so the rounding bits stay)
    and saturated to int16, and the rest of each lane's shift, r - k, is a rounding shift
    of the int16 value. A saturated lane (|v >> k| >= 2**15) then gives at least 256 in
    magnitude after the rest (r - k <= NARROW_SHIFT_SPREAD), beyond any zero point and clamp,
    as the exact value does."""
    if r_min < 1:
        return None
    k = min(r_min - 1, NARROW_SHIFT_MAX)
    return k if r_max - k <= NARROW_SHIFT_SPREAD else None


def _aarch64_narrow(x, m, s, zp: int, lo: int, hi: int, lanes: int, k: int, uniform: int | None):
    """sqrdmulh (+ the ties-away fixup unless under a ReLU floor) per int32x4; then per
    int16x8 (or int16x4, for a vector of 4 lanes) either (one right shift r for every lane,
    ``uniform``, 1 <= r <= 16) a saturating rounding narrow by r (sqrshrn), or a
    saturating narrow by k (sqshrn, or sqxtn for k = 0) and a rounding shift right by
    r - k (srshl by the lane's shift + k); the zero point, a saturating narrow to int8;
    then the clamp on int8 lanes. Values: ``_narrow_split``. A 4-lane vector narrows its
    int16x4 doubled to int16x8 (sqxtn reads one whole register: no other register's lanes
    enter, as they would through LLVM's uzp1 of an undefined half)."""
    group = INT16_LANES if lanes % INT16_LANES == 0 else NEON_INT32_LANES
    i16 = _vec("int16", group)
    i16x4 = _vec("int16", NEON_INT32_LANES)
    relu = lo >= zp
    parts = []
    for start in range(0, lanes, group):
        narrow = []
        for piece in range(start, start + group, NEON_INT32_LANES):
            idx = [IntImm("int32", piece + i) for i in range(NEON_INT32_LANES)]
            h = _llvm(_vec("int32", NEON_INT32_LANES), SQRDMULH, take_lanes(x, idx),
                      take_lanes(m, idx))
            if not relu:  # -1 in negative lanes: the ties-up rounding becomes ties away
                h = h + (h >> _const(SIGN_BIT, "int32", NEON_INT32_LANES))
            if uniform is not None:
                narrow.append(_llvm(i16x4, SQRSHRN, h, IntImm("int32", uniform)))
            elif k:
                narrow.append(_llvm(i16x4, SQSHRN, h, IntImm("int32", k)))
            else:
                narrow.append(_llvm(i16x4, SQXTN, h))
        y = narrow[0] if group == NEON_INT32_LANES else \
            Shuffle(narrow, [IntImm("int32", i) for i in range(group)])
        if uniform is None:
            idx = [IntImm("int32", start + i) for i in range(group)]
            rest = Cast(i16, take_lanes(s, idx) + _const(k, "int32", group))  # -(r - k)
            y = _llvm(i16, SRSHL, y, rest)
        y = _llvm(i16, SQADD, y, _const(zp, "int16", group))  # saturated lanes stay so
        if group == NEON_INT32_LANES:
            y = Shuffle([y, y], [IntImm("int32", i) for i in range(INT16_LANES)])
        narrowed = _llvm(_vec("int8", INT16_LANES), SQXTN, y)
        if hi < INT8_MAX:
            narrowed = tirx.min(narrowed, _const(hi, "int8", INT16_LANES))
        if lo > INT8_MIN:
            narrowed = tirx.max(narrowed, _const(lo, "int8", INT16_LANES))
        if group == NEON_INT32_LANES:  # its 4 bytes as one int32: LLVM widens an int8x4
            word = Shuffle([tirx.reinterpret("int32x2", narrowed)], [IntImm("int32", 0)])
            narrowed = tirx.reinterpret(_vec("int8", group), word)
        parts.append(narrowed)
    return parts[0] if len(parts) == 1 else \
        Shuffle(parts, [IntImm("int32", i) for i in range(lanes)])


def lower_narrow_aarch64(call):
    """``llvm.aarch64.FLowerIntrinsic`` of requantize_narrow: ``_aarch64_narrow`` for vectors of
    whole int32x4 registers and shifts whose range ``_narrow_split`` accepts; else ``call``
    itself (to the default rule)."""
    if _portable.get():
        return call
    x, m, s, zp, lo, hi = _narrow_operands(call)
    lanes = lanes_of(call)
    if lanes % NEON_INT32_LANES:
        return call
    s_min, s_max = _shift_bounds(s)
    k = _narrow_split(-s_max, -s_min)
    if k is None:
        return call
    uniform = -s_max if s_min == s_max and -s_max <= NARROW_SHIFT_MAX else None
    return _aarch64_narrow(x, m, s, zp, lo, hi, lanes, k, uniform)


# ------------------------------------------------------------------- registration
def register_lowered_op(name: str, lower_default, lower_aarch64_rule) -> None:
    """Create the pure, vectorizable TIR op ``name`` with its ``default`` and
    ``llvm.aarch64`` lowering rules (see the module); a second call changes nothing."""
    if name in Op.list_op_names() and Op.get(name).has_attr("TCallEffectKind"):
        return
    register_op_attr(name, "TCallEffectKind", CallEffectKind.Pure.value)
    register_op_attr(name, "TVectorizable", True)
    register_op_attr(name, "TScriptPrinterName", name)
    tirx.register_intrin_lowering(name, "default", f=lower_default)
    tirx.register_intrin_lowering(name, "llvm.aarch64", f=lower_aarch64_rule)


def _register() -> None:
    """Create the ops and their lowering rules."""
    for name in (*OP_NAMES.values(), RELU_OP):
        register_lowered_op(name, lower_portable, lower_aarch64)
    register_lowered_op(REQUANT_NARROW_OP, lower_narrow_portable, lower_narrow_aarch64)


_register()

__all__ = ["qmuls", "qmuls_relu", "requantize", "requantize_narrow", "REQUANT_NARROW_OP",
           "RELU_OP", "bounded_shift", "portable_lowering", "lower_portable", "lower_aarch64",
           "register_lowered_op", "lanes_of", "take_lanes", "lane_range", "join_lanes",
           "OP_NAMES", "Q31", "requant"]
