"""The float layers between a dynamic-range model's hybrid layers, on vector code: float32
exp and tanh that LLVM vectorizes and the ops built on them (GELU's tanh form, SOFTMAX,
LOGISTIC), MEAN, float matmul and conv2d in register tiles with an epilogue, and trees of
elementwise ops in one pass.

Why: TVM lowers ``exp`` and ``tanh`` to calls of the C library's ``expf`` (``tanh`` as two
of them), one element per call, and a loop holding a call is not vectorized. A BERT-style
encoder with float activations then spends most of its time in those calls (GELU's tanh
and SOFTMAX's exp). Here each is a short sequence of float multiplies, adds, a division and
integer bit operations, which LLVM turns into NEON instructions four lanes at a time.

The two approximations (the constants are published ones, named below):

* ``exp(x)``: Cody and Waite's range reduction, x = n ln2 + r with n = round(x / ln2) and
  r in [-ln2/2, ln2/2] (ln2 split in two constants, the first with few bits so that
  n * LN2_HI is exact), exp(r) as 1 + r + r^2 P(r) with Cephes' degree-5 P, then the
  exponent n put in the float's bits. Inputs below EXP_MIN give 0 (the true value is below
  float32's normal range); inputs are capped at EXP_MAX (no layer here feeds exp a positive
  number: SOFTMAX subtracts the row's maximum first).
* ``tanh(x)``: the 13/6-degree odd/even rational function of Eigen's ``ptanh_float``, which
  is what TFLite's own float GELU evaluates (Eigen's ``.tanh()``), for |x| up to TANH_CLAMP
  (beyond it tanh is 1 in float32), and x itself below TANH_TINY.

Their error against float64 is measured in ulps on the device by ``tests/test_float_math.py``
(the bounds are ``EXP_ULPS`` and ``TANH_ULPS``), and what the difference from TFLite's
reference kernels comes to in a whole model is in ``docs/exactness.md``.
"""

from __future__ import annotations

from .tir_util import cut_at_the_image, fence, largest_divisor

FLOAT = "float32"
VECTOR_LANES = 4  # float32 lanes of one NEON register
INTERLEAVED = 4  # registers an elementwise loop computes at once on a core without dotprod:
# four independent chains of dependent instructions hide each other's latency on the
# Cortex-A72 (GELU: 46 -> 36 cycles a register); the Neoverse N1 / N2 reorder one chain's
# loop by themselves, and the unrolled one costs them 7% (llvm-mca, armperf 4)

LOG2E = 1.44269504088896341
LN2_HI = 0.693359375  # 0x3f318000: 9 significant bits, so n * LN2_HI is exact for |n| < 2^15
LN2_LO = -2.12194440e-4  # ln2 - LN2_HI
EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
            1.6666665459e-1, 5.0000001201e-1)  # Cephes expf: P(r), highest degree first
EXP_MIN = -87.33654  # ln(2^-126): below it exp is not a normal float32
EXP_MAX = 88.0  # n = round(EXP_MAX / ln2) = 127, the largest normal exponent
EXP_ULPS = 2

TANH_NUMERATOR = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                  5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                  4.89352455891786e-03)  # odd: x * N(x^2), highest degree first
TANH_DENOMINATOR = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                    4.89352518554385e-03)  # even: D(x^2), highest degree first
TANH_CLAMP = 7.99881172180175781  # where the rational function reaches 1
TANH_TINY = 0.0004  # below it tanh(x) = x to float32's precision
TANH_ULPS = 6

GELU_SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715

FLOAT_BITS, MANTISSA_BITS, EXPONENT_BIAS = 32, 23, 127
ROUNDING_BIAS = 1.5 * 2 ** MANTISSA_BITS  # 0x4b400000: its low 22 bits are zero
RECIPROCAL_STEPS = 2  # Newton-Raphson steps from FRECPE's 8 bits: 16, then 24 (float32's)


def _c(value):
    from tvm import tirx

    return tirx.const(value, FLOAT)


def _horner(x, coefficients):
    acc = _c(coefficients[0])
    for coefficient in coefficients[1:]:
        acc = acc * x + _c(coefficient)
    return acc


