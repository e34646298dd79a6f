"""The TE stages of a conv2d GEMM, built as its plan says (``gemm_plan.GemmPlan``).

Stages, by name (``gemm_layout`` has the layouts):

    data_padded / data_rows   the input copy the plan chose (``GemmPlan.input_copy``)
    A_packed                  im2col fused with packing (a packed part)
    gemm                      int32 blocks gemm[g, M/mr, N/nr, mr, nr]: the micro-kernel's
                              block once per (row block, column block), A packed or read
                              in place (a part with a window)
    output                    the epilogue: per output element (n = output channel)

        out = clamp(qmuls(acc + folded_bias[n], multiplier[n], 31, shift[n]) + zp_out,
                    lo, hi)

    with ``lo``/``hi`` the activation range (fused ReLU/ReLU6); a row tail's stages end in
    ``_tail`` (``gemm_plan.TAIL``).

Nothing here decides anything: which stages exist, their tiles and windows come from
the plan.
"""

from __future__ import annotations

from .gemm_layout import BORDERED, ROWS, Conv2DShape, RowsCopy, ceil_div
from .gemm_plan import GemmPart, GemmPlan
from .tir_util import flatten_written


def im2col_packed_te(shape: Conv2DShape, mr_nr_kr, data, pad_value, convert=None, *,
                     rows: tuple[int, int] | None = None, name: str = "A_packed",
                     copy: str | None = None, rows_layout: RowsCopy | None = None,
                     bordered=None):
    """The ``A_packed`` stage: im2col of NHWC ``data`` fused with packing, as a TE tensor
    A_packed[groups, M/mr, K/kr, mr, kr] (``gemm_layout``).

    ``copy``: the input copy the plan chose (``GemmPlan.input_copy``): ``ROWS`` packs from
    the row copy laid out as ``rows_layout``, ``BORDERED`` from the bordered copy (the
    stage ``bordered`` if given: one copy that a row tail's GEMM reads too), None from the
    input itself.

    ``rows`` = (first, count): only the GEMM's rows [first, first + count) (a row tail's
    GEMM, or the rows before it), M = count; None: all of them.

    ``pad_value`` (a TIR constant of data's dtype) is what a padded input pixel holds;
    ``convert`` (optional) maps every element read, padding included, to the packed dtype
    (the bf16 path rounds fp32 to bf16 here). The K padding of the blocks is zero. The M
    padding rows repeat the last pixel's row: they are computed and never stored, so
    their content is free, and a copy (unlike a zero) needs no per-row test in the
    packing loop.
    """
    from tvm import te, tirx

    mr, _, kr = mr_nr_kr
    s, G = shape, shape.groups
    first, m_total = rows if rows is not None else (0, s.gemm_m)
    k_total = s.gemm_k
    mb, kb = ceil_div(m_total, mr), s.packed_k(kr, data.dtype) // kr
    pt, pl, _, _ = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    ohw, cg = s.out_h * s.out_w, s.group_in_c
    cvt = convert if convert is not None else (lambda v: v)
    zero = tirx.const(0, cvt(pad_value).ty.dtype)
    row = s.kernel_row_k(kr, data.dtype)  # K per kernel row if row-blocked, else None

    if copy == ROWS:
        if rows not in (None, (0, s.gemm_m)):
            raise ValueError(f"conv2d_gemm: {s}: a few-channel im2col (from the row copy) "
                             "covers all rows")
        return _im2col_rows_te(s, mr_nr_kr, data, pad_value, cvt, row, kb, rows_layout)
    # the bordered copy: the im2col then moves kr-byte vectors with no bounds test
    padded = None
    if copy == BORDERED:
        padded = bordered if bordered is not None else bordered_input_te(s, data, pad_value)

    def a_element(g, bm, bk, i, j):
        m, k = first + tirx.min(bm * mr + i, m_total - 1), bk * kr + j
        k0 = bk * kr
        in_range = k < k_total
        # 1x1 stride-1 convolutions that do not read the input in place
        # (``reads_input_directly``) keep this pack, a plain interleaving copy: smmla
        # and the by-vector kernels want several pixels' channels interleaved in one
        # register (smmla: 2 pixels x 8 bytes), which a copy-free K loop would rebuild
        # once per macro-tile column where the pack does it once; at small K the pack
        # is also cheaper for the by-element kernels (``DIRECT_MIN_K``) unless A is read
        # by few column passes.
        if s.is_pointwise:  # the pixel is the output pixel: a plain interleaving copy
            return tirx.if_then_else(in_range, cvt(data[m // ohw, (m % ohw) // s.out_w,
                                                        m % s.out_w, g * cg + k]), zero)
        b, oh, ow = m // ohw, (m % ohw) // s.out_w, m % s.out_w
        if padded is not None:  # the window reads the bordered copy: no test per byte
            ky, kx = k0 // (s.kw * cg), (k0 // cg) % s.kw
            return cvt(padded[b, oh * sh + ky * dh, ow * sw + kx * dw, g * cg + k0 % cg + j])
        if row is not None:
            # row-blocked K with dilated columns (a kernel row is not contiguous in the
            # input): byte r of kernel row ky is tap r // cg, channel r % cg, up to kw * cg
            ky, r = k // row, k % row
            kx, c, in_range = r // cg, r % cg, r < s.kw * cg
        elif cg % kr == 0:
            # A block's kr bytes are kr consecutive channels of one input pixel: say so
            # in the index (c affine in j, the pixel independent of j), so the copy of a
            # block vectorizes into one load and one store instead of kr gathers.
            ky, kx, c = k0 // (s.kw * cg), (k0 // cg) % s.kw, k0 % cg + j
        else:
            ky, kx, c = k // (s.kw * cg), (k // cg) % s.kw, k % cg
        ih, iw = oh * sh - pt + ky * dh, ow * sw - pl + kx * dw
        inside = tirx.all(ih >= 0, ih < s.in_h, iw >= 0, iw < s.in_w)
        pixel = tirx.if_then_else(inside, data[b, ih, iw, g * cg + c], pad_value)
        return tirx.if_then_else(in_range, cvt(pixel), zero)

    return te.compute((G, mb, kb, mr, kr), a_element, name=name)


