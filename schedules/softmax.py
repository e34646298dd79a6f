"""Quantized 8-bit SOFTMAX over the last axis, bit-exact with TFLite's reference kernel.

Read this first. TFLite's ``reference_ops::Softmax`` for 8-bit input (gemmlowp fixed
point) works row by row, a row being the last axis:

* **Prepare** (here at compile time, ``softmax_params``): ``beta * s_in * 2**26``
  (capped at 2**31 - 1) becomes a multiplier and left shift ``m, e >= 0``;
  ``diff_min = -floor(31 * 2**26 / 2**e)``.
* **Eval**: ``d = x - max(row)``; ``E(d)`` = gemmlowp's ``exp_on_negative_values`` of
  ``SRDHM(d << e, m)`` in Q5.26, a Q0.31 number (0 when ``d < diff_min``);
  ``sum = sum of RoundingDivideByPOT(E(d), 12)`` (Q12.19); ``recip`` = gemmlowp's
  ``one_over_one_plus_x`` of the sum normalized to [1, 2) by its leading zeros ``z``
  (three Newton-Raphson steps); per element
  ``out = clamp(RoundingDivideByPOT(SRDHM(E(d), recip), 35 - z) + dtype_min)``.

``E`` depends on ``d`` alone and an 8-bit ``d`` has 256 values, so ``E`` is a table of
256 int32 computed at compile time (``softmax_exp_table``, with the NumPy
``reference.exp_on_negative_values``, entry ``k`` being ``E(-k)``: it is indexed by
``max(row) - x``, which is in [0, 255]); the PrimFunc takes it reversed as an operand
(``softmax_func`` returns that array).

The kernel (``softmax_func``). Rows are independent: they are the parallel loop. A row
of ``depth`` bytes is read in 16-byte vectors (one NEON register); when ``depth`` is not a
multiple of 16 the last vector is the row's last 16 bytes, overlapping the one before it
(a max and a store of the same values twice are harmless). Per row:

1. **Max**: ``smax`` (``umax`` for uint8) of the row's vectors into one register, then
   ``smaxv`` across its 16 lanes: one instruction per 16 elements.
2. **Exponentials**: ``E(max - x)`` for each element, gathered from the table into a
   row buffer of int32 on the stack (``exps``), one scalar load per element: the operand
   is the table reversed, so that seen from its entry ``255 - max`` it is indexed by the
   input byte itself, and eight input bytes are one 64-bit load taken apart by bit-field
   extracts (``sbfx``), each feeding a load with a scaled register offset. This is the
   one step that is not vector: 256 int32 are 1 KiB, 64 registers, twice what NEON has,
   so the ``tbl``/``tbx`` lookup of the 8-bit LUT kernel (``lut.py``), which needs the
   whole table in registers, does not fit (the table's non-zero part, 200 entries and
   more at attention's input scales, does not either), and an exact vector evaluation of
   gemmlowp's exp is some 30 vector instructions per 4 lanes; the gather is a bit-field
   extract, a word load and half a store pair per element. The buffer is padded with zeros to a
   multiple of 16 entries (a zero adds nothing to the sum).
3. **Sum**: the buffer in int32x4 vectors, ``urshr #12`` (TFLite's rounding division by
   2**12; E >= 0) accumulated in four registers, then ``addv``.
4. **Reciprocal and shift**: gemmlowp's three Newton steps in int32x4 (``sqrdmulh``,
   ``sqshl`` for the saturating doublings), four rows at once (below), and
   ``shift = clz(sum) - 35`` (< 0).
5. **Output**: per 16 elements, four int32x4 of the buffer; ``sqrdmulh`` by the row's
   reciprocal, ``srshl`` by its negative shift (a rounding right shift: exact for these
   non-negative products, so no ties-away fixup); every value is then in [0, 256], so
   ``uzp1`` narrows two registers to int16 at once, ``uqxtn`` to bytes is the clamp at
   255, and int8's ``v - 128`` flips the top bit (``_outputs``).

Rows go in groups of four: the four rows' maxima, exponentials and sums one row after the
other, then the four reciprocals at once in the lanes of one int32x4 register (the
Newton steps are a chain of dependent multiplications: scalar, they were the longest
path of a row), then the four rows' outputs. A task (the parallel loop) is two groups,
its stack buffers (four rows of exponentials) allocated once.

Rows shorter than 16 elements (no whole vector to read), and rows whose buffer would
not sit comfortably on the stack (``MAX_VECTOR_DEPTH``), use the TE definition scheduled
plainly (``_schedule_rows``): scalar reductions per row, the output vectorized by a
divisor of the depth. ``softmax_func(schedule=False)`` is that TE definition unscheduled,
the readable one.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from tvm_armq.intrinsics.requant import INT32_MAX, INT32_MIN, MIN_SHIFT, quantize_multiplier

from .int8_ops import LANES, Q31, channel_block, finish_func

DTYPES = ("int8", "uint8")
DIFF_INTEGER_BITS = 5  # the scaled input difference is Q5.26
SUM_INTEGER_BITS = 12  # the sum of exponentials is Q12.19
TABLE_SIZE = 256  # an 8-bit input difference max(row) - x is in [0, 255]
NEWTON_48_OVER_17 = 1515870810  # 48/17 in Q2.29: the first Newton-Raphson estimate ...
NEWTON_NEG_32_OVER_17 = -1010580540  # ... is 48/17 - 32/17 * d (d = half the denominator)
NEWTON_STEPS = 3
Q2_29_ONE = 1 << 29  # 1.0 in Q2.29

QUAD = 4  # int32 lanes per NEON register
WORD = 8  # bytes per 64-bit general register
# The vector kernel keeps four rows' exponentials on the stack: 16 bytes per element
MAX_VECTOR_DEPTH = 4096
# Groups of four rows one parallel task does (its stack buffers serve all of them)
BLOCK_GROUPS = 2

SQRDMULH = "llvm.aarch64.neon.sqrdmulh"
SRSHL = "llvm.aarch64.neon.srshl"
URSHL = "llvm.aarch64.neon.urshl"
UQXTN = "llvm.aarch64.neon.uqxtn"
SIGN_BYTE = 0x80  # v - 128 for v in [0, 255]: the byte with its top bit flipped
SQSHL = "llvm.aarch64.neon.sqshl"
CTLZ = "llvm.ctlz"
ADDV = "llvm.aarch64.neon.uaddv"
MAXV = {"int8": "llvm.aarch64.neon.smaxv", "uint8": "llvm.aarch64.neon.umaxv"}


def _dtype(dtype: str) -> np.iinfo:
    if dtype not in DTYPES:
        raise TypeError(f"SOFTMAX: dtype must be one of {DTYPES}, got {dtype!r}")
    return np.iinfo(dtype)


# ----------------------------------------------------------------------------- Prepare
@dataclasses.dataclass(frozen=True)
class SoftmaxParams:
    """TFLite's 8-bit SOFTMAX parameters (keywords of ``reference.softmax``)."""

    input_multiplier: int
    input_left_shift: int
    diff_min: int
    out_dtype: str = "int8"