def _reciprocal(q):
    """1 / q without a division: FRECPE's 8-bit estimate and two Newton-Raphson steps
    (FRECPS computes 2 - q * r), about an ulp from the quotient. A NEON division of four
    lanes costs 34 cycles on the Cortex-A72 (7 on the Neoverse N1), the six instructions
    here a few."""
    from tvm import tirx

    def intrin(name, *args):
        return tirx.call_llvm_pure_intrin(FLOAT, f"llvm.aarch64.neon.{name}", *args)

    r = intrin("frecpe", q)
    for _ in range(RECIPROCAL_STEPS):
        r = r * intrin("frecps", q, r)
    return r


def exp(x):
    """float32 e^x as a vectorizable expression of the float32 expression ``x``."""
    from tvm import tirx

    xc = tirx.min(tirx.max(x, _c(EXP_MIN)), _c(EXP_MAX))
    # n = round(x / ln2): adding ROUNDING_BIAS leaves n in the low bits of the sum's
    # mantissa, and taking it away again gives n as a float (no FRINT, no conversion)
    # (fenced: LLVM would fold (y + b) - b to y)
    biased = fence(xc * _c(LOG2E) + _c(ROUNDING_BIAS))
    n = biased - _c(ROUNDING_BIAS)
    r = (xc - n * _c(LN2_HI)) - n * _c(LN2_LO)
    e_r = _horner(r, EXP_POLY) * (r * r) + r + _c(1.0)
    # 2^n: n + 127 into the exponent field (the bias's own bits shift out past bit 31)
    bits = (tirx.reinterpret("int32", biased) + EXPONENT_BIAS) << MANTISSA_BITS
    two_n = tirx.reinterpret(FLOAT, bits)
    return tirx.Select(x < _c(EXP_MIN), _c(0.0), e_r * two_n)


def _tanh_rational(x):
    """The rational function of ``x`` clamped to +-TANH_CLAMP: tanh(x) within TANH_ULPS
    but for tiny x (TANH_TINY), and possibly an ulp past +-1 near the clamp."""
    from tvm import tirx

    xc = tirx.min(tirx.max(x, _c(-TANH_CLAMP)), _c(TANH_CLAMP))
    x2 = xc * xc
    return xc * _horner(x2, TANH_NUMERATOR) * _reciprocal(_horner(x2, TANH_DENOMINATOR))


def tanh(x):
    """float32 tanh(x) as a vectorizable expression of the float32 expression ``x``."""
    from tvm import tirx

    ratio = tirx.min(tirx.max(_tanh_rational(x), _c(-1.0)), _c(1.0))
    return tirx.Select(tirx.abs(x) < _c(TANH_TINY), x, ratio)


def gelu_tanh_te(data):
    """GELU's tanh form, in the order of TFLite's reference:
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    from tvm import te

    def element(*i):
        x = data(*i)
        inner = _c(GELU_SQRT_2_OVER_PI) * (x + _c(GELU_CUBIC) * x * x * x)
        # 1 + tanh needs neither tanh's tiny-x case nor its bound at 1 (an ulp past it
        # stays within the sum's rounding)
        return _c(0.5) * x * (_c(1.0) + _tanh_rational(inner))

    return te.compute(data.shape, element, name="gelu_tanh")


def exp_te(data):
    from tvm import te

    return te.compute(data.shape, lambda *i: exp(data(*i)), name="exp")


def tanh_te(data):
    from tvm import te

    return te.compute(data.shape, lambda *i: tanh(data(*i)), name="tanh")


def sigmoid_te(data):
    """1 / (1 + e^-x), as e^x / (1 + e^x) for negative x (exp of a non-positive number
    either way: no overflow, and the small values keep their precision)."""
    from tvm import te, tirx

    def element(*i):
        x = data(*i)
        e = exp(-tirx.abs(x))
        inverse = _reciprocal(_c(1.0) + e)
        return tirx.Select(x < _c(0.0), e * inverse, inverse)

    return te.compute(data.shape, element, name="sigmoid")


def softmax_te(data, axis: int):
    """SOFTMAX over ``axis`` as TFLite's reference computes it: the row's maximum, each
    e^(x - max), their sum, and each e^(x - max) / sum.

    Over the last axis the maximum and the sum are taken REDUCE_LANES partial results at a
    time (lane j takes elements j, j + REDUCE_LANES, ...: a vector instruction per step),
    then across the lanes. The maximum is the same in any order; the sum is added in
    another order than TFLite's one by one, which moves it by an ulp or so
    (``tests/test_float_math.py`` models the order). Each e^(x - max) is then multiplied by
    1 / sum, where TFLite divides it by the sum: two roundings for one, an ulp at most."""
    from tvm import te

    shape = [int(d) for d in data.shape]
    axis = axis % len(shape)

    def without_axis(i):
        return i[:axis] + i[axis + 1:]

    row_max = _row_reduce(te.max, data, axis, "row_max")
    exps = te.compute(shape, lambda *i: exp(data(*i) - row_max(*without_axis(i))),
                      name="exps")
    total = _row_reduce(te.sum, exps, axis, "row_sum")
    # one division per row, a multiply per element (TFLite divides each: an ulp apart)
    inverse = te.compute(total.shape, lambda *i: _c(1.0) / total(*i), name="row_inverse")
    return te.compute(shape, lambda *i: exps(*i) * inverse(*without_axis(i)),
                      name="softmax")


def mean_te(data):
    """MEAN over the last axis (keeping it, of extent 1): the row's sum through
    REDUCE_LANES partial sums (``_row_reduce``), divided by the row's length."""
    from tvm import te

    *rest, depth = (int(d) for d in data.shape)
    total = _row_reduce(te.sum, data, len(rest), "row_sum")
    return te.compute((*rest, 1), lambda *i: total(*i[:-1]) / _c(float(depth)), name="mean")