def bordered_input_te(shape: Conv2DShape, data, pad_value):
    """``data_padded``: the NHWC input copied inside a border of ``pad_value`` as wide as
    the padding (one pass over the input; what reads it then needs no bounds test)."""
    from tvm import te, tirx

    s = shape
    pt, pl, pb, pr = s.padding

    def padded_element(b, y, x, c):
        inside = tirx.all(y >= pt, y < pt + s.in_h, x >= pl, x < pl + s.in_w)
        return tirx.if_then_else(inside, data[b, y - pt, x - pl, c], pad_value)

    return te.compute((s.batch, s.in_h + pt + pb, s.in_w + pl + pr, s.in_c), padded_element,
                      name=BORDERED)



# The row copy's block annotation: [first image row, image rows, vectors before the
# image's elements, whole vectors of them, whether a vector mixing its last elements with
# the border follows] (``RowsCopy``), for a reader of the TIR; the schedule reads the plan.
ROWS_INTERIOR = "tvm_armq.rows_interior"


def _im2col_rows_te(shape: Conv2DShape, mr_nr_kr, data, pad_value, cvt, row: int | None,
                    kb: int, layout: RowsCopy):
    """``im2col_packed_te`` for a few-channel layer (``gemm_layout.few_channels``; columns
    not dilated; ``kb`` K blocks), packed from the row copy.

    The input is first copied into ``data_rows`` (``RowsCopy``: each padded image row
    flattened to its (x, c) elements, the input's elements starting a vector at ``lead``
    + the left border). With K row-blocked (``row`` K elements per kernel row), block
    (bk, i) of A for output pixel (b, oh, ow) is

        data_rows[b, oh * sh + ky * dh, lead + ow * sw * C + rb * kr : + kr]
        with ky = bk // (kernel_row_k / kr), rb = bk % (kernel_row_k / kr)

    one vector load and one store, with no test. With K dense (``row`` None), element p
    of the pixel's K is element p - ky * kw * C of kernel row ky = p // (kw * C): block bk
    is a select, lane by lane, among one kr-vector load per kernel row (``_dense_k``).
    """
    from tvm import te, tirx

    mr, _, kr = mr_nr_kr
    s = shape
    c = s.in_c
    blocks_per_row = row // kr if row is not None else None
    pt, _, pb, _ = s.padding
    (sh, sw), dh = s.strides, s.dilation[0]
    lead, first, inner = layout.lead, layout.first, layout.inner

    def row_element(b, y, t):
        inside = tirx.all(y >= pt, y < pt + s.in_h, t >= first, t < first + inner)
        # the input by flat offset (NHWC is contiguous): row y - pt of image b starts at
        # ((b * H + y - pt) * W) * C, so the interior is one affine index in t
        flat = ((b * s.in_h + y - pt) * s.in_w) * c + t - first
        return tirx.if_then_else(inside, data[0, 0, 0, flat], pad_value)

    interior = [layout.top, layout.height, layout.lead_vectors, layout.whole_vectors,
                int(layout.mixed)]
    rows = te.compute((s.batch, pt + s.in_h + pb, layout.length), row_element, name=ROWS,
                      attrs={ROWS_INTERIOR: interior})
    m_total, ohw = s.gemm_m, s.out_h * s.out_w
    mb = ceil_div(m_total, mr)

    def a_element(g, bm, bk, i, j):
        m = tirx.min(bm * mr + i, m_total - 1)
        b, oh, ow = m // ohw, (m % ohw) // s.out_w, m % s.out_w
        base = lead + ow * sw * c
        if row is None:
            return _dense_k(s, kr, rows, b, oh * sh, base, bk, j, cvt)
        ky, rb = bk // blocks_per_row, bk % blocks_per_row
        return cvt(rows[b, oh * sh + ky * dh, base + rb * kr + j])

    return te.compute((1, mb, kb, mr, kr), a_element, name="A_packed")


