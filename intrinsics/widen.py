"""``widening_mul``: the exact int32 product of two int16 values, as one TIR operator that
aarch64 lowers to ``smull`` / ``smull2``.

Why an operator of its own: an elementwise kernel written as
``int32(a16) * int32(b16)`` is a 16 x 16 -> 32-bit multiply, one ``smull`` per four lanes
(one cycle on the A72, N1 and N2 models). LLVM only selects ``smull`` when it sees both
sign extensions next to the multiply in one basic block. When an operand is the same in
every iteration (MUL's per-channel operand, loaded once per channel block), LLVM hoists it
out of the loop already widened to int32, and the loop multiplies with ``mul`` on int32
lanes: two cycles per four lanes on those models, and twice the registers. Here the
product is one call on int16 operands, so the widening stays inside the multiply:

    widening_mul(a, b)      a, b: int16 (or int16xN)    ->  int32 (int32xN), exact

Lowering (registered as ``qmuls``' ops are, ``qmuls.register_lowered_op``):

* ``default``: ``int32(a) * int32(b)``, correct on every target;
* ``llvm.aarch64``: one ``llvm.aarch64.neon.smull.v4i32`` per four lanes (an int16x4 half
  of a register each), the pieces joined; other lane counts take the default rule.
"""

from __future__ import annotations

from tvm import tirx
from tvm.tirx import Cast

from .qmuls import join_lanes, lane_range, lanes_of, register_lowered_op, take_lanes

OP_NAME = "tvm_armq.widening_mul"
SMULL = "llvm.aarch64.neon.smull.v4i32"
SMULL_LANES = 4  # int32 lanes of one smull result register


def _as_int16(e, what: str):
    if str(e.ty.dtype.with_lanes(1)) != "int16":
        raise TypeError(f"widening_mul: {what} must be int16, got {e.ty.dtype}")
    return e


def widening_mul(a, b):
    """TIR expression for ``int32(a) * int32(b)`` of two int16 expressions (same lanes)."""
    a, b = _as_int16(a, "a"), _as_int16(b, "b")
    lanes = lanes_of(a)
    if lanes_of(b) != lanes:
        raise TypeError(f"widening_mul: a has {lanes} lanes, b {lanes_of(b)}")
    dtype = "int32" if lanes == 1 else f"int32x{lanes}"
    return tirx.call_intrin(dtype, OP_NAME, a, b)


def lower_default(call):
    """``default.FLowerIntrinsic``: the product in int32."""
    a, b = call.args
    dtype = call.ty.dtype
    return Cast(dtype, a) * Cast(dtype, b)


def lower_aarch64(call):
    """``llvm.aarch64.FLowerIntrinsic``: smull per int32x4 piece; returns ``call`` itself
    (to the default rule) for lane counts that are not a multiple of four."""
    lanes = lanes_of(call)
    if lanes % SMULL_LANES:
        return call
    a, b = call.args
    pieces = []
    for start in range(0, lanes, SMULL_LANES):
        idx = lane_range(start, SMULL_LANES)
        pieces.append(tirx.call_llvm_pure_intrin(f"int32x{SMULL_LANES}", SMULL,
                                                 take_lanes(a, idx), take_lanes(b, idx)))
    return join_lanes(pieces)


def _register() -> None:
    """Create the op and its lowering rules (``qmuls.register_lowered_op``)."""
    register_lowered_op(OP_NAME, lower_default, lower_aarch64)

_register()

__all__ = ["widening_mul", "OP_NAME", "lower_default", "lower_aarch64"]
