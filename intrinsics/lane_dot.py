"""``lane_dot4``: per lane, an int32 accumulator plus the dot product of four int8 pairs, as
one TIR operator that aarch64 with +dotprod lowers to ``sdot`` (vector form).

A depthwise convolution has no reduction over channels: each channel (one vector lane)
sums its own taps. ``sdot`` sums four adjacent bytes per int32 lane, so four taps of a
channel must sit in adjacent bytes, where NHWC has four channels of one tap. The operator
takes the four taps as they load (one int8 vector of channels per tap) and its lowering
interleaves them:

    lane_dot4(acc, x0, x1, x2, x3, w0, w1, w2, w3)
        = acc + x0*w0 + x1*w1 + x2*w2 + x3*w3        per lane; acc int32xN, x_i, w_i int8xN

Lowering (``qmuls.register_lowered_op``):

* ``default``: the four products widened to int32 and added, correct on every target;
* ``llvm.aarch64``: per four lanes, the x's bytes of those channels interleaved tap by tap
  (one shufflevector of the four vectors, zip1/zip2 in the code; the w's alike, which LLVM
  hoists out of the loop when the weights are loop-invariant) and one
  ``llvm.aarch64.neon.sdot.v4i32.v16i8``; other lane counts take the default rule.

The aarch64 rule emits ``sdot`` whatever the target's features: build the operator only
for a target with +dotprod (``schedules.depthwise`` does so when asked for its dot form).
Exact: each product is at most 128 * 128, and ``sdot`` adds the four into the int32 lane
with wrap-around, as the default rule's int32 additions do.
"""

from __future__ import annotations

from tvm import tirx
from tvm.tirx import Cast, IntImm, Shuffle

from .qmuls import join_lanes, lane_range, lanes_of, register_lowered_op, take_lanes

OP_NAME = "tvm_armq.lane_dot4"
SDOT = "llvm.aarch64.neon.sdot.v4i32.v16i8"
TAPS = 4  # int8 pairs per int32 lane of one sdot
SDOT_LANES = 4  # int32 lanes of one sdot result register
REGISTER_LANES = 16  # int8 lanes of one 128-bit register: the lane count lowered to sdot


def _check(e, base: str, lanes: int, what: str):
    if str(e.ty.dtype.with_lanes(1)) != base or lanes_of(e) != lanes:
        raise TypeError(f"lane_dot4: {what} must be {base} with {lanes} lanes, got "
                        f"{e.ty.dtype}")
    return e


def lane_dot4(acc, xs, ws):
    """TIR expression ``acc + sum_i int32(xs[i]) * int32(ws[i])`` (four int8 expressions
    each, lanes as ``acc``'s, an int32 expression)."""
    lanes = lanes_of(acc)
    _check(acc, "int32", lanes, "acc")
    if len(xs) != TAPS or len(ws) != TAPS:
        raise TypeError(f"lane_dot4: {TAPS} x and {TAPS} w operands, got {len(xs)} and "
                        f"{len(ws)}")
    xs = [_check(x, "int8", lanes, "x") for x in xs]
    ws = [_check(w, "int8", lanes, "w") for w in ws]
    return tirx.call_intrin(acc.ty.dtype, OP_NAME, acc, *xs, *ws)


def lower_default(call):
    """``default.FLowerIntrinsic``: the four products in int32, added to acc."""
    acc, *ops = call.args
    dtype = call.ty.dtype
    total = acc
    for x, w in zip(ops[:TAPS], ops[TAPS:]):
        total = total + Cast(dtype, x) * Cast(dtype, w)
    return total


def _zip(a, b, lanes: int, half: int, size: int):
    """zip1 (``half`` 0) or zip2 (1) of two int8 vectors in elements of ``size`` bytes:
    the elements of one half of ``a`` and ``b``, alternating."""
    per = lanes // size  # elements of ``size`` bytes per vector
    first = half * per // 2
    idx = [IntImm("int32", src * lanes + (first + e) * size + byte)
           for e in range(per // 2) for src in (0, 1) for byte in range(size)]
    return Shuffle([a, b], idx)


def _interleaved(vectors, lanes: int):
    """The four int8x16 vectors, byte c of each, tap after tap: register k holds channels
    4k .. 4k+3 as [v0[c], v1[c], v2[c], v3[c], v0[c+1], ...]. Two rounds of zips: bytes of
    v0/v1 and of v2/v3 (zip1/zip2 .16b), then those pairs' halfwords (zip1/zip2 .8h)."""
    v0, v1, v2, v3 = vectors
    pairs = [(_zip(v0, v1, lanes, h, 1), _zip(v2, v3, lanes, h, 1)) for h in (0, 1)]
    return [_zip(lo, hi, lanes, h, 2) for lo, hi in pairs for h in (0, 1)]


def lower_aarch64(call):
    """``llvm.aarch64.FLowerIntrinsic``: one sdot per four lanes; returns ``call`` itself
    (to the default rule) for lane counts that are not a multiple of four."""
    lanes = lanes_of(call)
    if lanes != REGISTER_LANES:
        return call
    acc, *ops = call.args
    xs, ws = _interleaved(ops[:TAPS], lanes), _interleaved(ops[TAPS:], lanes)
    return join_lanes([
        tirx.call_llvm_pure_intrin(f"int32x{SDOT_LANES}", SDOT,
                                   take_lanes(acc, lane_range(first, SDOT_LANES)), xs[k], ws[k])
        for k, first in enumerate(range(0, lanes, SDOT_LANES))])


def _register() -> None:
    """Create the op and its lowering rules (``qmuls.register_lowered_op``)."""
    register_lowered_op(OP_NAME, lower_default, lower_aarch64)


_register()

__all__ = ["lane_dot4", "OP_NAME", "TAPS", "lower_default", "lower_aarch64"]