def _dense_k(shape: Conv2DShape, kr: int, rows, b, y0, base, bk, j, cvt):
    """Lane j of K block bk of an output pixel's A with K dense, read from the row copy
    ``rows`` (the pixel's window starts at row y0, element ``base``): element p = bk * kr +
    j is kernel row ky's element p - ky * run (run = kw * C) for the last row starting at
    or before p, and 0 past K.

    Each kernel row's lanes come from one kr-lane load at the block's start in that row,
    base + bk * kr - ky * run + j: contiguous in j, so a vector load; clamped to
    [-(kr - 1), run - 1] before j is added, which changes nothing for a row the block
    covers and keeps every other row's (dropped) load inside the copied row (``rows_copy``
    leaves kr - 1 elements on either side). With the K blocks unrolled (the schedule),
    the selects and the clamps are constants per lane: a blend of the rows' loads."""
    from tvm import tirx

    s = shape
    run, dh = s.kw * s.in_c, s.dilation[0]
    p = bk * kr + j

    def row_lanes(ky):
        start = tirx.max(tirx.min(bk * kr - ky * run, run - 1), 1 - kr)
        return cvt(rows[b, y0 + ky * dh, base + start + j])

    value = row_lanes(s.kh - 1)
    for ky in range(s.kh - 2, -1, -1):
        value = tirx.Select(p < (ky + 1) * run, row_lanes(ky), value)
    return tirx.Select(p < s.gemm_k, value, tirx.const(0, value.ty.dtype))



def packed_gemm_te(a_packed, b_packed, acc_dtype: str, name: str = "gemm"):
    """The ``gemm`` stage: gemm[g, M/mr, N/nr, mr, nr] = sum over K of
    acc(A_packed[g, bm, kb, i, kk]) * acc(B_packed[g, bn, kb, j, kk]), the micro-kernel's
    block pattern (``kernels.desc``) once per (bm, bn)."""
    from tvm import te

    G, mb, kb, mr, kr = (int(d) for d in a_packed.shape)
    nb, nr = int(b_packed.shape[1]), int(b_packed.shape[3])
    rb, rk = te.reduce_axis((0, kb), "kb"), te.reduce_axis((0, kr), "kk")
    return te.compute(
        (G, mb, nb, mr, nr),
        lambda g, bm, bn, i, j: te.sum(a_packed[g, bm, rb, i, rk].astype(acc_dtype)
                                       * b_packed[g, bn, rb, j, rk].astype(acc_dtype),
                                       axis=[rb, rk]),
        name=name)



# The gemm block's annotation in a direct-read func: its DirectWindow, as [segment,
# segments, segment_stride, row_stride (-1: consecutive runs), by_pixel (0 or 1)], for a
# reader of the TIR and of tuning records; the schedule reads the plan.
DIRECT_WINDOW = "tvm_armq.direct_window"