def softmax_params(in_q, beta: float = 1.0, dtype: str = "int8") -> SoftmaxParams:
    """TFLite's SOFTMAX Prepare for 8-bit input (PreprocessSoftmaxScaling and
    CalculateInputRadius, in double; beta and the scale are the model's float32)."""
    info = _dtype(dtype)
    scale, zp = in_q
    if not (math.isfinite(float(scale)) and float(scale) > 0):
        raise ValueError(f"SOFTMAX: input scale must be a positive number, got {scale}")
    if not info.min <= int(zp) <= info.max:
        raise ValueError(f"SOFTMAX: input zero point {zp} is outside {info.dtype}")
    si, b = float(np.float32(scale)), float(np.float32(beta))
    frac_bits = Q31 - DIFF_INTEGER_BITS
    real = min(b * si * (1 << frac_bits), float(INT32_MAX))
    m, e = quantize_multiplier(real)
    if real <= 1.0 or e < 0:  # TFLite's QuantizeMultiplierGreaterThanOne refuses these
        raise ValueError(f"SOFTMAX: beta * input scale = {b * si} is too small "
                         "for TFLite's 8-bit softmax")
    radius = math.floor(((1 << DIFF_INTEGER_BITS) - 1) * (1 << frac_bits) / (1 << e))
    return SoftmaxParams(m, e, -radius, dtype)