def spatial_mean_te(data, keepdims: bool):
    """MEAN of NHWC ``data`` over H and W (a global average pool): each channel's sum in
    the pixels' order (TFLite's), divided by their number. The channels are the vector."""
    from tvm import te

    n, h, w, c = (int(d) for d in data.shape)
    ry, rx = te.reduce_axis((0, h), "ry"), te.reduce_axis((0, w), "rx")
    total = te.compute((n, c), lambda b, ch: te.sum(data[b, ry, rx, ch], axis=[ry, rx]),
                       name="pixel_sum")
    shape = (n, 1, 1, c) if keepdims else (n, c)
    return te.compute(shape, lambda *i: total(i[0], i[-1]) / _c(float(h * w)),
                      name="spatial_mean")


def spatial_mean_func(shape, keepdims: bool):
    """The PrimFunc (data, output) of ``spatial_mean_te``: the channels INTERLEAVED NEON
    registers at a time inside the loops over the pixels, the blocks of channels in
    parallel."""
    from tvm import s_tir, te

    data = te.placeholder(tuple(int(d) for d in shape), FLOAT, "data")
    sch = s_tir.Schedule(te.create_prim_func([data, spatial_mean_te(data, keepdims)]))
    block = sch.get_sblock("pixel_sum")
    b, ch, ry, rx = sch.get_loops(block)
    lanes = largest_divisor(sch.get(ch).extent.value, INTERLEAVED * VECTOR_LANES)
    outer, inner = sch.split(ch, [None, lanes])
    sch.reorder(b, outer, ry, rx, inner)
    sch.vectorize(inner)
    _parallel(sch, sch.fuse(b, outer))  # a task per image and block of channels
    sch.decompose_reduction(block, ry)
    return sch.mod["main"]


REDUCE_LANES = 8  # partial maxima / sums per row: two NEON registers, two chains of adds
SOFTMAX_PARTS = ("row_max_part", "row_sum_part")  # the stages the schedule vectorizes
MEAN = "mean"