def direct_gemm_te(shape: Conv2DShape, mr_nr_kr, window, source, b_packed, acc_dtype: str,
                   *, rows: tuple[int, int] | None = None, name: str = "gemm"):
    """The ``gemm`` stage of a direct-read GEMM (a plan part with a ``window``): the
    blocks of ``packed_gemm_te``, with A read in place from ``source`` (the NHWC input, or
    its bordered copy for a padded layer) at the flat offsets of ``window``
    (``gemm_layout.direct_window``).

    The flat offset of micro-tile bm's row i, run r (kernel row), K element e of the run:

        origin(bm) + i * row_stride + r * segment_stride + e

    with origin(bm) the first input element micro-tile bm reads (pointwise: pixel bm * mr's
    channels; a kh x kw conv: the top left of output pixel (b, oh, ow0)'s window, ow0 =
    the tile's first output column). Indexing ``source`` by that flat offset on its
    channel axis (batch, row and column 0) reads the same bytes as source[b, y, x, c], as
    one affine index the micro-kernel's pattern matches (``kernels.desc_direct``), where
    (b, y, x) would need divisions. K is reduced over (run, K block, kk) so that B's K
    block is run * blocks + block.

    ``rows`` = (first, count): only the GEMM's rows [first, first + count) (a row tail's
    GEMM or the rows before it), as in ``im2col_packed_te``. Past row 0, a kh x kw layer's
    rows must lie in one output row (a row tail: ``gemm_plan.tail_kernel``), so that
    their origins are the first row's, a constant, plus an affine step (and the read
    region is exact: the bordered copy's producer is then seen to cover it), or be read
    by pixel.

    A by-pixel window (``DirectWindow.by_pixel``, the INDIRECT form) puts row i at its
    own pixel m = bm * mr + i instead, origin(m) + run * segment_stride + e, so the
    micro-tile may cross output rows; M need not be whole micro-tiles (the last one's
    rows past M repeat pixel M - 1: computed, never stored). That index is not affine in
    i: the schedule marks the block for ``intrinsics.indirect`` instead of tensorizing."""
    from tvm import te, tirx

    mr, nr, kr = mr_nr_kr
    s = shape
    first, count = rows if rows is not None else (0, s.gemm_m)
    ohw = s.out_h * s.out_w
    if first and not (s.is_pointwise or window.by_pixel
                      or (first % ohw) % s.out_w + count <= s.out_w):
        raise ValueError(f"conv2d_gemm: {s}: rows {first}..{first + count} cross output "
                         "rows (a kh x kw layer's rows past row 0 are read in place in one "
                         "output row, or by pixel)")
    G, nb = (int(d) for d in b_packed.shape[:2])
    mb = ceil_div(count, mr) if window.by_pixel else count // mr
    blocks = window.segment // kr
    rows, width = (int(d) for d in source.shape[1:3])
    sh, sw = s.strides

    def pixel_origin(m):
        """The first input element output pixel m's window reads (its top left)."""
        b, oh, ow = m // ohw, (m % ohw) // s.out_w, m % s.out_w
        return ((b * rows + oh * sh) * width + ow * sw) * s.in_c

    def origin(bm):
        if s.is_pointwise:
            return (first + bm * mr) * window.segment
        if first:  # rows of one output row (a row tail): from the first, a constant
            return pixel_origin(first) + bm * mr * window.stride
        return pixel_origin(bm * mr)  # the micro-tile's rows are in one output row

    def a_at(bm, i, run, block, kk):
        if window.by_pixel:
            row = pixel_origin(first + tirx.min(bm * mr + i, count - 1))
        else:
            row = origin(bm) + i * window.stride
        return row + run * window.segment_stride + block * kr + kk

    attrs = {DIRECT_WINDOW: [window.segment, window.segments, window.segment_stride,
                             -1 if window.row_stride is None else window.row_stride,
                             int(window.by_pixel)]}
    rk = te.reduce_axis((0, kr), "kk")
    rb = te.reduce_axis((0, blocks), "kb")
    # a single run has no run axis (a unit loop the intrinsic's pattern would not match)
    runs = [te.reduce_axis((0, window.segments), "kr_row")] if window.segments > 1 else []
    rr = runs[0] if runs else 0
    b_block = rr * blocks + rb if runs else rb
    return te.compute(
        (G, mb, nb, mr, nr),
        lambda g, bm, bn, i, j: te.sum(
            source[0, 0, 0, a_at(bm, i, rr, rb, rk)].astype(acc_dtype)
            * b_packed[g, bn, b_block, j, rk].astype(acc_dtype), axis=runs + [rb, rk]),
        name=name, attrs=attrs)