def softmax_exp_table(params: SoftmaxParams) -> np.ndarray:
    """int32[256]: entry ``k`` is TFLite's exp of the input difference ``-k`` (Q0.31), or 0
    when ``-k < diff_min`` (TFLite skips those elements: they add nothing to the sum and
    their output is the dtype's minimum, which a 0 here also gives)."""
    from .reference import exp_on_negative_values, scale_softmax_diff

    diff = -np.arange(TABLE_SIZE, dtype=np.int64)
    table = exp_on_negative_values(scale_softmax_diff(diff, params.input_multiplier,
                                                      params.input_left_shift))
    return np.where(diff >= params.diff_min, table, 0).astype(np.int32)


# ----------------------------------------------------------------------------- scalar TIR
def _srdhm(a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul: qmuls with no shift (one sqrdmulh)."""
    from tvm_armq.intrinsics.qmuls import qmuls

    return qmuls(a, b, Q31, 0)


def _saturating_shl(v, k: int):
    """gemmlowp's SaturatingRoundingMultiplyByPOT<k> for k > 0: v << k, saturated to int32."""
    from tvm import tirx

    limit = (1 << (Q31 - k)) - 1
    # The tests are on int64: TVM's simplifier moves constants across int32 comparisons
    # (x + c < -limit into x < -limit - c) and can build a literal past int32.
    wide = v.astype("int64")
    return tirx.Select(wide > limit, tirx.const(INT32_MAX, "int32"),
                       tirx.Select(wide < -limit, tirx.const(INT32_MIN, "int32"), v << k))


def _half_denominator(total):
    """Half of the Q12.19 sum normalized to [1, 2) by its leading zeros, in Q0.31:
    ``(t << z) - 1.0`` is the fraction below the leading one (int64: no overflow), and
    RoundingHalfSum(frac, 1.0) = (frac + 2**31) / 2 (frac >= 0)."""
    from tvm import tirx

    frac = (total.astype("int64") << tirx.clz(total).astype("int64")) - (1 << Q31)
    return ((frac + (1 << Q31)) >> 1).astype("int32")


def _newton_first(half):
    return NEWTON_48_OVER_17 + _srdhm(half, NEWTON_NEG_32_OVER_17)  # Q2.29


def _newton_step(x, half):
    """x += x * (1 - half * x), Q2.29."""
    return x + _saturating_shl(_srdhm(x, Q2_29_ONE - _srdhm(half, x)), 2)


def _to_q0_31(x):
    """x ~ 1 / half in Q2.29, i.e. 1 / (2 * half) = 1 / (1 + frac) in Q1.30: to Q0.31."""
    return _saturating_shl(x, 1)


def _output_shift(total, dtype: str):
    """The rounding shift of the output (negative: right), ``clz(sum) - right`` with
    ``right`` = num_bits_over_unit + 31 - out_bits = (12 - z) + 31 - out_bits + z."""
    from tvm import tirx

    right = SUM_INTEGER_BITS + Q31 - 8 * np.dtype(dtype).itemsize
    return tirx.max(tirx.clz(total) - right, MIN_SHIFT)


RECIPROCAL_STAGES = ("reciprocal",) + tuple(f"newton{i}" for i in range(NEWTON_STEPS, -1, -1)) \
    + ("half_denominator",)  # the per-row blocks of _reciprocal, consumers first


def _reciprocal(total, rows):
    """TFLite's GetReciprocal(total, 12) per row as TE stages: gemmlowp's
    one_over_one_plus_x_for_x_in_0_1 of the sum normalized to [1, 2), in Q0.31. Each
    Newton-Raphson step is a stage of its own (``newton<i>``, one int32 per row): a step
    uses its input three times, so one expression would grow exponentially."""
    from tvm import te

    half = te.compute(rows, lambda *r: _half_denominator(total[r].asobject()),
                      name="half_denominator")
    x = te.compute(rows, lambda *r: _newton_first(half[r].asobject()), name="newton0")

    def step(previous):
        return lambda *r: _newton_step(previous[r].asobject(), half[r].asobject())

    for i in range(1, NEWTON_STEPS + 1):
        x = te.compute(rows, step(x), name=f"newton{i}")
    return te.compute(rows, lambda *r: _to_q0_31(x[r].asobject()), name="reciprocal")


# ----------------------------------------------------------------------------- the PrimFunc
def softmax_func(shape, in_q, beta: float = 1.0, dtype: str = "int8", *,
                 schedule: bool = True):
    """TFLite's 8-bit SOFTMAX over the last axis as a PrimFunc ``(x, exp_table, out)``;
    returns ``(func, exp_table)``, the int32[256] table to pass: ``softmax_exp_table``
    in reverse order (entry ``255 - k`` is ``E(-k)``; see the module docstring).

    The output quantization is TFLite's fixed one for 8-bit softmax (scale 1/256, zero
    point -128 for int8, 0 for uint8), so only the input's scale and ``beta`` matter.
    Exact as long as TFLite's own arithmetic is defined: it aborts on rows whose sum of
    exponentials reaches 2**28 (about 512 elements tied at the maximum); there this
    kernel shifts by 31 where TFLite would need more.
    """
    _dtype(dtype)
    table = softmax_exp_table(softmax_params(in_q, beta, dtype))[::-1].copy()
    shape = tuple(int(v) for v in shape)
    if schedule and LANES <= shape[-1] <= MAX_VECTOR_DEPTH:
        return _vector_func(shape, dtype), table
    return _te_func(shape, dtype, schedule), table


def _te_func(shape, dtype: str, schedule: bool):
    """The definition in TE (one stage per step), scheduled by ``_schedule_rows``."""
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import qmuls

    info = _dtype(dtype)
    depth = shape[-1]
    rows = shape[:-1] if len(shape) > 1 else (1,)
    row = (lambda r: tuple(r)) if len(shape) > 1 else (lambda r: ())
    x = te.placeholder(shape, dtype, "x")
    table = te.placeholder((TABLE_SIZE,), "int32", "exp_table")
    k_max, k_sum = te.reduce_axis((0, depth), "k"), te.reduce_axis((0, depth), "k")
    row_max = te.compute(rows, lambda *r: te.max(x[row(r) + (k_max,)], axis=k_max),
                         name="row_max")

    def exp_of(r, c):  # E(x - max): entry 255 - (max - x) of the reversed table
        d = row_max[r].astype("int32") - x[row(r) + (c,)].astype("int32")
        return table[TABLE_SIZE - 1 - d].asobject()

    def rescale_to_sum(e):  # Q0.31 -> Q12.19: RoundingDivideByPOT(e, 12) of e >= 0
        s = SUM_INTEGER_BITS
        return (e >> s) + ((e >> (s - 1)) & 1)

    total = te.compute(rows, lambda *r: te.sum(rescale_to_sum(exp_of(r, k_sum)), axis=k_sum),
                       name="sum_of_exps")
    recip = _reciprocal(total, rows)
    shift = te.compute(rows, lambda *r: _output_shift(total[r].asobject(), dtype), name="shift")

    def element(*i):
        r = i[:-1] if len(shape) > 1 else (0,)
        v = qmuls(exp_of(r, i[-1]), recip[r].asobject(), Q31, shift[r].asobject())
        v = v + int(info.min)
        return tirx.max(tirx.min(v, int(info.max)), int(info.min)).astype(dtype)

    out = te.compute(shape, element, name="softmax")
    return finish_func((x, table, out), schedule, _schedule_rows)


def _schedule_rows(func):
    """One row at a time, rows in parallel; the row's max, sum, reciprocal and shift are
    scalars computed in the row loop, the output vectorized over the row::

        for row (parallel):
          max = max(x[row, :]); sum = sum(E(max - x) / 2**12)      (serial reductions)
          recip, shift = reciprocal(sum)                           (scalar, once)
          for c (vectorized): out = clamp(qmuls(E(max - x), recip, 31, shift) + min)
    """
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    loops = sch.get_loops(sch.get_sblock("softmax"))
    _, ci = sch.split(loops[-1], [None, channel_block(int(sch.get(loops[-1]).extent))])
    if len(loops) > 1:  # a 1-D input is one row: its scalars stay outside the loop
        row = sch.fuse(*loops[:-1])
        if int(sch.get(row).extent) > 1:
            sch.parallel(row)
        for name in RECIPROCAL_STAGES + ("shift", "sum_of_exps", "row_max"):
            sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
    for name in ("sum_of_exps", "row_max"):
        block = sch.get_sblock(name)
        sch.decompose_reduction(block, sch.get_loops(block)[-1])
    sch.vectorize(ci)
    return sch.mod["main"]


# ----------------------------------------------------------------------------- vector kernel
def _llvm(dtype: str, name: str, *args):
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(dtype, name, *args)


def _splat(value, lanes: int, dtype: str = "int32"):
    from tvm import tirx

    if isinstance(value, int):
        value = tirx.const(value, dtype)
    return tirx.Broadcast(value, lanes)


def _concat(parts):
    """One vector of the lanes of ``parts`` in order (a shuffle LLVM folds away)."""
    from tvm import tirx

    from tvm_armq.intrinsics.qmuls import lanes_of

    return tirx.Shuffle(list(parts), list(range(sum(lanes_of(p) for p in parts))))


I32X4 = f"int32x{QUAD}"


def _quads(buf, at, count: int = LANES // QUAD):
    """``count`` int32x4 of the flat ``buf`` from ``at``."""
    return [buf.vload([at + QUAD * k], I32X4) for k in range(count)]


def _accumulate(acc, exps, at):
    """``acc`` (int32x16, four registers) plus RoundingDivideByPOT(E, 12) of 16 entries
    (``urshr``, accumulated: ``ursra``)."""
    right = _splat(-SUM_INTEGER_BITS, QUAD)
    return _concat([a + _llvm(I32X4, URSHL, e, right)
                    for a, e in zip(_quads(acc, 0), _quads(exps, at))])


def _horizontal_sum(acc):
    q = _quads(acc, 0)
    return _llvm("int32", ADDV, (q[0] + q[1]) + (q[2] + q[3]))


def _vector_clz(v):
    """Leading zeros of each int32 lane (``clz``; 32 for 0)."""
    from tvm import tirx

    return _llvm(I32X4, CTLZ, v, tirx.const(False, "bool"))


def _vector_output_shift(total, dtype: str):
    """``_output_shift`` of four sums."""
    from tvm import tirx

    right = SUM_INTEGER_BITS + Q31 - 8 * np.dtype(dtype).itemsize
    return tirx.max(_vector_clz(total) - _splat(right, QUAD), _splat(MIN_SHIFT, QUAD))


def _vector_half_denominator(total):
    """``_half_denominator`` of four sums: ``t << clz(t)`` has its top bit set, and
    ((t << z) - 2**31 + 2**31) / 2 is that shifted right by one, logically."""
    from tvm import tirx

    normalized = total << _vector_clz(total)
    return tirx.reinterpret(I32X4, tirx.reinterpret(f"uint32x{QUAD}", normalized) >> 1)


def _vector_srdhm(a, b):
    return _llvm(I32X4, SQRDMULH, a, b if not isinstance(b, int) else _splat(b, QUAD))


def _vector_saturating_shl(v, k: int):
    """SaturatingRoundingMultiplyByPOT<k>, k > 0: ``sqshl`` saturates exactly as gemmlowp
    (every v past +-2**(31 - k) becomes INT32_MAX / INT32_MIN)."""
    return _llvm(I32X4, SQSHL, v, _splat(k, QUAD))


def _vector_newton_step(x, half):
    return x + _vector_saturating_shl(
        _vector_srdhm(x, _splat(Q2_29_ONE, QUAD) - _vector_srdhm(half, x)), 2)


def _outputs(exps, at, recip, shift, dtype: str):
    """16 output bytes from the exponentials at ``at``: ``sqrdmulh`` by the reciprocal,
    ``srshl`` by the (negative) shift, then the narrowing. The shift is at least 23 (the
    sum is at least E(0) / 2**12 ~ 2**19, so clz(sum) <= 12) and the product is below
    2**31: every value is in [0, 256], so a plain narrowing to 16 bits (``uzp1``, two
    registers in one) loses nothing, ``uqxtn`` to bytes is the clamp at 255 (the value
    256: a probability of 1), and the int8 output, ``v - 128``, flips the top bit."""
    from tvm import tirx

    r, s = _splat(recip, QUAD), _splat(shift, QUAD)
    scaled = [tirx.Cast(f"int16x{QUAD}", _llvm(I32X4, SRSHL, _llvm(I32X4, SQRDMULH, e, r), s))
              for e in _quads(exps, at)]
    narrow = [_llvm(f"uint8x{2 * QUAD}", UQXTN, _concat(scaled[k:k + 2])) for k in (0, 2)]
    out = _concat(narrow)
    if dtype == "uint8":
        return out
    return tirx.reinterpret(f"int8x{LANES}", out ^ _splat(SIGN_BYTE, LANES, "uint8"))


def _vector_func(shape, dtype: str):
    """The vector kernel of the module docstring (rows of 16 elements or more)."""
    from tvm import tirx
    from tvm.script import tirx as T

    depth = shape[-1]
    rows = int(np.prod(shape[:-1]))
    n = rows * depth
    vectors = -(-depth // LANES)
    padded = vectors * LANES
    vec = f"{dtype}x{LANES}"
    every = tirx.Ramp(0, 1, LANES)
    group = min(rows, QUAD)  # rows whose reciprocals are computed together
    groups = -(-rows // group)
    tasks = -(-groups // BLOCK_GROUPS)
    top_entry = TABLE_SIZE - 1
    stack = {"disable_lower_builtin": True}  # an alloca, whatever its size

    @T.prim_func(private=True)
    def func(x_h: T.handle, t_h: T.handle, o_h: T.handle):
        T.func_attr({"tirx.noalias": True})
        x = T.match_buffer(x_h, shape, dtype)
        table = T.match_buffer(t_h, (TABLE_SIZE,), "int32")
        o = T.match_buffer(o_h, shape, dtype)
        xf = T.decl_buffer((n,), dtype, data=x.data)
        of = T.decl_buffer((n,), dtype, data=o.data)
        for task in T.parallel(tasks):
            # stack buffers, once per task: a group's exponentials, its rows' sums and
            # reciprocals, a vector accumulator
            exps = T.alloc_buffer((QUAD * padded,), "int32", annotations=stack)
            top = T.alloc_buffer((LANES,), dtype, annotations=stack)
            acc = T.alloc_buffer((LANES,), "int32", annotations=stack)
            sums = T.alloc_buffer((QUAD,), "int32", annotations=stack)
            newton = T.alloc_buffer((2 * QUAD,), "int32", annotations=stack)
            T.buffer_store(sums, _splat(1, QUAD), [tirx.Ramp(0, 1, QUAD)])  # unused lanes
            for g in T.serial(task * BLOCK_GROUPS, T.min((task + 1) * BLOCK_GROUPS, groups)):
                for j in T.serial(group):
                    # a row of a partial last group is its group's last row again
                    base = T.bind(T.min(g * group + j, rows - 1) * depth)
                    row = T.bind(j * padded)
                    # 1. the row's max: smax over its vectors (the last ends at the row's end)
                    T.buffer_store(top, xf.vload([base], vec), [every])
                    for v in T.serial(1, vectors):
                        at = T.bind(base + T.min(v * LANES, depth - LANES))
                        T.buffer_store(top, T.max(top.vload([0], vec), xf.vload([at], vec)),
                                       [every])
                    # (smaxv's int32 holds the byte in its low 8 bits only: LLVM's
                    # intrinsic leaves the rest undefined, as vmaxvq_s8 truncates it)
                    row_max = T.bind(T.Cast("int32", T.Cast(
                        dtype, _llvm("int32", MAXV[dtype], top.vload([0], vec)))))
                    # 2. E(max - x) = reversed[255 - max + x]; zeros past the row's end
                    T.buffer_store(exps, _splat(0, LANES),
                                   [tirx.Ramp(row + padded - LANES, 1, LANES)])
                    # (the table seen from entry 255 - max, indexed by the byte x itself;
                    # eight bytes read as one 64-bit word, each taken out by a bit-field
                    # extract: one load per element, not two)
                    tail = T.decl_buffer((TABLE_SIZE,), "int32", data=T.bind(
                        T.address_of(table[top_entry - row_max])), elem_offset=0)
                    for k in T.serial(depth // WORD):
                        word = T.bind(tirx.reinterpret("int64", xf.vload([base + k * WORD],
                                                                         f"{dtype}x{WORD}")))
                        for i in T.unroll(WORD):
                            exps[row + k * WORD + i] = tail[
                                T.Cast("int32", T.Cast(dtype, word >> T.Cast("int64", 8 * i)))]
                    for c in T.serial(depth // WORD * WORD, depth):
                        exps[row + c] = tail[T.Cast("int32", xf[base + c])]
                    # 3. the sum of RoundingDivideByPOT(E, 12), four int32x4 accumulators
                    T.buffer_store(acc, _splat(0, LANES), [every])
                    for v in T.serial(vectors):
                        T.buffer_store(acc, _accumulate(acc, exps, row + v * LANES), [every])
                    sums[j] = _horizontal_sum(acc)
                # 4. the group's reciprocals (three Newton steps), one row per lane; each
                # step through the stack (a step uses its input three times, and let-bound
                # values may be substituted: one expression would grow exponentially)
                total = T.bind(sums.vload([0], I32X4))
                T.buffer_store(newton, _vector_half_denominator(total), [tirx.Ramp(0, 1, QUAD)])
                T.buffer_store(newton, NEWTON_48_OVER_17 + _vector_srdhm(
                    newton.vload([0], I32X4), NEWTON_NEG_32_OVER_17), [tirx.Ramp(QUAD, 1, QUAD)])
                for i in T.unroll(NEWTON_STEPS):
                    T.buffer_store(newton, _vector_newton_step(newton.vload([QUAD], I32X4),
                                                               newton.vload([0], I32X4)),
                                   [tirx.Ramp(QUAD, 1, QUAD)])
                T.buffer_store(newton, _vector_saturating_shl(newton.vload([QUAD], I32X4), 1),
                               [tirx.Ramp(0, 1, QUAD)])
                T.buffer_store(sums, _vector_output_shift(total, dtype), [tirx.Ramp(0, 1, QUAD)])
                # 5. 16 outputs per step (the last one ends at the row's end)
                for j in T.serial(group):
                    base = T.bind(T.min(g * group + j, rows - 1) * depth)
                    for v in T.serial(vectors):
                        at = T.bind(T.min(v * LANES, depth - LANES))
                        T.buffer_store(of, _outputs(exps, j * padded + at, newton[j], sums[j],
                                                    dtype), [tirx.Ramp(base + at, 1, LANES)])

    return func
