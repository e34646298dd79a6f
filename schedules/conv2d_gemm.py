"""Quantized NHWC conv2d as a GEMM over packed operands, requantized in the epilogue.

Read this first. A convolution with output pixels M = batch * out_h * out_w,
reduction K = kh * kw * in_c and output channels N is the product of two matrices:

    A[M, K]  the im2col of the input: row m = one output pixel's receptive field,
             in (ky, kx, c) order; padded pixels hold the input zero point
    B[K, N]  the weights, HWIO flattened (symmetric int8: zero point 0)

The micro-kernel (a record of ``tvm_armq.intrinsics.kernels``) multiplies an
``mr x kr`` block of A by a ``kr x nr`` block of B, so both are *packed* so that
each block is contiguous:

    A_packed[M/mr, K/kr, mr, kr]    built per inference (im2col fused with packing)
    B_packed[N/nr, K/kr, nr, kr]    built once, at compile time (``pack_weights``)

K is padded up to the block with zeros; zeros in the K padding of both operands add
nothing. M is padded up to the block with copies of the last row of A: the extra rows
are computed and never stored.

Row tail (``tail_kernel``): where padding M would waste most of a micro-tile (a 7x7
pointwise layer: M = 49 is 12 tiles of 4 rows and one of 1 row and 3 padding), the last
M % mr rows are a second GEMM instead, run by the kernel's one-row twin over the same
B_packed, with its own epilogue writing those rows of the output:

    rows [0, M - M % mr)      A_packed / gemm / output               (the kernel, mr rows)
    rows [M - M % mr, M)      A_packed_tail / gemm_tail / output_tail  (its one-row twin)

While the func is scheduled the two epilogues write two buffers (``output`` and
``output_tail``: a block that shares its output buffer cannot be moved into a loop);
``merge_outputs`` then makes ``output_tail`` a view of the last rows of ``output``.

Few channels (``row_blocked_k``: an ungrouped layer whose input channels are not whole K
blocks, e.g. an RGB stem with 3 channels): K is laid out one kernel row at a time, each
row's kw * in_c bytes padded to whole K blocks (a 3x3 stem at kr = 4: 3 rows of 12 bytes,
K = 36 instead of 27 -> 28). A kernel row's bytes lie side by side in an NHWC image (the
kw pixels of a window row are adjacent), so each block of A is then one contiguous
kr-byte load from the input; packed densely, a block straddles kernel rows and must be
gathered byte by byte. The padding costs a few zero MACs per row (XNNPACK's c4 kernels
pad each tap's channels to 4, K = 36 for the same stem).

Direct read (``reads_input_directly``): a kernel with a direct-read form can take rows of
A as they lie in the input (``kernels.desc_direct``; sdot by element: a 16-byte load of a
row holds four K steps and the lane index picks one; smull/sadalp: its packed row is 16
consecutive K bytes anyway), wherever each row is a few runs of contiguous bytes
(``direct_window``):

    1x1 stride 1      A *is* the input: row m = pixel m's channels, one run of K bytes
    kh x kw           row m = output pixel m's window: kh runs (kernel rows) of kw * in_c
                      bytes, in the input or its bordered copy; the mr rows of a
                      micro-tile are mr consecutive pixels of one output row

Then (``reads_input_directly``: for K of at least ``DIRECT_MIN_K``, or smaller K where
that pays) there is no A_packed stage: the GEMM reads the input in place (an implicit
GEMM, no im2col copy), and only B is packed.

Zero points: TFLite computes sum_k (a - zp_a) * w + bias. With w symmetric this
is sum_k a * w - zp_a * sum_k w + bias, and the last two terms are constants of
the layer: ``fold_bias`` merges them into one int32 vector at compile time, so
the GEMM runs on raw int8 input. Padding with zp_a keeps the identity exact.

Groups: a grouped convolution is ``groups`` independent GEMMs, each over its own
slice of input channels (K = kh * kw * in_c / groups) and output channels
(N = out_c / groups); every packed operand gets a leading group axis.

Epilogue, per output element (n = output channel):

    out = clamp(qmuls(acc + folded_bias[n], multiplier[n], 31, shift[n]) + zp_out, lo, hi)

with ``lo``/``hi`` the activation range (covers fused ReLU/ReLU6).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .window import Window2D

@dataclasses.dataclass(frozen=True)
class Conv2DShape(Window2D):
    """A quantized NHWC conv2d's geometry (weights HWIO with in_c / groups input channels).

    Padding is (top, left, bottom, right). A dense layer is the 1x1 case on a 1x1 image:
    ``Conv2DShape.dense(rows, k, n)``.
    """

    batch: int
    in_h: int
    in_w: int
    in_c: int
    out_c: int
    kh: int
    kw: int
    strides: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    groups: int = 1

    def __post_init__(self):
        if self.in_c % self.groups or self.out_c % self.groups:
            raise ValueError(f"conv2d: {self.groups} groups do not divide in_c={self.in_c} "
                             f"and out_c={self.out_c}")
        if self.out_h < 1 or self.out_w < 1:
            raise ValueError(f"conv2d: {self} has an empty output")

    @classmethod
    def dense(cls, rows: int, k: int, n: int) -> "Conv2DShape":
        """A fully connected layer (batch matmul rows x k times k x n) as a 1x1 convolution."""
        return cls(rows, 1, 1, k, n, 1, 1)

    @property
    def gemm_m(self) -> int:
        return self.batch * self.out_h * self.out_w

    @property
    def group_in_c(self) -> int:
        return self.in_c // self.groups

    @property
    def gemm_k(self) -> int:
        """K of one group's GEMM."""
        return self.kh * self.kw * self.group_in_c

    @property
    def gemm_n(self) -> int:
        """N of one group's GEMM."""
        return self.out_c // self.groups

    def kernel_row_k(self, kr: int, dtype: str) -> int | None:
        """K elements of one kernel row in the packed operands of element type ``dtype``
        when K is row-blocked (``row_blocked_k``), else None."""
        return row_blocked_k(self.kh, self.kw, self.group_in_c, self.groups, kr, dtype)

    def packed_k(self, kr: int, dtype: str) -> int:
        """K of the packed operands (element type ``dtype``) in K blocks of kr, padding
        included."""
        row = self.kernel_row_k(kr, dtype)
        return self.kh * row if row is not None else _ceil_div(self.gemm_k, kr) * kr

    @property
    def is_pointwise(self) -> bool:
        """1x1, stride 1, no padding: A is the input itself, no im2col gather needed."""
        return (self.kh, self.kw, self.strides, self.padding) == (1, 1, (1, 1), (0, 0, 0, 0))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def row_blocked_k(kh: int, kw: int, cg: int, groups: int, kr: int, dtype) -> int | None:
    """The K elements of one kernel row when K is laid out in whole blocks per kernel row
    (module docstring: few channels), else None (K packed densely, padded at its end).

    Row-blocked: an ungrouped layer of integer operands (``dtype``) whose input channels cg
    are no multiple of kr; each row's kw * cg elements are padded up to a multiple of kr.
    Where that pads nothing (one kernel row, or kw * cg a multiple of kr) the two layouts
    are the same bytes. Integer only: a block's padding reads whatever input follows the
    window (times a zero weight), and in floating point a zero times an infinity or NaN
    there would not be zero.
    """
    if groups != 1 or cg % kr == 0 or not str(dtype).startswith(("int", "uint")):
        return None
    return _ceil_div(kw * cg, kr) * kr