def _row_reduce(kind, data, axis: int, name: str):
    """``kind`` (te.max or te.sum) of ``data`` over ``axis``: over the last axis through
    REDUCE_LANES partial results (``<name>_part``), over another one element by element."""
    from tvm import te, tirx

    shape = [int(d) for d in data.shape]
    depth, rest = shape[axis], shape[:axis] + shape[axis + 1:]
    if axis != len(shape) - 1:
        k = te.reduce_axis((0, depth), f"{name}_k")
        return te.compute(rest, lambda *i: kind(data(*i[:axis], k, *i[axis:]), axis=k),
                          name=name)
    identity = _c(0.0) if kind is te.sum else -tirx.max_value(FLOAT)
    steps = -(-depth // REDUCE_LANES)
    o = te.reduce_axis((0, steps), f"{name}_o")

    def lane(*i):
        *row, j = i
        at = o * REDUCE_LANES + j
        if depth % REDUCE_LANES == 0:
            return kind(data(*row, at), axis=o)
        return kind(tirx.Select(at < depth, data(*row, tirx.min(at, depth - 1)), identity),
                    axis=o)

    part = te.compute((*rest, REDUCE_LANES), lane, name=f"{name}_part")
    j = te.reduce_axis((0, REDUCE_LANES), f"{name}_j")
    return te.compute(rest, lambda *i: kind(part(*i, j), axis=j), name=name)


ELEMENTWISE = {"exp": exp_te, "tanh": tanh_te, "sigmoid": sigmoid_te,
               "gelu_tanh": gelu_tanh_te}
"""The elementwise ops by name (the name their kernels have in a built module)."""
SOFTMAX = "softmax"
SOFTMAX_ELEMENTWISE = ("exps", "softmax")  # its stages with no reduction


def func(op: str, shape, axis: int | None = None):
    """The PrimFunc (data, output) of ``op`` (a name of ELEMENTWISE, SOFTMAX over ``axis``
    or MEAN over the last axis) on float32 ``shape``, scheduled: every elementwise stage a
    NEON register of results at a time along the last axis, the reductions over the last
    axis a vector of partial results at a time, each stage over every element in parallel
    over the rows."""
    from tvm import s_tir, te

    data = te.placeholder(tuple(int(d) for d in shape), FLOAT, "data")
    if op == SOFTMAX:
        out, stages = softmax_te(data, axis), SOFTMAX_ELEMENTWISE
    elif op == MEAN:
        out, stages, axis = mean_te(data), (), len(shape) - 1
    else:
        out = ELEMENTWISE[op](data)
        stages = (out.op.name,)
    sch = s_tir.Schedule(te.create_prim_func([data, out]))
    parts = ()
    if op in (SOFTMAX, MEAN) and axis % len(shape) == len(shape) - 1:
        parts = SOFTMAX_PARTS if op == SOFTMAX else SOFTMAX_PARTS[1:]
        for stage in parts:  # the steps outside, the lanes one vector inside
            *_, lane, step = sch.get_loops(sch.get_sblock(stage))
            sch.reorder(step, lane)
            sch.vectorize(lane)
    steps = {stage: _vectorize_interleaved(sch, sch.get_loops(sch.get_sblock(stage))[-1])
             for stage in stages}
    # the stages that read or write every element, each one's rows in parallel (a launch
    # per stage: inside one loop over the rows, each row's short steps cost more, +12% on
    # bert_encoder_dynamic's softmax at one thread); an elementwise stage of one row, its
    # vector steps. The per-row folds and divisions are not worth a launch each.
    for stage in (*stages, *parts):
        _parallel_rows(sch, sch.get_sblock(stage), len(shape) - 1, steps.get(stage))
    return sch.mod["main"]


def _interleaved() -> int:
    """INTERLEAVED for the current target if it lacks dotprod (a Cortex-A72-class core),
    else 1."""
    from tvm.target import Target

    from tvm_armq.intrinsics.kernels import target_has

    target = Target.current(allow_none=True)
    return INTERLEAVED if target is not None and not target_has(target, "has_dotprod") else 1


def _vectorize_interleaved(sch, loop):
    """``loop`` a NEON register at a time, ``_interleaved()`` registers per step (unrolled:
    a vector of 16 lanes would do as well, but LLVM cannot split the NEON intrinsics of
    ``_reciprocal`` over four registers). Returns the loop over the steps."""
    extent = sch.get(loop).extent.value
    lanes = largest_divisor(extent, VECTOR_LANES)
    if lanes == 1:
        return loop
    outer, inner = sch.split(loop, [None, lanes])
    sch.vectorize(inner)
    steps = largest_divisor(extent // lanes, _interleaved())
    if steps > 1:
        outer, unrolled = sch.split(outer, [None, steps])
        sch.unroll(unrolled)
    return outer


def _parallel(sch, loop) -> None:
    """``loop`` in parallel, a contiguous run of its iterations per thread, where it has
    more than one. (A one-thread build makes it serial again: ``threads.serial_func``.)"""
    if sch.get(loop).extent.value > 1:
        sch.parallel(loop)


def _parallel_rows(sch, block, rank: int, steps=None) -> None:
    """The loops of ``block`` over its first ``rank`` axes (its rows: all but the last
    axis) fused and in parallel; where they make one row, ``steps`` (the loop over the
    last axis's vector steps) if given. The loops keep their order and their splits, so a
    one-thread build (made serial again) runs what it ran before."""
    rows = sch.get_loops(block)[:rank]
    if rows:
        fused = sch.fuse(*rows) if len(rows) > 1 else rows[0]
        if sch.get(fused).extent.value > 1:
            sch.parallel(fused)
            return
    if steps is not None:
        _parallel(sch, steps)


# ------------------------------------------------- epilogues of the tiled kernels
EPILOGUE_OPS = ("add", "multiply", "relu", "clip")
"""What a tiled kernel (matmul, conv2d) applies to each sum as it copies it out, in order:
``("add" | "multiply", values)`` with float32 ``values`` one per output channel (the last
axis) or one for all, ``("relu", None)``, ``("clip", (lo, hi))``: a layer's bias, a
constant scale, its fused activation, in the order the model's ops apply them."""


def _epilogue(sums, epilogue):
    """The copy out of ``sums`` with ``epilogue`` applied (the last TE stage of a tiled
    kernel, named ``name``), and the placeholders of its constants (the kernel's
    parameters after its operands)."""
    from tvm import te, tirx

    consts = []
    for k, (op, value) in enumerate(epilogue):
        if op not in EPILOGUE_OPS:
            raise ValueError(f"a tiled kernel's epilogue has no op {op!r}")
        if op in ("add", "multiply"):
            consts.append(te.placeholder((len(value),), FLOAT, f"epilogue{k}"))

    def element(*i):
        v, const = sums(*i), iter(consts)
        for op, value in epilogue:
            if op in ("add", "multiply"):
                c = next(const)
                c = c[i[-1]] if len(value) > 1 else c[0]
                v = v + c if op == "add" else v * c
            elif op == "relu":
                v = tirx.max(v, _c(0.0))
            else:
                v = tirx.min(tirx.max(v, _c(value[0])), _c(value[1]))
        return v

    return element, consts


def epilogue_constants(epilogue):
    """The arrays a tiled kernel with ``epilogue`` takes after its operands, in order."""
    import numpy as np

    return [np.asarray(value, "float32") for op, value in epilogue if op in ("add", "multiply")]


# ----------------------------------------------------------------- float matmul
MATMUL, MATMUL_SUMS = "matmul", "matmul_sums"
MATMUL_ROWS = 4  # rows of A per tile: each a broadcast factor of the multiply-adds
MATMUL_COLUMNS = 16  # columns of B per tile: four NEON registers of accumulators per row


def matmul_te(a, b, epilogue=()):
    """C[..., i, j] = sum_k A[..., i, k] B[..., k, j] (the same leading dimensions), each
    output's sum in k's order, as TFLite's reference BATCH_MATMUL adds it: the sums
    (``MATMUL_SUMS``, which the schedule keeps in registers) and their copy out through
    ``epilogue``. Returns (C, the epilogue's constant placeholders)."""
    from tvm import te

    *batch, m, depth = (int(d) for d in a.shape)
    n = int(b.shape[-1])
    k = te.reduce_axis((0, depth), "k")
    sums = te.compute((*batch, m, n), lambda *i: te.sum(
        a(*i[:-1], k) * b(*i[:-2], k, i[-1]), axis=k), name=MATMUL_SUMS)
    element, consts = _epilogue(sums, epilogue)
    return te.compute(sums.shape, element, name=MATMUL), consts


def matmul_func(a_shape, b_shape, epilogue=()):
    """The PrimFunc (A, B, C) of ``matmul_te``, scheduled in tiles of MATMUL_ROWS x
    MATMUL_COLUMNS outputs held in registers over the whole of k: per k, one row of B's
    tile (contiguous) and a multiply-add of it by each of the tile's A values. The copy out
    runs after each tile's k loop, so buffer compaction shrinks the sums to one tile."""
    from tvm import s_tir, te

    a = te.placeholder(tuple(int(d) for d in a_shape), FLOAT, "A")
    b = te.placeholder(tuple(int(d) for d in b_shape), FLOAT, "B")
    out, consts = matmul_te(a, b, epilogue)
    sch = s_tir.Schedule(te.create_prim_func([a, b, *consts, out]))
    *batch, i, j, k = sch.get_loops(sch.get_sblock(MATMUL_SUMS))
    _schedule_tiles(sch, MATMUL_SUMS, MATMUL, batch, i, j, [k])
    return sch.mod["main"]


def _schedule_tiles(sch, sums: str, copy: str, outer, rows, columns, reduction):
    """The tiled kernels' schedule: the ``sums`` block's ``rows`` and ``columns`` loops
    split into MATMUL_ROWS x MATMUL_COLUMNS tiles (fewer where they do not divide), all of
    ``reduction`` inside a tile, the tile's rows unrolled and its columns one vector, and
    the ``copy`` out (the epilogue) after each tile's sums; the tiles in parallel."""
    block = sch.get_sblock(sums)
    ro, ri = sch.split(rows, [None, largest_divisor(sch.get(rows).extent.value, MATMUL_ROWS)])
    co, ci = sch.split(columns, [None, largest_divisor(sch.get(columns).extent.value,
                                                       MATMUL_COLUMNS)])
    sch.reorder(*outer, co, ro, *reduction, ri, ci)
    # one loop over the tiles: B's tile then depends on the loop's index, which keeps LLVM
    # from hoisting all of B out of a loop over A's rows (and spilling it to the stack)
    tiles = sch.fuse(*outer, co, ro)
    sch.reverse_compute_at(sch.get_sblock(copy), tiles)
    _parallel(sch, tiles)  # before the reduction is split in two (parallel rejects that)
    sch.unroll(ri)
    sch.vectorize(ci)
    init = sch.decompose_reduction(block, reduction[0])
    for stage in (init, sch.get_sblock(copy)):
        *_, tile_rows, tile_columns = sch.get_loops(stage)
        sch.vectorize(tile_columns)
        sch.unroll(tile_rows)


# ----------------------------------------------------------------- float conv2d
CONV, CONV_SUMS, PADDED = "conv2d", "conv2d_sums", "conv2d_padded"


def conv2d_te(data, weight, strides, padding, dilation, epilogue=()):
    """NHWC ``data`` by HWIO ``weight`` (one group), ``padding`` (top, left, bottom,
    right) of zeros (a padded copy of the input, ``PADDED``, where there is any): each
    output's sum over (filter row, filter column, input channel) in that order, as
    TFLite's reference CONV_2D adds it; the sums (``CONV_SUMS``) and their copy out, as
    ``matmul_te``."""
    from tvm import te, tirx

    n, h, w, _ = (int(d) for d in data.shape)
    kh, kw, ci, co = (int(d) for d in weight.shape)
    (sh, sw), (dh, dw), (top, left, bottom, right) = strides, dilation, padding
    oh = (h + top + bottom - dh * (kh - 1) - 1) // sh + 1
    ow = (w + left + right - dw * (kw - 1) - 1) // sw + 1
    ry, rx, rc = (te.reduce_axis((0, e), name) for e, name in ((kh, "ry"), (kw, "rx"),
                                                                 (ci, "rc")))

    padded = data
    if top or left or bottom or right:  # a copy with the zeros around it (PADDED)
        def pad(b, y, x, c):
            inside = tirx.all(y >= top, y < top + h, x >= left, x < left + w)
            at_y = tirx.max(tirx.min(y - top, h - 1), 0)
            at_x = tirx.max(tirx.min(x - left, w - 1), 0)
            return tirx.Select(inside, data[b, at_y, at_x, c], _c(0.0))

        padded = te.compute((n, h + top + bottom, w + left + right, ci), pad, name=PADDED)

    def element(b, y, x, o):
        pixel = padded[b, y * sh + ry * dh, x * sw + rx * dw, rc]
        return te.sum(pixel * weight[ry, rx, rc, o], axis=[ry, rx, rc])

    sums = te.compute((n, oh, ow, co), element, name=CONV_SUMS)
    copy, consts = _epilogue(sums, epilogue)
    return te.compute(sums.shape, copy, name=CONV), consts


def conv2d_func(data_shape, weight_shape, strides, padding, dilation, epilogue=()):
    """The PrimFunc (data, weight, output) of ``conv2d_te``, scheduled as ``matmul_func``:
    tiles of MATMUL_ROWS output pixels along a row by MATMUL_COLUMNS output channels, in
    registers over the whole sum (a broadcast input value times a vector of the filter's
    channels per step)."""
    from tvm import s_tir, te

    data = te.placeholder(tuple(int(d) for d in data_shape), FLOAT, "data")
    weight = te.placeholder(tuple(int(d) for d in weight_shape), FLOAT, "weight")
    out, consts = conv2d_te(data, weight, strides, padding, dilation, epilogue)
    sch = s_tir.Schedule(te.create_prim_func([data, weight, *consts, out]))
    n, y, x, o, ry, rx, rc = sch.get_loops(sch.get_sblock(CONV_SUMS))
    _schedule_tiles(sch, CONV_SUMS, CONV, [n, y], x, o, [ry, rx, rc])
    if any(padding):
        _schedule_padded_copy(sch, data_shape, padding)
    return sch.mod["main"]


def _schedule_padded_copy(sch, data_shape, padding):
    """The padded copy (``PADDED``) cut where the image starts and ends
    (``tir_util.cut_at_the_image``), each part's pixel's channels one vector. (Uncut,
    each pixel's copy built a mask from its bounds test: 8.5e3 of the 1.35e5 cycles of
    resnet_block_dynamic's RGB stem at neon, 1.8e3 cut.)"""
    _, h, w, _ = (int(d) for d in data_shape)
    for _, channel_loops in cut_at_the_image(sch, sch.get_sblock(PADDED), padding, h, w):
        for channels in channel_loops:
            sch.vectorize(channels)


# ------------------------------------------------------- fused elementwise trees
TREE_OPS = {"add": 2, "subtract": 2, "multiply": 2, "divide": 2, "maximum": 2, "minimum": 2,
            "negative": 1, "square": 1, "sqrt": 1, "rsqrt": 1, "relu": 1}
"""The float ops an elementwise tree is built of, with their operand counts. A tree is
``("input", k)`` (the kernel's k-th operand, broadcast to the output numpy's way),
``("const", value)`` (a float32 scalar) or ``(op, operand trees...)``; ``("clip", tree, lo,
hi)`` too."""


def _tree_value(tree, inputs, out_index):
    """The TIR value of ``tree`` at the output index ``out_index``."""
    from tvm import tirx

    kind = tree[0]
    if kind == "input":
        data = inputs[tree[1]]
        rank, shape = len(data.shape), [int(d) for d in data.shape]
        index = out_index[len(out_index) - rank:]
        return data(*[0 if d == 1 else i for d, i in zip(shape, index)])
    if kind == "const":
        return _c(float(tree[1]))
    args = [_tree_value(t, inputs, out_index) for t in tree[1:1 + TREE_OPS.get(kind, 1)]]
    if kind == "add":
        return args[0] + args[1]
    if kind == "subtract":
        return args[0] - args[1]
    if kind == "multiply":  # a product of its own: LLVM would fuse it with an add (FMLA)
        return fence(args[0] * args[1])
    if kind == "divide":
        return args[0] / args[1]
    if kind == "maximum":
        return tirx.max(args[0], args[1])
    if kind == "minimum":
        return tirx.min(args[0], args[1])
    if kind == "negative":
        return -args[0]
    if kind == "square":
        return fence(args[0] * args[0])
    if kind == "sqrt":
        return tirx.sqrt(args[0])
    if kind == "rsqrt":
        return _c(1.0) / tirx.sqrt(args[0])
    if kind == "relu":
        return tirx.max(args[0], _c(0.0))
    if kind == "clip":
        return tirx.min(tirx.max(args[0], _c(tree[2])), _c(tree[3]))
    raise ValueError(f"an elementwise tree has no op {kind!r}")


def tree_func(tree, input_shapes, out_shape):
    """The PrimFunc (inputs..., output) computing ``tree`` per element of ``out_shape``
    (each op one IEEE operation, as TFLite's kernel for it computes it, in one pass instead
    of one per op), a NEON register of results at a time along the last axis, in parallel
    over the rows or the flat loop's steps."""
    from tvm import s_tir, te

    inputs = [te.placeholder(tuple(int(d) for d in s), FLOAT, f"in{k}")
              for k, s in enumerate(input_shapes)]
    out = te.compute(tuple(int(d) for d in out_shape),
                     lambda *i: _tree_value(tree, inputs, i), name="elementwise")
    sch = s_tir.Schedule(te.create_prim_func([*inputs, out]))
    loops = sch.get_loops(sch.get_sblock("elementwise"))
    # one flat loop: over every element where no input broadcasts (its index is the
    # output's), else over the rows with the last axis inside (a broadcast input's index
    # is then one division per row, not per element)
    same = all(tuple(int(d) for d in s) == tuple(int(d) for d in out_shape)
               for s in input_shapes)
    if same and len(loops) > 1:
        loops = [sch.fuse(*loops)]
    elif len(loops) > 2:
        loops = [sch.fuse(*loops[:-1]), loops[-1]]
    steps = _vectorize_interleaved(sch, loops[-1])
    _parallel_rows(sch, sch.get_sblock("elementwise"), len(loops) - 1, steps)
    return sch.mod["main"]
