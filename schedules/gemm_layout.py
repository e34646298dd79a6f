"""Where a conv2d GEMM's operands lie: the layer's geometry, the packed layouts of A and
B, and the windows of the input a GEMM can read A from in place.

A convolution with output pixels M = batch * out_h * out_w, reduction K = kh * kw * in_c
and output channels N is the product of two matrices:

    A[M, K]  the im2col of the input: row m = one output pixel's receptive field,
             in (ky, kx, c) order; padded pixels hold the input zero point
    B[K, N]  the weights, HWIO flattened (symmetric int8: zero point 0)

packed for a micro-kernel's mr x nr x kr block (``intrinsics/kernels.py``) so that each
block is contiguous:

    A_packed[M/mr, K/kr, mr, kr]    built per inference (im2col fused with packing)
    B_packed[N/nr, K/kr, nr, kr]    built once, at compile time (``pack_weights``)

K is padded up to the block with zeros (zeros in the K padding of both operands add
nothing); M is padded with copies of the last row of A (computed, never stored). Groups
give every packed operand a leading group axis: ``groups`` independent GEMMs over their
own slices of input and output channels.

Few channels (``few_channels``: an ungrouped layer whose input channels are not whole K
blocks, e.g. an RGB stem with 3 channels): a kernel row's kw * in_c bytes lie side by side
in an NHWC image, so A is packed from the input copied row by row (``RowsCopy``), a vector
load per kernel row a block covers. K is laid out one kernel row at a time, each row
padded to whole K blocks (``row_blocked_k``: each block one load), where that takes no
more blocks than K packed densely; else K is dense (a 3x3 stem at kr = 16: 27 -> 32
instead of 3 rows of 16, K = 48, a third of the K loop's work on zeros), each block put
together from the rows it covers by selects, which LLVM turns into a blend of two loads.

Read in place (``direct_window``): where each row of A is a few runs of contiguous input
bytes, a kernel with a DIRECT form reads them where they lie, with no A_packed at all:

    1x1 stride 1      A *is* the input: row m = pixel m's channels, one run of K bytes
    kh x kw           row m = output pixel m's window: kh runs (kernel rows) of kw * in_c
                      bytes, in the input or its bordered copy; the mr rows of a
                      micro-tile are mr consecutive pixels of one output row
    by pixel          the same runs, each row at its own output pixel, so a micro-tile
                      may cross output rows (the INDIRECT form: 14 x 14, 7 x 7 maps)

Zero points: TFLite computes sum_k (a - zp_a) * w + bias. With w symmetric this is
sum_k a * w - zp_a * sum_k w + bias, and the last two terms are constants of the layer:
``fold_bias`` merges them into one int32 vector at compile time, so the GEMM runs on raw
int8 input. Padding with zp_a keeps the identity exact.
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
        return row_blocked_k(self.kh, self.kw, self.group_in_c, self.groups, kr, dtype,
                             self.gemm_n)

    def packed_k(self, kr: int, dtype: str) -> int:
        """K of the packed operands (element type ``dtype``) in K blocks of kr, padding
        included."""
        row = self.kernel_row_k(kr, dtype)
        return self.kh * row if row is not None else ceil_div(self.gemm_k, kr) * kr

    def kernel_row_blocks(self, kr: int) -> int | None:
        """K blocks of one kernel row when each kernel row is whole blocks of consecutive
        channels (cg % kr == 0, not pointwise): the im2col's K loop then splits into
        (kernel row, block in the row), and within a row a block's input offset is affine
        in the block (no division per block). None otherwise."""
        if self.is_pointwise or self.group_in_c % kr:
            return None
        return self.kw * self.group_in_c // kr

    @property
    def is_pointwise(self) -> bool:
        """1x1, stride 1, no padding: A is the input itself, no im2col gather needed."""
        return (self.kh, self.kw, self.strides, self.padding) == (1, 1, (1, 1), (0, 0, 0, 0))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def few_channels(cg: int, groups: int, kr: int, dtype) -> bool:
    """Whether a layer's A is packed from the row copy (module docstring: few channels): an
    ungrouped layer of integer operands (``dtype``) whose input channels cg are no multiple
    of kr. Integer only: a block reads whatever input lies beside the window (times a zero
    weight, or dropped by a select), and in floating point a zero times an infinity or NaN
    there would not be zero."""
    return groups == 1 and cg % kr != 0 and str(dtype).startswith(("int", "uint"))


# Dense K pays where it saves an output pixel at least this many multiply-accumulates
# (K elements of padding times the group's output channels): its pack costs more per block
# than the row-blocked one, a blend of two loads for a block spanning kernel rows. Measured
# on MobileNetV1 0.25's RGB stem (8 channels out, estimate, armperf 4): at dotprod 8 bytes
# saved (36 -> 28), 64 MACs a pixel, 1.256e5 -> 1.319e5 est. cycles, row-blocked kept; at
# i8mm 16 (48 -> 32), 128 MACs, a gain (the net 7.33e5 -> 7.21e5).
DENSE_K_MIN_SAVED_MACS = 128


def row_blocked_k(kh: int, kw: int, cg: int, groups: int, kr: int, dtype,
                  n: int) -> int | None:
    """The K elements of one kernel row when K is laid out in whole blocks per kernel row
    (module docstring: few channels), else None (K packed densely, padded at its end).

    Row-blocked: a few-channel layer (``few_channels``) whose kernel rows, each padded up
    to whole blocks, take no more blocks than K packed densely, or save fewer than
    ``DENSE_K_MIN_SAVED_MACS`` per output pixel over the group's ``n`` output channels:
    each block of A is then one load. Where the padding costs more (an RGB stem at kr =
    16: 3 rows of 16 bytes, K = 48, where 27 bytes packed densely take 32), K is dense and
    each block of A is put together from the kernel rows it covers (``gemm_compute``: a
    load per row and a select), which costs less than the multiply-accumulates of the
    padding.
    """
    if not few_channels(cg, groups, kr, dtype):
        return None
    row = ceil_div(kw * cg, kr) * kr
    saved = kh * row - ceil_div(kh * kw * cg, kr) * kr
    if saved > 0 and saved * n >= DENSE_K_MIN_SAVED_MACS:
        return None
    return row


def pack_weights(weight_hwio: np.ndarray, mr_nr_kr, groups: int = 1) -> np.ndarray:
    """HWIO weights -> B_packed[groups, N/nr, K/kr, nr, kr], zero padded (K row-blocked
    where ``row_blocked_k`` says so).

    Runs once, at compile time (the weights are constants of the model).
    """
    _, nr, kr = mr_nr_kr
    kh, kw, cg, n = weight_hwio.shape
    k, ng = kh * kw * cg, n // groups
    row = row_blocked_k(kh, kw, cg, groups, kr, weight_hwio.dtype, ng)
    if row is not None:  # each kernel row's kw * cg bytes, then zeros up to the row's blocks
        w = np.zeros((kh, row, n), weight_hwio.dtype)
        w[:, :kw * cg] = weight_hwio.reshape(kh, kw * cg, n)
        weight_hwio, k = w.reshape(kh, 1, row, n), kh * row
    b = np.zeros((groups, ceil_div(ng, nr) * nr, ceil_div(k, kr) * kr), weight_hwio.dtype)
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


def direct_window(shape: Conv2DShape, mr_nr_kr, rows: int | None = None, *,
                  by_pixel: bool = False):
    """Where the GEMM of ``shape`` would find its rows of A in the input, read in place
    (``forms.DirectWindow``, offsets into the input, or into its bordered copy
    ``data_padded`` when the layer pads), or None where A cannot be read in place:

    * pointwise (1x1, stride 1, unpadded): A is the input, K contiguous elements per row;
      M must be whole micro-tiles;
    * kh x kw, any stride and padding, columns not dilated: row i of a micro-tile is
      output pixel ow0 + i of one output row (so out_w must be whole micro-tiles), and
      its K elements are the kh kernel rows of kw * C contiguous input elements each.

    Both: ungrouped, and runs of at least two whole K blocks (K, resp. C, a multiple of
    kr, so B is packed densely: ``row_blocked_k`` is None; a run of one block would leave
    a unit K loop, which the intrinsic's pattern does not match).

    ``rows``: the GEMM's rows that are read (a row tail is a GEMM of its own), all of M if
    None.

    ``by_pixel``: the window of the INDIRECT form instead (``DirectWindow.of_pixels``):
    each row of a micro-tile at its own output pixel, so out_w need not be whole
    micro-tiles, nor M (the last micro-tile repeats the last pixel); a kh x kw (or
    strided, or padded 1x1) layer with the conditions above but that one. A pointwise
    layer's rows are consecutive anyway: None.
    """
    from tvm_armq.intrinsics.forms import DirectWindow

    mr, _, kr = mr_nr_kr
    s = shape
    if s.groups != 1:
        return None
    if by_pixel:
        if s.is_pointwise or s.dilation[1] != 1 or s.in_c % kr or s.kw * s.in_c < 2 * kr:
            return None
        _, pl, _, pr = s.padding
        width = s.in_w + pl + pr
        return DirectWindow.of_pixels(s.kw * s.in_c, s.kh, s.dilation[0] * width * s.in_c)
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


# The input copies a GEMM's A can be read from (``input_copy``), by their stage names.
BORDERED = "data_padded"  # the input inside a border of the zero point, as wide as the padding
ROWS = "data_rows"        # the input's rows flattened, bordered, in whole vectors (RowsCopy)
COPY_LANES = 16  # elements per vector of the row copy: one NEON register of int8


def input_copy(shape: Conv2DShape, kr: int, dtype: str, direct: bool) -> str | None:
    """The copy of the input the GEMM of ``shape`` reads A from (``BORDERED``, ``ROWS``),
    or None when it reads the input itself.

    Read in place (``direct``): the bordered copy when the layer pads (a window then needs
    no bounds test). Packed: a row-blocked K (``row_blocked_k``) with undilated columns
    packs from the row copy, one vector per block; with whole channel blocks and padding
    from the bordered copy (one pass over the input, after which the im2col moves kr-byte
    vectors with no bounds test, which is most of its cost otherwise); else the input
    itself, each element tested."""
    if direct:
        return BORDERED if any(shape.padding) else None
    if shape.is_pointwise:
        return None
    if few_channels(shape.group_in_c, shape.groups, kr, dtype) and shape.dilation[1] == 1:
        return ROWS
    if shape.group_in_c % kr == 0 and any(shape.padding):
        return BORDERED
    return None


@dataclasses.dataclass(frozen=True)
class RowsCopy:
    """The row copy of a row-blocked im2col: ``data_rows[batch, pt + H + pb, length]``,
    each padded image row flattened to its (x, c) elements in whole ``COPY_LANES`` vectors:

        | lead | left border | the row's W * C input elements | right border | slack |
          lead: so the input's elements start a vector (the copy is then whole vector
                loads and stores with no test; the schedule cuts the row there), and a
                vector more where K is dense (``dense``)
          slack: the last block of a window row covers up to ``kernel_row_k - kw * C``
                elements past the window (their weights are 0), or up to kr - 1 where K
                is dense (their lanes are dropped); they stay in the row

    with the top and bottom border rows all pad. ``first``: where the input's elements
    start; ``inner``: how many there are (W * C). The schedule cuts each image row into
    ``lead_vectors`` border vectors, ``whole_vectors`` of input only and, if ``mixed``,
    one vector mixing the row's last input elements with the border.
    """

    top: int             # border rows above the image (padding top)
    height: int          # image rows
    lead: int
    first: int
    inner: int
    length: int          # elements per copied row, whole vectors
    dense: bool          # K packed densely from it (``row_blocked_k`` None), not row-blocked

    @property
    def lead_vectors(self) -> int:
        return self.first // COPY_LANES

    @property
    def whole_vectors(self) -> int:
        return self.inner // COPY_LANES

    @property
    def mixed(self) -> bool:
        return self.inner % COPY_LANES != 0


def rows_copy(shape: Conv2DShape, kr: int, dtype: str) -> RowsCopy:
    """The ``RowsCopy`` of a few-channel layer (``input_copy`` is ``ROWS``). K row-blocked:
    a window row's last block reads up to ``kernel_row_k - kw * C`` elements past it. K
    dense: a block reads up to kr - 1 elements before and after each kernel row it covers
    (one vector load per row, the other rows' lanes dropped), so the row starts a vector
    later and ends a vector past the last window's end, and every such load stays in it."""
    s, c = shape, shape.in_c
    row = s.kernel_row_k(kr, dtype)
    pt, pl, _, pr = s.padding
    left, inner = pl * c, s.in_w * c
    lead = -left % COPY_LANES + (COPY_LANES if row is None else 0)
    first = lead + left
    used = first + inner + pr * c + (row - s.kw * c if row is not None else kr)
    return RowsCopy(pt, s.in_h, lead, first, inner, ceil_div(used, COPY_LANES) * COPY_LANES,
                    dense=row is None)