def pack_weights(weight_hwio: np.ndarray, mr_nr_kr, groups: int = 1) -> np.ndarray:
    """HWIO weights -> B_packed[groups, N/nr, K/kr, nr, kr], zero padded (K row-blocked
    where ``row_blocked_k`` says so).

    Runs once, at compile time (the weights are constants of the model).
    """
    _, nr, kr = mr_nr_kr
    kh, kw, cg, n = weight_hwio.shape
    k, ng = kh * kw * cg, n // groups
    row = row_blocked_k(kh, kw, cg, groups, kr, weight_hwio.dtype)
    if row is not None:  # each kernel row's kw * cg bytes, then zeros up to the row's blocks
        w = np.zeros((kh, row, n), weight_hwio.dtype)
        w[:, :kw * cg] = weight_hwio.reshape(kh, kw * cg, n)
        weight_hwio, k = w.reshape(kh, 1, row, n), kh * row
    b = np.zeros((groups, _ceil_div(ng, nr) * nr, _ceil_div(k, kr) * kr), weight_hwio.dtype)
    for g in range(groups):
        b[g, :ng, :k] = weight_hwio[..., g * ng:(g + 1) * ng].reshape(k, ng).T
    return np.ascontiguousarray(
        b.reshape(groups, -1, nr, b.shape[2] // kr, kr).transpose(0, 1, 3, 2, 4))


def fold_bias(weight_hwio: np.ndarray, bias: np.ndarray, in_zp: int,
              w_zp: int = 0) -> np.ndarray:
    """bias - zp_a * sum_k (W[k, n] - zp_w): the layer's constant terms, one int32 per output
    channel (= bias - zp_a * sum_k W + K * zp_a * zp_w; symmetric weights have zp_w = 0)."""
    wsum = (weight_hwio.astype(np.int64) - w_zp).reshape(-1, weight_hwio.shape[-1]).sum(axis=0)
    folded = np.asarray(bias, np.int64) - in_zp * wsum
    assert np.abs(folded).max(initial=0) < 2 ** 31
    return folded.astype(np.int32)


def im2col_packed_te(shape: Conv2DShape, mr_nr_kr, data, pad_value, convert=None, *,
                     rows: tuple[int, int] | None = None, name: str = "A_packed"):
    """The ``A_packed`` stage: im2col of NHWC ``data`` fused with packing, as a TE tensor
    A_packed[groups, M/mr, K/kr, mr, kr] (layout in the module docstring).

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
    mb, kb = _ceil_div(m_total, mr), s.packed_k(kr, data.dtype) // kr
    pt, pl, _, _ = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    ohw, cg = s.out_h * s.out_w, s.group_in_c
    cvt = convert if convert is not None else (lambda v: v)
    zero = tirx.const(0, cvt(pad_value).ty.dtype)
    row = s.kernel_row_k(kr, data.dtype)  # K per kernel row if row-blocked, else None

    if row is not None and not s.is_pointwise and dw == 1:
        if rows not in (None, (0, s.gemm_m)):
            raise ValueError(f"conv2d_gemm: {s}: a row-blocked im2col covers all rows")
        return _im2col_rows_te(s, mr_nr_kr, data, pad_value, cvt, row, kb)

    # With whole channel blocks (cg % kr == 0) and padding, the input is first copied into
    # a buffer with a border of pad_value (``data_padded``, one pass over the input): the
    # im2col then moves kr-byte vectors with no bounds test, which is most of its cost
    # otherwise (each block's test is a branch).
    padded = None
    if cg % kr == 0 and not s.is_pointwise and any(s.padding):
        padded = bordered_input_te(s, data, pad_value)

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
                      name="data_padded")


# Name of the flat-row input copy of a row-blocked im2col (``_im2col_rows_te``), and its
# block annotation for the schedule (``_schedule_rows_copy``): [first image row, image
# rows, vectors before the image's elements, whole vectors of them, whether a vector
# mixing its last elements with the border follows].
ROWS_STAGE = "data_rows"
ROWS_INTERIOR = "tvm_armq.rows_interior"
COPY_LANES = 16  # elements per vector of the copy: one NEON register of int8


def _im2col_rows_te(shape: Conv2DShape, mr_nr_kr, data, pad_value, cvt, row: int, kb: int):
    """``im2col_packed_te`` for a row-blocked K (``row_blocked_k``; ungrouped, columns not
    dilated; ``row`` K elements per kernel row, ``kb`` K blocks): every block of A is kr
    contiguous elements of one image row.

    The input is first copied into ``data_rows[batch, pt + H + pb, row]``: each padded
    image row flattened to its (x, c) elements, in whole ``COPY_LANES`` vectors:

        | lead | left border | the row's W * C input elements | right border | slack |
          lead: so the input's elements start a vector (the copy is then whole vector
                loads and stores with no test; the schedule cuts the row there)
          slack: the last block of a window row covers up to ``kernel_row_k - kw * C``
                elements past the window (their weights are 0); they stay in the row

    with the top and bottom border rows all pad. Block (bk, i) of A for output pixel
    (b, oh, ow) is then

        data_rows[b, oh * sh + ky * dh, lead + ow * sw * C + rb * kr : + kr]
        with ky = bk // (kernel_row_k / kr), rb = bk % (kernel_row_k / kr)

    one vector load and one store, with no test.
    """
    from tvm import te, tirx

    mr, _, kr = mr_nr_kr
    s = shape
    c = s.in_c
    blocks_per_row = row // kr
    pt, pl, pb, pr = s.padding
    (sh, sw), dh = s.strides, s.dilation[0]
    left, inner = pl * c, s.in_w * c
    lead = -left % COPY_LANES
    first = lead + left  # where the input's elements start: a whole number of vectors
    used = first + inner + pr * c + (row - s.kw * c)
    row_len = _ceil_div(used, COPY_LANES) * COPY_LANES

    def row_element(b, y, t):
        inside = tirx.all(y >= pt, y < pt + s.in_h, t >= first, t < first + inner)
        # the input by flat offset (NHWC is contiguous): row y - pt of image b starts at
        # ((b * H + y - pt) * W) * C, so the interior is one affine index in t
        flat = ((b * s.in_h + y - pt) * s.in_w) * c + t - first
        return tirx.if_then_else(inside, data[0, 0, 0, flat], pad_value)

    interior = [pt, s.in_h, first // COPY_LANES, inner // COPY_LANES,
                int(inner % COPY_LANES != 0)]
    rows = te.compute((s.batch, pt + s.in_h + pb, row_len), row_element, name=ROWS_STAGE,
                      attrs={ROWS_INTERIOR: interior})
    m_total, ohw = s.gemm_m, s.out_h * s.out_w
    mb = _ceil_div(m_total, mr)

    def a_element(g, bm, bk, i, j):
        m = tirx.min(bm * mr + i, m_total - 1)
        b, oh, ow = m // ohw, (m % ohw) // s.out_w, m % s.out_w
        ky, rb = bk // blocks_per_row, bk % blocks_per_row
        return cvt(rows[b, oh * sh + ky * dh, lead + ow * sw * c + rb * kr + j])

    return te.compute((1, mb, kb, mr, kr), a_element, name="A_packed")


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


# Smallest K at which a GEMM reads its input in place rather than packing it (pointwise
# and kh x kw layers alike; resnet_block's 3x3 convs at K = 144: 1.7e5 -> 9.6e4 cycles).
# Measured with scripts/bench_layers.py at dotprod (corrected ratios, MobileNet layers):
# direct read is faster from K = 64 (v2.b7-10.expand K = 64, v2.b11-13.expand 96,
# v1.pw3 128, v2.b2.project 144, v1.pw7-11 512) and slower below (v2.b1.expand K = 16,
# v2.b2-3.expand 24, v1.pw1 and v2.b4-6.expand 32): with few K steps, the per-micro-row
# costs of the direct form (its accumulators loaded and stored around a short K loop,
# A rows read once per column of macro tiles) outweigh the pack it saves.
DIRECT_MIN_K = 64
# ... unless A is read by few column passes (the direct K loop's n_tiles micro-tiles side
# by side cover nb / n_tiles of them; each pass reads every row of A again). Measured at
# dotprod, K = 32 (corrected, packed -> read in place): v2.b0.project (N = 16, 1 pass)
# 0.985 -> 1.167, v1.pw1 (N = 64, 4 passes) 1.036 -> 1.044, v2.b4-6.expand (N = 192,
# 12 passes) 1.037 -> 1.004; v2.b1.expand (K = 16, 6 passes) 1.083 -> 1.004.
DIRECT_MAX_PASSES = 4
# The widening (smull/sadalp) kernels read in place from the smallest K direct_window
# takes (two blocks), whatever N: their pack is an interleaving copy that costs more than
# the passes over A. Measured at neon (corrected, packed -> read in place): v2.b0.project
# (K = 32) 1.195 -> 1.244, v1.pw1 (K = 32, 16 passes) 1.095 -> 1.107, v2.b2-3.expand
# (K = 24, 8-byte blocks, 36 passes) 1.113 -> 1.146, v2.b4-6.expand 1.082 -> 1.086.

# Largest row tail, as a share of mr, that ``tail_kernel`` runs one row at a time rather
# than padding up to a whole micro-tile: each tail row costs a K loop over all of B.
# Measured on the 7x7 pointwise layers (M = 49, one tail row; corrected tflite/tvm_armq,
# padded -> tail): neon 0.971-0.981 -> 1.031-1.036 (the one-row K loop costs what a row of
# the 4-row one does), dotprod 0.963-0.996 -> 1.065-1.088 (with the 48 main rows now read
# in place). Two rows (M % 4 = 2) cost at most two such rows against four padded, and
# are tested but not measured on a real layer; three are left padded.
TAIL_MAX_SHARE = 0.5
TAIL = "_tail"  # suffix of a row tail's stage names (A_packed_tail, gemm_tail, output_tail)


def direct_window(shape: Conv2DShape, mr_nr_kr, rows: int | None = None):
    """Where the GEMM of ``shape`` would find its rows of A in the input, read in place
    (``kernels.DirectWindow``, offsets into the input, or into its bordered copy
    ``data_padded`` when the layer pads), or None where A cannot be read in place:

    * pointwise (1x1, stride 1, unpadded): A is the input, K contiguous elements per row;
      M must be whole micro-tiles;
    * kh x kw, any stride and padding, columns not dilated: row i of a micro-tile is
      output pixel ow0 + i of one output row (so out_w must be whole micro-tiles), and
      its K elements are the kh kernel rows of kw * C contiguous input elements each.

    Both: ungrouped, and runs of at least two whole K blocks (K, resp. C, a multiple of
    kr, so B is packed densely: ``row_blocked_k`` is None; a run of one block would leave
    a unit K loop, which the intrinsic's pattern does not match).

    ``rows``: the GEMM's rows that are read (``gemm_rows``: a row tail is a GEMM of its
    own), all of M if None.
    """
    from tvm_armq.intrinsics.kernels import DirectWindow

    mr, _, kr = mr_nr_kr
    s = shape
    if s.groups != 1:
        return None
    if s.is_pointwise:
        rows = s.gemm_m if rows is None else rows
        ok = rows % mr == 0 and s.gemm_k % kr == 0 and s.gemm_k >= 2 * kr
        return DirectWindow.pointwise(s.gemm_k) if ok else None
    if s.dilation[1] != 1 or s.in_c % kr or s.out_w % mr or s.kw * s.in_c < 2 * kr:
        return None
    _, pl, _, pr = s.padding
    width = s.in_w + pl + pr  # of the bordered copy, or of the input itself if unpadded
    return DirectWindow(segment=s.kw * s.in_c, segments=s.kh,
                        segment_stride=s.dilation[0] * width * s.in_c,
                        row_stride=s.strides[1] * s.in_c)


def can_read_input_directly(shape: Conv2DShape, kernel, rows: int | None = None) -> bool:
    """Whether the GEMM of ``shape`` (its ``rows``, as in ``direct_window``) *can* read A
    from the input in place with ``kernel``: a kernel with a direct-read form
    (``kernels.has_direct``: sdot by element, int8 smull/sadalp) and a layer
    ``direct_window`` accepts."""
    from tvm_armq.intrinsics import kernels

    return (kernel is not None and kernels.has_direct(kernel)
            and direct_window(shape, (kernel.mr, kernel.nr, kernel.kr), rows) is not None)


def reads_input_directly(shape: Conv2DShape, kernel, rows: int | None = None) -> bool:
    """Whether ``conv2d_gemm_func`` builds the GEMM of ``shape`` (its ``rows`` run by
    ``kernel``: by default ``gemm_rows``) reading A in place (no A_packed stage): where it
    can (``can_read_input_directly``) and K is at least ``DIRECT_MIN_K``; below that
    (where the pack is cheaper) a pointwise layer still reads in place with a widening
    kernel, or where at most ``DIRECT_MAX_PASSES`` column passes read A (both measured on
    pointwise layers only)."""
    rows = gemm_rows(shape, kernel) if rows is None else rows
    if not can_read_input_directly(shape, kernel, rows):
        return False
    if shape.gemm_k >= DIRECT_MIN_K:
        return True
    nb = _ceil_div(shape.gemm_n, kernel.nr)
    return shape.is_pointwise and (kernel.form == "widening"
                                   or nb // _direct_n_tiles(nb, kernel) <= DIRECT_MAX_PASSES)


def tail_kernel(shape: Conv2DShape, kernel):
    """The kernel that runs the last M % mr rows of the GEMM of ``shape`` (module
    docstring: row tail), or None when they are padded up to a whole micro-tile instead.

    A tail is the kernel's one-row twin (``kernels.one_row_twin``: same nr and kr, so the
    same B_packed), one K loop per row over all of B. It pays where the padding would be
    most of a micro-tile: at most ``TAIL_MAX_SHARE`` of mr rows (M = 49 at mr = 4: one row
    instead of four, 49 rows of work instead of 52). Pointwise layers (dense included)
    only: their rows are pixels the tail reads as they are, and no input copy (bordered or
    row-blocked) has to be shared between the two GEMMs.
    """
    from tvm_armq.intrinsics import kernels

    if kernel is None or not shape.is_pointwise or shape.gemm_m < kernel.mr:
        return None
    rest = shape.gemm_m % kernel.mr
    if not rest or rest > kernel.mr * TAIL_MAX_SHARE:
        return None
    return kernels.one_row_twin(kernel)


def gemm_rows(shape: Conv2DShape, kernel) -> int:
    """The rows of the GEMM of ``shape`` that ``kernel`` runs: all of M, or those before a
    row tail (``tail_kernel``)."""
    if tail_kernel(shape, kernel) is None:
        return shape.gemm_m
    return shape.gemm_m - shape.gemm_m % kernel.mr


# The gemm block's annotation in a direct-read func: its DirectWindow, as
# [segment, segments, segment_stride, row_stride (-1: consecutive runs)].
DIRECT_WINDOW = "tvm_armq.direct_window"


def direct_gemm_te(shape: Conv2DShape, mr_nr_kr, source, b_packed, acc_dtype: str, *,
                   rows: tuple[int, int] | None = None, name: str = "gemm"):
    """The ``gemm`` stage of a direct-read GEMM (``reads_input_directly``): the blocks of
    ``packed_gemm_te``, with A read in place from ``source`` (the NHWC input, or its
    bordered copy for a padded layer) at the flat offsets of ``direct_window``.

    The flat offset of micro-tile bm's row i, run r (kernel row), K element e of the run:

        origin(bm) + i * row_stride + r * segment_stride + e

    with origin(bm) the first input element micro-tile bm reads (pointwise: pixel bm * mr's
    channels; a kh x kw conv: the top left of output pixel (b, oh, ow0)'s window, ow0 =
    the tile's first output column). Indexing ``source`` by that flat offset on its
    channel axis (batch, row and column 0) reads the same bytes as source[b, y, x, c], as
    one affine index the micro-kernel's pattern matches (``kernels.desc_direct``), where
    (b, y, x) would need divisions. K is reduced over (run, K block, kk) so that B's K
    block is run * blocks + block.

    ``rows`` = (first, count): only the GEMM's rows [first, first + count) (pointwise:
    a row tail's GEMM or the rows before it), as in ``im2col_packed_te``."""
    from tvm import te

    mr, nr, kr = mr_nr_kr
    s = shape
    first, count = rows if rows is not None else (0, s.gemm_m)
    if first and not s.is_pointwise:
        raise ValueError(f"conv2d_gemm: {s}: only a pointwise GEMM reads rows from {first}")
    window = direct_window(s, mr_nr_kr, count)
    G, nb = (int(d) for d in b_packed.shape[:2])
    mb = count // mr
    blocks = window.segment // kr
    ohw = s.out_h * s.out_w
    rows, width = (int(d) for d in source.shape[1:3])
    sh, sw = s.strides

    def origin(bm):
        if s.is_pointwise:
            return (first + bm * mr) * window.segment
        m0 = bm * mr
        b, oh, ow0 = m0 // ohw, (m0 % ohw) // s.out_w, m0 % s.out_w
        return ((b * rows + oh * sh) * width + ow0 * sw) * s.in_c

    def a_at(bm, i, run, block, kk):
        return (origin(bm) + i * window.stride + run * window.segment_stride
                + block * kr + kk)

    attrs = {DIRECT_WINDOW: [window.segment, window.segments, window.segment_stride,
                             -1 if window.row_stride is None else window.row_stride]}
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


def window_of(sch, gemm_block):
    """The ``DirectWindow`` a direct-read func's gemm block was built with."""
    from tvm_armq.intrinsics.kernels import DirectWindow

    segment, segments, stride, row = (int(v) for v in
                                      sch.get(gemm_block).annotations[DIRECT_WINDOW])
    return DirectWindow(segment, segments, stride, None if row < 0 else row)


def conv2d_gemm_te(shape: Conv2DShape, mr_nr_kr, *, in_dtype="int8", out_dtype="int8",
                   in_zp: int, out_zp: int, act_range: tuple[int, int], w_zp: int = 0,
                   max_shift: int | None = None, direct: bool = False,
                   tail: tuple[tuple[int, int, int], bool] | None = None,
                   rounding: str = "double"):
    """TE tensors of the conv2d GEMM: (inputs..., outputs) for ``te.create_prim_func``.

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
    shift, at most -1 also shortens its rounding (``qmuls.bounded_shift``).

    ``rounding``: the requantization's (``qmuls``): "double" as TFLite's CONV_2D,
    "single" as its int8 FULLY_CONNECTED (measured against TFLite's reference kernels:
    ``tests/test_integrate.py``'s rounding test).

    ``direct`` (only where ``can_read_input_directly`` holds): no ``A_packed`` stage, the
    ``gemm`` stage reads the input in place (``direct_gemm_te``).

    ``tail`` = (the one-row tile (1, nr, kr), whether it reads in place), where
    ``tail_kernel`` gives a row tail: the last M % mr rows are a second GEMM with stages
    ``A_packed_tail`` (unless read in place), ``gemm_tail`` and ``output_tail``, and there
    are two outputs, ``output`` [M - M % mr, groups, out_c / groups] and ``output_tail``
    [M % mr, ...], which ``merge_outputs`` joins once the func is scheduled.
    """
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import bounded_shift, qmuls

    mr, nr, kr = mr_nr_kr
    s, G = shape, shape.groups
    m_total, n_group = s.gemm_m, s.gemm_n
    kb, nb = s.packed_k(kr, in_dtype) // kr, _ceil_div(n_group, nr)
    rest = m_total % mr if tail is not None else 0

    data = te.placeholder((s.batch, s.in_h, s.in_w, s.in_c), in_dtype, "data")
    b_packed = te.placeholder((G, nb, kb, nr, kr), in_dtype, "B_packed")
    bias = te.placeholder((s.out_c,), "int32", "bias_folded")
    mult = te.placeholder((s.out_c,), "int32", "multiplier")
    shift = te.placeholder((s.out_c,), "int32", "shift")
    row_sum = te.placeholder((m_total, G), "int32", "row_sum") if w_zp else None
    pad = tirx.const(in_zp, in_dtype)
    lo, hi = act_range

    def gemm(tile, rows, direct, suffix):
        """The GEMM stages of rows = (first, count) with micro-tile ``tile``; its blocks."""
        if not direct:
            a_packed = im2col_packed_te(s, tile, data, pad, rows=rows,
                                        name="A_packed" + suffix)
            return packed_gemm_te(a_packed, b_packed, "int32", name="gemm" + suffix)
        if direct_window(s, tile, rows[1]) is None:
            raise ValueError(f"conv2d_gemm: {s} cannot read A in place with "
                             f"{'x'.join(map(str, tile))} blocks (see direct_window)")
        source = bordered_input_te(s, data, pad) if any(s.padding) else data
        return direct_gemm_te(s, tile, source, b_packed, "int32", rows=rows,
                              name="gemm" + suffix)

    def epilogue(acc, rows_mr, first, count, suffix):
        """The output stage of rows [first, first + count), from the blocks ``acc``."""
        def out_element(m, g, n):
            c = g * n_group + n
            x = acc[g, m // rows_mr, n // nr, m % rows_mr, n % nr]
            if row_sum is not None:  # sum_k a * (w - zp_w) = sum_k a * w - zp_w * sum_k a
                x = x - row_sum[first + m, g] * w_zp
            x = x + bias[c]
            r = qmuls(x, mult[c].asobject(), 31, bounded_shift(shift[c].asobject(), max_shift),
                      rounding)
            r = r + out_zp
            return tirx.max(tirx.min(r, hi), lo).astype(out_dtype)

        return te.compute((count, G, n_group), out_element, name="output" + suffix)

    main = m_total - rest
    outputs = [epilogue(gemm(mr_nr_kr, (0, main), direct, ""), mr, 0, main, "")]
    if rest:
        tail_tile, tail_direct = tail
        acc = gemm(tail_tile, (main, rest), tail_direct, TAIL)
        outputs.append(epilogue(acc, tail_tile[0], main, rest, TAIL))
    inputs = (data, b_packed, bias, mult, shift) + ((row_sum,) if w_zp else ())
    return (*inputs, *outputs)


def conv2d_gemm_func(shape: Conv2DShape, mr_nr_kr, *, kernel=None, **quant):
    """The conv2d as one TIR PrimFunc, unscheduled (stages as in ``conv2d_gemm_te``).

    With ``kernel`` (a record of ``tvm_armq.intrinsics.kernels`` whose block is
    ``mr_nr_kr``) the func carries the attributes of ``annotate``, reads A from the
    input in place where the kernel can (``reads_input_directly``: then it must be
    scheduled with that kernel), and runs a row tail through its one-row twin where
    ``tail_kernel`` says so (two outputs until ``merge_outputs``; ``schedule_conv2d_gemm``
    merges them).
    """
    from tvm import te

    direct = reads_input_directly(shape, kernel)
    twin = tail_kernel(shape, kernel)
    tail = None
    if twin is not None:
        rest = shape.gemm_m - gemm_rows(shape, kernel)
        tail = ((twin.mr, twin.nr, twin.kr), reads_input_directly(shape, twin, rest))
    func = te.create_prim_func(list(conv2d_gemm_te(shape, mr_nr_kr, direct=direct, tail=tail,
                                                   **quant)))
    return func if kernel is None else annotate(func, kernel)


def merge_outputs(func):
    """``func`` with a row tail's two output buffers (``conv2d_gemm_te``: ``output`` and
    ``output_tail``) joined into one ``output`` of all M rows; ``output_tail`` becomes a
    view of its last rows (a match_buffer of the root block). ``func`` itself when it has
    no row tail. Meant for a scheduled func: no schedule primitive may run after it."""
    import tvm
    import tvm_ffi
    from tvm import s_tir, tirx
    from tvm.tirx.buffer import Buffer

    names = [p.name for p in func.params]
    if "output" + TAIL not in names:
        return func
    out, tail = func.params[names.index("output")], func.params[names.index("output" + TAIL)]
    main, rest = int(out.shape[0]), int(tail.shape[0])
    inner = [int(d) for d in out.shape[1:]]
    full = tirx.decl_buffer((main + rest, *inner), out.dtype, "output")
    view = tirx.decl_buffer(tuple(int(d) for d in tail.shape), tail.dtype, "output" + TAIL,
                            elem_offset=main * int(np.prod(inner)))
    swap = {out: full, tail: view}
    realize = tvm_ffi.structural_map(func.body, [(Buffer, lambda b: swap.get(b, b))])
    root = realize.block
    rows = [tvm.ir.Range.from_min_extent(main, rest)] + [tvm.ir.Range.from_min_extent(0, d)
                                                         for d in inner]
    match = s_tir.MatchBufferRegion(view, tirx.BufferRegion(full, rows))
    root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body,
                        root.init, root.alloc_buffers, [*root.match_buffers, match],
                        root.annotations)
    params = [full if p.same_as(out) else p for p in func.params if not p.same_as(tail)]
    return tirx.PrimFunc(params, s_tir.SBlockRealize(realize.iter_values, realize.predicate,
                                                     root),
                         ret_type=func.ret_type, attrs=func.attrs)


# Function attributes that mark a PrimFunc as an unscheduled conv2d GEMM (for tuners).
ATTR_OP, ATTR_KERNEL = "tvm_armq.op", "tvm_armq.kernel"
OP_NAME = "conv2d_gemm"


def annotate(func, kernel):
    """``func`` (from ``conv2d_gemm_func``) with attributes a tuner recognises it by:
    ``{"tvm_armq.op": "conv2d_gemm", "tvm_armq.kernel": kernel.name}``; the kernel record
    is ``kernels.get(func.attrs["tvm_armq.kernel"])``. Checks the func's packed B has the
    kernel's (nr, kr) block."""
    b_block = tuple(int(d) for d in func.params[1].shape[-2:])  # B_packed[..., nr, kr]
    if b_block != (kernel.nr, kernel.kr):
        raise ValueError(f"conv2d_gemm: the func packs B in {b_block[0]}x{b_block[1]} blocks, "
                         f"kernel {kernel.name} takes {kernel.nr}x{kernel.kr}")
    return func.with_attrs({ATTR_OP: OP_NAME, ATTR_KERNEL: kernel.name})


@dataclasses.dataclass(frozen=True)
class GemmKnobs:
    """Tunable choices of ``schedule_conv2d_gemm`` (the autotuner's design space).

    ``m_tiles`` x ``n_tiles`` micro-tiles form one macro tile, whose accumulators stay live
    across the whole K loop (more tiles: more reuse of each loaded A and B block, more
    registers); ``k_unroll`` unrolls that many K blocks; ``parallel`` runs macro-tile rows
    on threads; ``vector_epilogue`` vectorizes the requantization over the macro tile's
    ``n_tiles * nr`` output channels of a pixel (one contiguous store per output row).
    ``default_knobs`` picks good values for a layer and kernel.
    """

    m_tiles: int = 1
    n_tiles: int = 1
    k_unroll: int = 1
    parallel: bool = True
    vector_epilogue: bool = True


# The register file default_knobs plans with: 32 128-bit NEON registers, a few of which
# stay free for the loop's temporaries (products before they are accumulated, addresses
# spilled into vectors by LLVM, the epilogue's constants).
NEON_REGISTERS = 32
SCRATCH_REGISTERS = 4
# Widest macro tile row default_knobs aims for: 16 int8 outputs are one 128-bit store.
STORE_CHANNELS = 16
MAX_TILES = 8  # per direction; beyond this the loop body only grows
# Widest output row of a one-row kernel's K loop (a GEMV: M = 1, ``kernels.is_one_row``).
# Each column block then has one accumulator register, used by every instruction of its
# column: the K loop needs several blocks in flight to hide the accumulate latency, and
# there is no row reuse to trade them against. Measured on the logits (N = 1000: 250
# column blocks of 4), one-row sdot, corrected tflite/tvm_armq at dotprod / i8mm:
# 8 channels 0.64 / 0.51, 20: 1.12 / 1.18, 40: 1.15 / 1.39, 100: 0.38 / 1.02 (the
# epilogue of 100 channels spills).
ONE_ROW_CHANNELS = 40
EPILOGUE_LANES = 4  # int32 lanes of one NEON register: the requantization's vector width
# Registers the requantization keeps live per EPILOGUE_LANES output channels (bias,
# multiplier, and the left and right shifts derived from shift), and for the whole tile
# (the activation bounds, the output zero point, a narrowing shuffle's index).
EPILOGUE_CHANNEL_REGISTERS = 4
EPILOGUE_FIXED_REGISTERS = 4


# K blocks from which a by-element (sdot) GEMM's epilogue may spill: over a long K loop
# the spill is paid once per macro tile, and the wider tile's loads and stores win.
# Measured at dotprod (corrected, packed A, 4 x 8 -> 4 x 16 output tiles, M = 49):
# v2.b14-16.expand (K = 160, 40 blocks) 0.928 -> 1.026, v1.pw13 (K = 1024) 0.974 ->
# 0.996; at K = 16 and 32 (v2.b1.expand, v2.b4-6.expand) the narrow tile wins, 1.083 vs
# 1.005 and 1.037 vs 1.028. (smmla's wider tiles lose at every K: 2 x 8 against 2 x 4 on
# v1.pw3, K = 128, 1.664 vs 1.706.)
LONG_K_BLOCKS = 32


def _registers(kernel, m_tiles: int, n_tiles: int) -> tuple[int, int]:
    """NEON registers the K loop of an m_tiles x n_tiles macro tile keeps live, as
    (accumulators, operands): one K step's A and B blocks are the operands (a 128-bit
    register holds 16 bytes, so this is also the number of loads). Kernels that reduce
    inside the block (``form`` widening / by_vector: a pairwise-add tree per row of C)
    keep mr x nr partial-sum vectors per micro-tile. A kernel tensorized over the whole
    K loop (``kernels.has_k_loop``) runs one K loop per micro-tile: one micro-tile's
    worth is live whatever the macro tile."""
    from tvm_armq.intrinsics import kernels

    lanes = 16 // 4  # int32 accumulator lanes of a register
    if kernel.form in ("widening", "by_vector"):
        acc = kernel.mr * kernel.nr  # one int32x4 of partial sums per (row, column)
    else:
        acc = -(-kernel.mr * kernel.nr // lanes)
    if kernels.has_k_loop(kernel):
        m_tiles = n_tiles = 1
    a_regs, b_regs = -(-kernel.mr * kernel.kr // 16), -(-kernel.nr * kernel.kr // 16)
    return acc * m_tiles * n_tiles, a_regs * m_tiles + b_regs * n_tiles


def _epilogue_registers(kernel, m_tiles: int, n_tiles: int) -> int:
    """NEON registers the epilogue of an m_tiles x n_tiles macro tile keeps live: the
    tile's int32 results and the per-channel and fixed requantization operands."""
    results = m_tiles * n_tiles * -(-kernel.mr * kernel.nr // EPILOGUE_LANES)
    channels = -(-n_tiles * kernel.nr // EPILOGUE_LANES)
    return results + EPILOGUE_CHANNEL_REGISTERS * channels + EPILOGUE_FIXED_REGISTERS


def _direct_n_tiles(nb: int, kernel) -> int:
    """n_tiles of a direct-read GEMM: its K loop covers n_tiles micro-tiles side by side,
    which share every A row load. The largest divisor of the column blocks whose output
    row is at most ``STORE_CHANNELS`` (``ONE_ROW_CHANNELS`` for a one-row kernel) and
    whose K loop fits the register file: per micro-tile, mr accumulators for the
    by-element dot product (one int32x4 row of C each), mr * nr partial sums for the
    widening kernel; operands, mr A rows and one B block (by element), or mr + nr rows
    (widening)."""
    from tvm_armq.intrinsics import kernels

    budget = NEON_REGISTERS - SCRATCH_REGISTERS
    per_tile, operands = {"by_element": (kernel.mr, kernel.mr + 1),
                          "widening": (kernel.mr * kernel.nr, kernel.mr + kernel.nr)}[kernel.form]
    row = ONE_ROW_CHANNELS if kernels.is_one_row(kernel) else STORE_CHANNELS
    fits = [d for d in range(1, nb + 1) if nb % d == 0 and d * kernel.nr <= row
            and d * per_tile + operands <= budget]
    return max(fits)


def default_knobs(shape: Conv2DShape, kernel, *, parallel: bool = True,
                  rows: int | None = None) -> GemmKnobs:
    """Good knobs for ``shape`` with micro-kernel ``kernel`` (any ISA level), for the
    GEMM's ``rows`` that the kernel runs (default ``gemm_rows``: M but a row tail).

    Among macro tiles whose tile counts divide the layer's block counts (so no ragged
    tile) and whose K loop fits the register file (``_registers``), rank by, in order:
    output rows of whole int32x4 registers (``EPILOGUE_LANES``; else the requantization
    is scalar); an epilogue that fits the register file (``_epilogue_registers``; a
    spilling epilogue costs more than any K loop saves on the MobileNet layers: measured
    with scripts/bench_layers.py, e.g. 2x4 beats 2x8 smmla tiles from K = 16 to K = 96
    and ties at K = 512); the most multiply-accumulate instructions per load in a K step
    (loads stop mattering once there are fewer loads than MAC instructions); the widest
    power-of-two output row up to ``STORE_CHANNELS`` (whole stores); the fewest live
    epilogue registers. (A by-element kernel's epilogue may spill from ``LONG_K_BLOCKS``
    K blocks.) K is unrolled by 2 when the K blocks allow. The scalar
    reference kernel gets 1 x 1 tiles. A direct-read GEMM (``reads_input_directly``) runs
    one K loop per row of micro-tiles: m_tiles 1, n_tiles from ``_direct_n_tiles``. A
    kernel tensorized over the whole K loop (``kernels.has_k_loop``, more than one K
    block) gets one micro-tile per macro tile.
    """
    rows = gemm_rows(shape, kernel) if rows is None else rows
    return _knobs(kernel, _ceil_div(rows, kernel.mr), _ceil_div(shape.gemm_n, kernel.nr),
                  shape.packed_k(kernel.kr, kernel.a_dtype) // kernel.kr,
                  reads_input_directly(shape, kernel, rows), parallel)


def _knobs(kernel, mb: int, nb: int, kb: int, direct: bool, parallel: bool) -> GemmKnobs:
    """``default_knobs`` of a GEMM of mb x nb micro-tiles over kb K blocks, read in place
    if ``direct``."""
    from tvm_armq.intrinsics import kernels

    if kernel.intrin is None:
        return GemmKnobs(parallel=parallel)
    if direct:
        return GemmKnobs(n_tiles=_direct_n_tiles(nb, kernel), parallel=parallel)
    if kernels.has_k_loop(kernel) and kb > 1:
        # Tensorized over the whole K loop: one micro-tile per macro tile. A short K loop is
        # unrolled into the tile, and LLVM then interleaves the K loops of a macro tile's
        # micro-tiles, whose mr * nr partial sums each no longer fit the registers
        # together; a long one gains nothing from more tiles. Measured at neon (corrected,
        # 1 x 2 -> 1 x 1 tiles): v1.pw1 (K = 32) 0.957 -> 1.142, v2.b2-3.expand (K = 24)
        # 0.810 -> 0.955, v1.pw12 (K = 512) 0.974 -> 0.973.
        return GemmKnobs(parallel=parallel)
    # MAC instructions of one micro-tile's K step: one per row of C for the by-element
    # dot product, one per (row, column) pair for the widening / by-vector kernels
    # (two for widening: smull and smull2), one for a matrix instruction.
    per_tile = {"by_element": kernel.mr, "matrix": 1, "widening": 2 * kernel.mr * kernel.nr,
                "by_vector": kernel.mr * kernel.nr}[kernel.form]
    budget = NEON_REGISTERS - SCRATCH_REGISTERS
    best, best_score = (1, 1), None
    for mt in (d for d in range(1, min(mb, MAX_TILES) + 1) if mb % d == 0):
        for nt in (d for d in range(1, min(nb, MAX_TILES) + 1) if nb % d == 0):
            acc, loads = _registers(kernel, mt, nt)
            if (mt, nt) != (1, 1) and acc + loads > budget:
                continue
            macs = per_tile * mt * nt
            loads += 1  # the loop's own step
            # The requantization runs on whole int32x4 registers: an output row of
            # n_tiles * nr channels that is no multiple of 4 falls back to scalar code.
            width = nt * kernel.nr
            whole_vectors = width % EPILOGUE_LANES == 0
            epilogue = _epilogue_registers(kernel, mt, nt)
            store = min(width & -width, STORE_CHANNELS)  # largest power of two dividing it
            fits = epilogue <= NEON_REGISTERS or (kernel.form == "by_element"
                                                  and kb >= LONG_K_BLOCKS)
            score = (whole_vectors, fits, macs / max(macs, loads), store, -epilogue)
            if best_score is None or score > best_score:
                best, best_score = (mt, nt), score
    return GemmKnobs(m_tiles=best[0], n_tiles=best[1], k_unroll=2 if kb % 2 == 0 else 1,
                     parallel=parallel)


def schedule_conv2d_gemm(func, kernel, target=None, knobs: GemmKnobs = GemmKnobs()):
    """Schedule ``conv2d_gemm_func``: GEMM tiles computed where the epilogue consumes them.

    Loop nest of the result, per group g and macro tile (no, mo) of
    (m_tiles * mr) x (n_tiles * nr) outputs:

        for no (parallel):                    A_packed is built up front, rows in parallel
          for mo:                             (per-channel epilogue operands hoisted here)
            acc[m_tiles, n_tiles, mr, nr] = 0      one macro tile, never a layer-sized tensor
            for kb in K/kr (unrolled by k_unroll):
              for ti < m_tiles, tj < n_tiles (unrolled):
                acc[ti, tj] += A_packed[mo, ti, kb] . B_packed[no, tj, kb]^T   <- micro-kernel
            for each output row of the tile (unrolled):
              output[row, n_tiles * nr channels] = epilogue(acc)   (one vector)

    A row tail (``tail_kernel``) is scheduled the same way with the kernel's one-row twin
    and its ``default_knobs``, and the result has one output (``merge_outputs``).

    A kernel with a whole-K form (``kernels.has_k_loop``: neon's smull/sadalp) is
    tensorized over the kb loop instead, one K loop per micro-tile (k_unroll unused). A
    func that reads A in place (``reads_input_directly``: no A_packed stage) is tensorized
    with the kernel's direct-read form over (tj, kb): one K loop per row of micro-tiles,
    its n_tiles micro-tiles inside it (k_unroll unused). ``default_knobs`` gives good
    knobs for a layer.

    ``kernel`` is a record of ``tvm_armq.intrinsics.kernels`` whose (mr, nr, kr) the func
    was built with; a reference kernel keeps scalar loops, any other is tensorized for
    ``target`` (``MissingTargetFeature`` if the target lacks its instruction).
    ``sample_conv2d_gemm`` is the same schedule with every knob sampled.
    """
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    _schedule_body(sch, kernel, target, _fixed_tiles(sch, knobs), parallel=knobs.parallel,
                   vector_epilogue=knobs.vector_epilogue)
    _schedule_tail(sch, kernel, target, parallel=knobs.parallel)
    return merge_outputs(sch.mod["main"])


# Largest inner factor ``sample_conv2d_gemm`` draws per knob: beyond these a macro tile's
# accumulators no longer fit the 32 NEON registers, and unrolling K further only grows code.
SAMPLE_MAX_INNER = {"m_tiles": 4, "n_tiles": 4, "k_unroll": 4}


def sample_conv2d_gemm(sch, kernel, target, *, parallel: bool = True) -> None:
    """``schedule_conv2d_gemm`` as a MetaSchedule design space, in place on ``sch``.

    ``sch`` (a ``tvm.s_tir.Schedule``) holds the unscheduled PrimFunc of
    ``conv2d_gemm_func`` built with ``kernel``'s (mr, nr, kr). The loop nest is exactly the
    one ``schedule_conv2d_gemm`` makes; each of m_tiles, n_tiles and k_unroll is drawn by
    ``sch.sample_perfect_tile`` (2 factors, inner at most ``SAMPLE_MAX_INNER``) and the
    random variables feed the splits directly, so replaying or mutating the trace changes
    the tiles and every candidate stays tensorized. (A kernel tensorized over the whole K
    loop, ``kernels.has_k_loop`` with more than one K block, or read in place,
    ``reads_input_directly``, has no k_unroll; the direct-read intrinsic is registered per
    n_tiles, so there n_tiles is not sampled but fixed at its default, and m_tiles is the
    one sample: a mutated trace then always tensorizes.) ``parallel``
    is a fixed choice (it follows how the module will be run, not a
    tunable). A row tail gets its default knobs, not samples, and its two outputs stay
    apart (the tuner measures the func as built). Usable as the schedule function of
    ``tvm.s_tir.meta_schedule.space_generator.ScheduleFn``.
    """

    if kernel.intrin is None:
        raise ValueError(f"sample_conv2d_gemm: {kernel.name} is the scalar reference; the "
                         "design space is for tensorized micro-kernels")

    direct = "A_packed" not in _stage_names(sch)

    def sampled_tile(loop, knob):
        if direct and knob == "n_tiles":
            return [None, _direct_n_tiles(sch.get(loop).extent.value, kernel)]
        return list(sch.sample_perfect_tile(loop, n=2,
                                            max_innermost_factor=SAMPLE_MAX_INNER[knob]))

    _schedule_body(sch, kernel, target, sampled_tile, parallel=parallel, vector_epilogue=True)
    _schedule_tail(sch, kernel, target, parallel=parallel)


def _fixed_tiles(sch, knobs: GemmKnobs):
    """The ``tile`` function of ``_schedule_body`` for fixed ``knobs``. Knobs must divide
    the block counts: a ragged split puts a predicate on the block, which the
    micro-kernel's pattern does not match. Each is cut to the largest divisor not above it
    (the autotuner samples perfect tiles in the first place)."""
    wants = {"m_tiles": knobs.m_tiles, "n_tiles": knobs.n_tiles, "k_unroll": knobs.k_unroll}

    def fixed_tile(loop, knob):
        return [None, _largest_divisor(sch.get(loop).extent.value, wants[knob])]

    return fixed_tile


def _stage_names(sch) -> list[str]:
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def _schedule_tail(sch, kernel, target, *, parallel: bool) -> None:
    """Schedule a row tail's stages (if the func has them: ``tail_kernel``) with the
    kernel's one-row twin and the knobs ``default_knobs`` gives it."""
    from tvm_armq.intrinsics import kernels

    names = _stage_names(sch)
    if "gemm" + TAIL not in names:
        return
    twin = kernels.one_row_twin(kernel)
    direct = "A_packed" + TAIL not in names
    # the tail GEMM's block counts: loops (g, mb, nb, mr, nr, [runs,] kb, kr)
    loops = sch.get_loops(sch.get_sblock("gemm" + TAIL))
    _, mb, nb, *_, kb, _ = (sch.get(loop).extent.value for loop in loops)
    knobs = _knobs(twin, mb, nb, kb, direct, parallel)
    _schedule_body(sch, twin, target, _fixed_tiles(sch, knobs), parallel=parallel,
                   vector_epilogue=knobs.vector_epilogue, suffix=TAIL)


def _schedule_body(sch, kernel, target, tile, *, parallel: bool, vector_epilogue: bool,
                   suffix: str = "") -> None:
    """The one schedule of ``schedule_conv2d_gemm`` and ``sample_conv2d_gemm``.

    ``tile(loop, knob)`` gives the [outer, inner] split factors of ``loop`` for ``knob``
    ("m_tiles", "n_tiles" or "k_unroll"): ints, or sampled random variables. Nothing
    below branches on a factor's value, so a trace of it replays for any decision.
    ``suffix``: of the stage names, ``TAIL`` for a row tail's GEMM (which shares the
    input copies scheduled with the main one).
    """
    from tvm_armq.intrinsics import kernels

    names = _stage_names(sch)
    # A direct-read func (reads_input_directly) has no A_packed stage: its GEMM reads the
    # input in place, through the kernel's direct-read form only.
    direct = "A_packed" + suffix not in names
    if direct and not kernels.has_direct(kernel):
        raise ValueError(f"conv2d_gemm: the func reads A in place (no A_packed stage), which "
                         f"kernel {kernel.name} cannot do; build it with conv2d_gemm_func("
                         f"..., kernel={kernel.name}) or without a direct-read kernel")
    out, gemm = sch.get_sblock("output" + suffix), sch.get_sblock("gemm" + suffix)
    a_packed = None if direct else sch.get_sblock("A_packed" + suffix)
    window = window_of(sch, gemm) if direct else None
    # a direct-read conv reduces over (kernel row, K block, kk): the rows stay outermost
    g, mo, no, i, j, *k_loops = sch.get_loops(gemm)
    kb, kk = k_loops[-2:]
    # A kernel that reduces inside its block (kernels.has_k_loop) is tensorized over the
    # whole K loop, so its partial sums stay in registers across K; K is then unrolled
    # inside the instruction sequence and the k_unroll knob does not apply.
    # (One K block has no loop to keep anything across: the block intrinsic does.)
    k_blocks = sch.get(kb).extent.value
    whole_k = (not direct and kernel.intrin is not None and kernels.has_k_loop(kernel)
               and k_blocks > 1)
    mo, ti = sch.split(mo, tile(mo, "m_tiles"))
    no, tj = sch.split(no, tile(no, "n_tiles"))
    # Macro-tile columns outside, rows inside: the epilogue's per-channel parameters
    # (bias, multiplier, shift and the shifts derived from it) and the column's B blocks
    # are the same for every macro tile of the inner loop, so LLVM loads and prepares
    # them once per column instead of once per tile.
    if direct:
        # One K loop per row of micro-tiles, all n_tiles of the row inside the intrinsic
        # (they share each A row load); k_unroll does not apply.
        sch.reorder(no, mo, ti, tj, *k_loops[:-1], i, j, kk)
        k_outer, unrolled = tj, (ti,)
    elif whole_k:
        sch.reorder(no, mo, ti, tj, kb, i, j, kk)
        k_outer, unrolled = kb, (ti, tj)
    else:
        kb_o, kb_i = sch.split(kb, tile(kb, "k_unroll"))
        sch.reorder(no, mo, kb_o, kb_i, ti, tj, i, j, kk)
        k_outer, unrolled = kb_o, (kb_i, ti, tj)
    # The epilogue of a macro tile runs right after its K loop, so its accumulators are
    # dead afterwards and buffer compaction shrinks them to one macro tile.
    sch.reverse_compute_at(out, mo)
    if kernel.intrin is None:
        sch.set_scope(gemm, 0, "local")  # the scalar tile can live in registers outright
    # The pack copies kr bytes per (block row, K block): one vector (kr = 4, 8 or 16 bytes)
    # when they are consecutive channels (see im2col_packed_te), lane by lane otherwise.
    if a_packed is not None:
        sch.vectorize(sch.get_loops(a_packed)[-1])
    # the input copies (ROWS_STAGE, data_padded) are the main GEMM's to schedule
    stages = {} if suffix else {sch.get(b).name_hint: b
                                for b in sch.get_child_blocks(sch.get_sblock("root"))}
    if ROWS_STAGE in stages:
        _schedule_rows_copy(sch, stages[ROWS_STAGE], parallel)
    if "data_padded" in stages:  # the bordered input copy: rows in parallel, channels in vectors
        loops = sch.get_loops(stages["data_padded"])
        rows, channels = loops[1], loops[-1]
        sch.vectorize(channels)
        if parallel:
            sch.parallel(rows)
    if parallel:  # before the reduction is split in init + update (parallel rejects it)
        sch.parallel(no)
        if a_packed is not None:
            sch.parallel(sch.get_loops(a_packed)[1])
    sch.decompose_reduction(gemm, k_outer)
    for loop in unrolled:  # an extent-1 loop unrolls to nothing
        sch.unroll(loop)
    own = _loops_below(sch, out, mo)  # none when the macro tile is one output (ref kernel)
    if vector_epilogue and own:
        # The epilogue's innermost loop runs over the macro tile's n_tiles * nr channels
        # of one output pixel, contiguous in the output: one vector, and its int8 results
        # one store (LLVM splits it into as many NEON registers as it needs). Its other
        # loops (the tile's rows) are unrolled: every accumulator index is then a
        # constant, so LLVM reads the accumulators straight from the registers the K
        # loop left them in (rearranging lanes with shuffles) instead of spilling the
        # tile and gathering it lane by lane.
        sch.vectorize(own[-1])
        for loop in own[:-1]:
            sch.unroll(loop)
    if direct:
        n_tiles = sch.get(tj).extent.value  # a sampled n_tiles: its current decision
        kernels.tensorize(sch, tj, kernel, target, direct=(window, n_tiles))
    elif whole_k:
        kernels.tensorize(sch, kb, kernel, target, k_blocks=k_blocks)
    elif kernel.intrin is not None:
        # The micro-kernels take C as a plain (global-scope) window; the compacted
        # tile is a few dozen bytes on the stack, which LLVM keeps in registers.
        kernels.tensorize(sch, i, kernel, target)


def _schedule_rows_copy(sch, block, parallel: bool) -> None:
    """The flat-row input copy of a row-blocked im2col (``_im2col_rows_te``), in
    ``COPY_LANES`` vectors, cut where the image starts and ends (``ROWS_INTERIOR``).

    In the image's rows, the vectors holding input only are plain loads and stores (the
    cut lets the simplifier drop every bounds test), the border vectors before them are
    fills; after them, a vector mixing the row's last input elements with the border
    (when the row is no whole number of vectors) is copied element by element, each
    tested, since a vector load there could read past the input. The border rows are
    fills.
    """
    top, height, lead, whole, mixed = (int(v) for v in
                                       sch.get(block).annotations[ROWS_INTERIOR])
    _, y, t = sch.get_loops(block)
    sch.split(t, [None, COPY_LANES])
    extent = sch.get(y).extent.value
    y_top, y_mid, y_bottom = _partition(sch, y, [top, height, extent - top - height])
    for part in (y_top, y_bottom):
        if part is not None:
            sch.vectorize(sch.get_loops(_only_block(sch, part))[-1])
    vectors = sch.get_loops(_only_block(sch, y_mid))[-2]
    count = sch.get(vectors).extent.value
    parts = _partition(sch, vectors, [lead, whole, count - lead - whole])
    for idx, part in enumerate(parts):
        if part is None:
            continue
        lanes = sch.get_loops(_only_block(sch, part))[-1]
        if idx == 2 and mixed:
            # element by element: each test is then a branch, and only the input loads
            sch.unroll(lanes)
        else:
            sch.vectorize(lanes)
    if parallel:
        sch.parallel(y_mid)


def _partition(sch, loop, parts) -> list:
    """``loop`` cut into consecutive loops of the given extents (zeros skipped), in order;
    a zero-extent part gets None."""
    sizes = [p for p in parts if p]
    loops = sch.loop_partition(loop, sizes[:-1] + [None]) if len(sizes) > 1 else [loop]
    it = iter(loops)
    return [next(it) if p else None for p in parts]


def _only_block(sch, loop):
    (block,) = sch.get_child_blocks(loop)
    return block


def _loops_below(sch, block, loop) -> list:
    """The loops around ``block`` that are nested inside ``loop``."""
    loops = sch.get_loops(block)
    anchor = sch.get(loop)
    for idx, rv in enumerate(loops):
        if sch.get(rv).same_as(anchor):
            return loops[idx + 1:]
    raise ValueError("block is not under the given loop")


def _largest_divisor(extent: int, want: int) -> int:
    return max(d for d in range(1, max(1, min(want, extent)) + 1) if extent % d == 0)