def conv2d_gemm_te(plan: GemmPlan, *, in_dtype="int8", out_dtype="int8", in_zp: int,
                   out_zp: int, act_range: tuple[int, int], w_zp: int = 0,
                   max_shift: int | None = None, min_shift: int | None = None,
                   rounding: str = "double"):
    """TE tensors of the conv2d GEMM of ``plan``: (inputs..., outputs) for
    ``te.create_prim_func``.

    Inputs: data NHWC, B_packed (``pack_weights``), folded bias [out_c], multiplier
    [out_c], shift [out_c]. Output: the NHWC result viewed as
    [batch * out_h * out_w, groups, out_c / groups] (same bytes; the flat pixel index
    keeps the tile arithmetic m // mr, m % mr simple for the scheduler).
    Stages, by name: ``A_packed`` (im2col + pack), ``gemm`` (int32 blocks), ``output``.

    Asymmetric weights (``w_zp`` != 0: legacy uint8 models): sum_k (a - zp_a)(w - zp_w)
    also needs -zp_w * sum_k a per output pixel. One more input, ``row_sum`` [batch *
    out_h * out_w, groups] int32 (each pixel's im2col row summed per group, padding as
    zp_a: ``conv2d_u8.row_sums_func``), comes last before the output, and the epilogue
    adds -w_zp * row_sum; ``fold_bias(..., w_zp=w_zp)`` folds the constant terms.

    ``max_shift``: the largest of the layer's shifts, if known when the func is built (the
    caller must then pass no larger one): at most 0 drops the epilogue's per-channel left
    shift, at most -1 also shortens its rounding (``qmuls.bounded_shift``). With
    ``min_shift`` (the smallest) too, an int8 output with double rounding narrows in
    16-bit lanes (``qmuls.requantize_narrow``).

    ``rounding``: the requantization's (``qmuls``): "double" as TFLite's CONV_2D,
    "single" as its int8 FULLY_CONNECTED (measured against TFLite's reference kernels:
    ``tests/test_integrate.py``'s rounding test).

    Each part of the plan is one GEMM: read in place (a ``window``: no ``A_packed``
    stage, the ``gemm`` stage reads the input, ``direct_gemm_te``) or packed. With a row
    tail the last M % mr rows are a second GEMM with stages ``A_packed_tail`` (unless read
    in place), ``gemm_tail`` and ``output_tail``, and there are two outputs, ``output``
    [M - M % mr, groups, out_c / groups] and ``output_tail`` [M % mr, ...], which
    ``tir_util.merge_outputs`` joins once the func is scheduled.
    """
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import bounded_shift, requantize, requantize_narrow

    _, nr, kr = plan.main.tile
    s, G = plan.shape, plan.shape.groups
    m_total, n_group = s.gemm_m, s.gemm_n
    kb, nb = s.packed_k(kr, in_dtype) // kr, ceil_div(n_group, nr)

    data = te.placeholder((s.batch, s.in_h, s.in_w, s.in_c), in_dtype, "data")
    b_packed = te.placeholder((G, nb, kb, nr, kr), in_dtype, "B_packed")
    bias = te.placeholder((s.out_c,), "int32", "bias_folded")
    mult = te.placeholder((s.out_c,), "int32", "multiplier")
    shift = te.placeholder((s.out_c,), "int32", "shift")
    row_sum = te.placeholder((m_total, G), "int32", "row_sum") if w_zp else None
    lo, hi = act_range

    def out_element(x, m, g, c):
        """Output element (m, g, c) from its int32 accumulator ``x``."""
        if row_sum is not None:  # sum_k a * (w - zp_w) = sum_k a * w - zp_w * sum_k a
            x = x - row_sum[m, g] * w_zp
        x = x + bias[c]
        if out_dtype == "int8" and rounding == "double":
            return requantize_narrow(
                x, mult[c].asobject(),
                bounded_shift(shift[c].asobject(), max_shift, min_shift), out_zp, lo, hi)
        r = requantize(x, mult[c].asobject(), bounded_shift(shift[c].asobject(), max_shift),
                       out_zp, lo, hi, rounding)
        return r.astype(out_dtype)

    outputs = gemm_parts_te(plan, data, b_packed, tirx.const(in_zp, in_dtype), out_element)
    inputs = (data, b_packed, bias, mult, shift) + ((row_sum,) if w_zp else ())
    return (*inputs, *outputs)


def gemm_parts_te(plan: GemmPlan, data, b_packed, pad, out_element):
    """The GEMM of every part of ``plan`` over the NHWC tensor ``data`` (a placeholder or
    a stage; ``pad``: the TIR value of a padded pixel) and its output stage; the output
    tensors, one per part (``conv2d_gemm_te`` has the stages and the outputs' shapes).

    ``out_element(acc, m, g, c)``: the output element of GEMM row m (of the whole layer),
    group g and output channel c (= g * out_c / groups + n) from its int32 accumulator
    ``acc``: the requantization of an int8 layer, the float scaling of a hybrid one
    (``schedules.hybrid``)."""
    from tvm import te

    _, nr, _ = plan.main.tile
    s, G = plan.shape, plan.shape.groups
    n_group = s.gemm_n
    # one bordered copy, read by every part (a row tail's GEMM reads the main one's)
    bordered = bordered_input_te(s, data, pad) if plan.input_copy == BORDERED else None

    def gemm(part: GemmPart):
        """The GEMM stages of ``part`` (its rows, its micro-tile); its blocks."""
        rows, name = (part.first, part.rows), "gemm" + part.suffix
        if part.window is None:
            a_packed = im2col_packed_te(s, part.tile, data, pad, rows=rows,
                                        name="A_packed" + part.suffix, copy=plan.input_copy,
                                        rows_layout=plan.rows_copy, bordered=bordered)
            return packed_gemm_te(a_packed, b_packed, "int32", name=name)
        source = bordered if bordered is not None else data
        return direct_gemm_te(s, part.tile, part.window, source, b_packed, "int32", rows=rows,
                              name=name)

    def epilogue(acc, rows_mr, first, count, suffix):
        """The output stage of rows [first, first + count), from the blocks ``acc``."""
        def element(m, g, n):
            x = acc[g, m // rows_mr, n // nr, m % rows_mr, n % nr]
            return out_element(x, first + m, g, g * n_group + n)

        return te.compute((count, G, n_group), element, name="output" + suffix)

    return [epilogue(gemm(p), p.kernel.mr, p.first, p.rows, p.suffix) for p in plan.parts]


def conv2d_gemm_func(plan: GemmPlan, **quant):
    """The conv2d of ``plan`` as one TIR PrimFunc, unscheduled (stages as in
    ``conv2d_gemm_te``; ``quant``: its quantization arguments), with the attributes a
    tuner recognises it by (``annotate``). It must be scheduled with the same plan
    (``gemm_schedule.schedule_conv2d_gemm``), which also merges a row tail's outputs."""
    from tvm import te

    func = te.create_prim_func(list(conv2d_gemm_te(plan, **quant)))
    if plan.input_copy == BORDERED:  # read by flat offset, a row tail's past its first row
        func = flatten_written(func, BORDERED)
    return annotate(func, plan.kernel)


# Function attributes that mark a PrimFunc as an unscheduled conv2d GEMM (for tuners).
ATTR_OP, ATTR_KERNEL = "tvm_armq.op", "tvm_armq.kernel"
OP_NAME = "conv2d_gemm"


def annotate(func, kernel):
    """``func`` (from ``conv2d_gemm_func``) with the attributes a tuner recognises it by:
    ``{"tvm_armq.op": "conv2d_gemm", "tvm_armq.kernel": kernel.name}``; the kernel record
    is ``kernels.get(func.attrs["tvm_armq.kernel"])``. Checks the func's packed B has the
    kernel's (nr, kr) block."""
    b_block = tuple(int(d) for d in func.params[1].shape[-2:])  # B_packed[..., nr, kr]
    if b_block != (kernel.nr, kernel.kr):
        raise ValueError(f"conv2d_gemm: the func packs B in {b_block[0]}x{b_block[1]} blocks, "
                         f"kernel {kernel.name} takes {kernel.nr}x{kernel.kr}")
    return func.with_attrs({ATTR_OP: OP_NAME, ATTR_KERNEL: kernel.name})

