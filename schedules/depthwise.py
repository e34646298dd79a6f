"""Quantized NHWC depthwise conv2d: channels in NEON lanes, widening multiply-accumulates or sdot.

Read this first. TFLite's DEPTHWISE_CONV_2D with depth multiplier M computes output
channel ``oc = c * M + m`` from input channel ``c`` alone:

    acc[oc] = sum_{ky,kx} (x[oh*sh + ky*dh - pt, ow*sw + kx*dw - pl, c] - zp_in) * w[ky, kx, oc]
              + bias[oc]
    out[oc] = clamp(qmuls(acc[oc], multiplier[oc], 31, shift[oc]) + zp_out, lo, hi)

with weights as TFLite stores them, ``[1, kh, kw, C * M]``, and padded pixels equal to
``zp_in`` (they add nothing). There is no reduction over channels, so a GEMM would waste
its K dimension; this schedule puts 16 channels (one int8x16 register) in the vector
lanes and keeps the kh * kw taps unrolled in registers.

Arithmetic, and why it is exact
-------------------------------
``x - zp_in`` ranges over [-255, 255] and does not fit int8, so the zero point is folded
into the bias, as ``gemm_layout.fold_bias`` does (``fold_bias`` here):

    acc = sum_taps x * w  +  (bias - zp_in * sum_taps w)          (bias_folded, per channel)

and the kernel multiplies raw int8 by int8. Padded pixels hold ``zp_in``, so they add
``zp_in * w``, which the folded term takes away again: the identity holds at the borders.

Products: x in [-128, 127] and TFLite's int8 weights are symmetric, w in [-127, 127], so
``|x * w| <= 128 * 127 = 16256`` and the sum of *two* products is at most 32512 < 2**15:
it fits int16. (With w = -128 allowed, two products of (-128) x (-128) would reach 32768
and wrap; that is the only overflowing case.) So taps are taken in pairs:

    s = int16(x0) * int16(w0) + int16(x1) * int16(w1)      smull / smull2, smlal / smlal2
    acc += int32(s)                                         saddw / saddw2

4 instructions per 2 taps per 8 channels (an odd last tap: smull + saddw). The int32
accumulator starts at ``bias_folded`` and adds the pair sums: int32 additions wrap modulo
2**32, so their order cannot change the final value, and that value is TFLite's own int32
accumulator (sum of (x - zp_in) * w, + bias), so it fits. ``int16_pairs=False`` widens
every product on its own (smull + saddw, exact for any int8 weights, 6 instead of 4
instructions per tap per 16 channels); ``pack_weights`` refuses weights containing -128
for the paired form, so the int16 sum can never wrap.

Taps in fours through sdot (``lane_dots``, levels with +dotprod)
------------------------------------------------------------------
``sdot`` adds four int8 products into each int32 lane, exactly, and runs on both of the
N1's and N2's vector pipes, where ``smull``/``smlal`` run on one. Its four bytes per lane
must be four taps of one channel, so ``lane_dot.lane_dot4`` interleaves the four taps'
vectors (8 zips per 16 channels; the weights' zips are loop-invariant and hoisted):

    acc = bias_folded + dot(x[t0..t3], w[t0..t3]) + dot(x[t4..t7], w[t4..t7]) + ...

and the taps left over (a 3x3's ninth) take the widening form above (kernels of at most
``DOT_MAX_TAPS`` taps; a 5x5 keeps the widening form). Per 16 channels of a 3x3 interior
pixel: 16 zips + 8 sdot + 2 smull + 4 saddw against 18
smull/smlal + 16 saddw, the multiplies all on one pipe: llvm-mca's neoverse-n1 prices
the hot loop 27 cycles against 35 (MobileNetV2 1.0's depthwise layers at dotprod,
``estimate``: 4.99e6 -> 3.97e6 est. cycles; at i8mm, neoverse-n2: 3.87e6 -> 3.65e6).

Requantization is ``qmuls(acc, multiplier[oc], 31, shift[oc])`` per lane (sqrdmulh +
rounding shift on aarch64), then + zp_out, the activation clamp and the narrowing to int8,
all on registers: no int32 tensor is written to memory. ``max_shift`` (the largest shift of
the layer's channels, known at compile time) builds a form for it: at most 0
(requantization scales below 1, what real layers have), no per-channel left shift (ushl);
at most -1, also a one-instruction rounding fixup (``intrinsics.qmuls``). With
``min_shift`` too, a kernel of at most ``NARROW_MAX_TAPS`` taps ends in
``qmuls.requantize_narrow`` (the rounding shift, zero point and clamp on 16-bit lanes: half
the cost on the core models). A 5x5 kernel keeps the int32 form: its 25 weight vectors
already fill the registers, and the narrow form's hoisted shift and constant vectors made
LLVM spill (EfficientNet-B1's 5x5 layers at dotprod, ``estimate``: 5.94e5 est. cycles with
the int32 form, 6.36e5 narrowed; its 3x3 layers 4.57e5 -> 4.22e5 narrowed).
``pack_params`` refuses a shift outside what the func was built for.

Operands (``pack_params``, once, at compile time)
-------------------------------------------------
``weight_packed[kh, kw, M, C_pad]`` (TFLite's ``[1, kh, kw, C*M]`` with each multiplier
slice a separate run of channels, so every weight and input load is a contiguous vector)
and ``bias_folded``, ``multiplier``, ``shift`` over ``C_pad * M`` channels. ``C_pad`` is C
for M = 1 and C rounded up to the channel block for M > 1 (zero channels).

Multiplier 1: the input read directly (``_schedule_direct``)
--------------------------------------------------------------
The padded input and the accumulator are inlined into the output block, and the output
is cut into regions along rows, columns and channels (``Schedule.loop_partition``)::

    for each row region (top border | interior | bottom border), rows in parallel:
      for each column region (left border | interior | right border):
        for each channel part (C // cb blocks | the C % cb remainder, a narrower vector):
          for cb_i:                             the block's weights stay in registers
            for ow:
              for c in cb (vectorized):         bias + int32(pair sums): smull/smlal, saddw
                output = clamp(qmuls(...) + zp_out)                sqrdmulh, srshl, narrow

In the interior every tap is a plain vector load of the input (the pad's conditions fold
away); in a border region the taps that can only see padding become the constant zp_in.
No padded copy of the input is made. A region may keep conditions when the input is
smaller than the kernel's reach; they are scalar per pixel, the channels stay vectorized.

Multiplier 1, more than 3x3 taps: a padded copy (``_schedule_padded``)
-----------------------------------------------------------------------
Border regions of a 5x5 kernel run code two to three times slower per pixel than the
interior, and on the small maps where such kernels sit most pixels are border pixels
(``PADDED_COPY_MIN_TAPS``). So a stride-1 layer with padding and more than nine taps
first copies its input into a buffer with the zp_in border (rows in parallel, 16-byte
vectors), then computes every output pixel as the interior does. The copy costs a load
and a store per 16 input bytes; the taps cost 25 multiply-accumulates per 16 output bytes.

Multiplier > 1: a padded copy, then per-pixel accumulators (``_schedule_staged``)
-------------------------------------------------------------------------------------
Output channel c * M + m reads input channel c, so output lanes would gather input bytes.
Instead the accumulators are vectors over input channels, one per m, and the epilogue
interleaves them (lane oc <- acc[oc % M][oc // M]: zip1/zip2 on registers) so the store of
cb * M output channels stays one contiguous vector::

    pad [N, H+pt+pb, W+pl+pr, C_pad]: rows in parallel, c vectorized    (zp_in border)
    for row in N * OH (parallel):
      for cb_i in C_pad / cb:
        for ow:
          acc[M][cb] = bias + int32(pair sums)      int32 vectors in registers
          for oc in cb * M (vectorized): requant = clamp(qmuls(acc[oc % M][oc // M]) + zp)
      (copy of the row's first C * M channels to the output, when C_pad != C)

Blocks, by name: ``pad``, ``acc``, ``requant`` (only with padded channels) and ``output``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .tir_util import vectorize_in_registers
from .window import Window2D

LANES = 16  # int8 lanes in one 128-bit NEON register


@dataclasses.dataclass(frozen=True)
class DepthwiseShape(Window2D):
    """A quantized NHWC depthwise conv2d's geometry. Padding is (top, left, bottom, right)."""

    batch: int
    in_h: int
    in_w: int
    channels: int
    multiplier: int = 1
    kh: int = 3
    kw: int = 3
    strides: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def out_c(self) -> int:
        return self.channels * self.multiplier

    @property
    def taps(self) -> int:
        return self.kh * self.kw


def default_channel_block(shape: DepthwiseShape) -> int:
    """Input channels per vector: 16 (one int8x16 register); with a depth multiplier, 8
    when that avoids padding channels (C = 8, 24, ...)."""
    c = shape.channels
    if shape.multiplier == 1:
        return min(LANES, c)  # the remainder is a narrower vector of its own
    return 8 if c % LANES and c % 8 == 0 else LANES


# Fewest taps for which a multiplier-1 layer with padding reads a padded copy of its input
# rather than the input in place. In place, the border regions get code of their own per
# subset of taps that see the input; for a 3x3 kernel that code is nearly as fast as the
# interior's and the copy does not pay (estimated cycles at dotprod, neoverse-n1, in place /
# padded copy: 3x3 s1 at 56x56x144 0.96, 7x7x960 0.93); for 5x5 it is two to three times
# slower per pixel, and the border is most of a small map (5x5 s1 at 16x16x144 1.62,
# 8x8x480 2.14, 4x4x672 2.52). Stride 2 keeps the input in place (5x5 s2 at 32x32x96 0.96).
PADDED_COPY_MIN_TAPS = 10
# The most taps a kernel may have for its output step to narrow to 16 bits first (module
# docstring): 3x3 narrows, 5x5 keeps the int32 form, which spills less there.
NARROW_MAX_TAPS = 9
# The most taps a kernel may have for its taps to go through sdot (``lane_dots``): a 5x5's
# six groups of interleaved weights would take 24 registers, and LLVM needs 16 s to 2
# minutes to compile one such layer (0.7 s for a 3x3), so a 5x5 keeps the widening form.
DOT_MAX_TAPS = 9


def default_padded_copy(shape: DepthwiseShape) -> bool:
    """Whether ``schedule_depthwise`` reads a padded copy of the input by default: a
    multiplier-1, stride-1 layer with padding and more than 3x3 taps."""
    return (shape.multiplier == 1 and any(shape.padding) and shape.strides == (1, 1)
            and shape.taps >= PADDED_COPY_MIN_TAPS)


# Pool sizes a multiplier-1 layer read in place is balanced for. The pool's size is known
# only when the library runs, so the parallel axis is the one whose busiest thread is
# closest to the mean at every size here (``default_parallel_axis``).
BALANCE_THREADS = (2, 4)


def _busiest_over_mean(loops, threads: int) -> float:
    """The busiest thread's share of the work over the mean, for a run of loops each
    given as (tasks, parallel): a parallel loop hands every thread a contiguous run of
    ceil(tasks / threads) tasks, the calling thread the first; a serial one runs on the
    calling thread alone. Tasks are taken as equal work."""
    busiest = sum(-(-tasks // threads) if par else tasks for tasks, par in loops)
    return busiest * threads / sum(tasks for tasks, _ in loops)


def default_parallel_axis(shape: DepthwiseShape, channel_block: int,
                          parallel_min_rows: int = 2) -> str:
    """What the in-place form (multiplier 1, ``_schedule_direct``) runs in parallel:
    "rows", each row region its own parallel loop (a region of fewer than
    ``parallel_min_rows`` rows - a one-row border - runs on the calling thread), or
    "channels", one parallel loop over channel blocks with every region inside (only
    when the blocks cover the channels, C % cb == 0). Rows unless channel blocks split
    more evenly at some pool size of ``BALANCE_THREADS`` and no worse at the others: on
    the 14x14 and 7x7 maps the border rows are a seventh to two fifths of the work, and
    the channels (8 to 60 blocks) split with none left over."""
    s = shape
    if s.multiplier != 1 or s.channels % channel_block:
        return "rows"
    rows = [(r, r >= max(parallel_min_rows, 2)) for r in _row_regions(s)]
    blocks = [(s.channels // channel_block, True)]
    by_rows = [_busiest_over_mean(rows, t) for t in BALANCE_THREADS]
    by_blocks = [_busiest_over_mean(blocks, t) for t in BALANCE_THREADS]
    return "channels" if max(by_blocks) < max(by_rows) else "rows"


def padded_channels(shape: DepthwiseShape, channel_block: int) -> int:
    """C_pad: C for multiplier 1 (no padding); else C rounded up to the channel block."""
    if shape.multiplier == 1:
        return shape.channels
    return -(-shape.channels // channel_block) * channel_block


def pack_weights(weight, shape: DepthwiseShape, channel_block: int,
                 int16_pairs: bool = True) -> np.ndarray:
    """TFLite's [1, kh, kw, C*M] (or [kh, kw, C*M]) -> weight_packed[kh, kw, M, C_pad].

    Runs once, at compile time. Zero channels pad C up to the channel block. With
    ``int16_pairs`` (two products summed in int16) a weight of -128 could overflow, so it
    is refused: TFLite's int8 weights are symmetric, [-127, 127].
    """
    s = shape
    w = np.asarray(weight)
    if w.dtype != np.int8:
        raise TypeError(f"depthwise weights must be int8, got {w.dtype}")
    w = w.reshape(s.kh, s.kw, s.channels, s.multiplier)  # oc = c * M + m
    if int16_pairs and (w == -128).any():
        raise ValueError("a weight of -128 can overflow the int16 sum of two products: "
                         "use int16_pairs=False (TFLite's int8 weights are in [-127, 127])")
    cpad = padded_channels(s, channel_block)
    out = np.zeros((s.kh, s.kw, s.multiplier, cpad), np.int8)
    out[:, :, :, :s.channels] = w.transpose(0, 1, 3, 2)
    return out


def fold_bias(weight, bias, in_zp: int, shape: DepthwiseShape) -> np.ndarray:
    """bias - zp_in * sum over taps of w: one int32 per output channel ([C*M])."""
    w = np.asarray(weight, np.int64).reshape(shape.kh * shape.kw, shape.out_c)
    folded = np.asarray(bias, np.int64) - in_zp * w.sum(axis=0)
    assert np.abs(folded).max(initial=0) < 2 ** 31
    return folded.astype(np.int32)


def pack_params(weight, bias, multiplier, shift, shape: DepthwiseShape, *, in_zp: int,
                channel_block: int | None = None, int16_pairs: bool = True,
                max_shift: int | None = None, min_shift: int | None = None):
    """All compile-time operands of ``depthwise_func``, in its parameter order after data:
    [weight_packed, bias_folded, multiplier, shift] (the last three padded to C_pad * M).

    ``int16_pairs``, ``max_shift`` and ``min_shift`` must be the func's: no shift may lie
    outside [min_shift, max_shift] (None: unbounded)."""
    s = shape
    if max_shift is not None and (np.asarray(shift) > max_shift).any():
        raise ValueError(f"depthwise: a shift of {int(np.max(shift))} exceeds the func's "
                         f"max_shift={max_shift}")
    if min_shift is not None and (np.asarray(shift) < min_shift).any():
        raise ValueError(f"depthwise: a shift of {int(np.min(shift))} is below the func's "
                         f"min_shift={min_shift}")
    cb = channel_block or default_channel_block(s)
    opad = padded_channels(s, cb) * s.multiplier

    def pad(v):
        out = np.zeros(opad, np.int32)
        out[:s.out_c] = np.broadcast_to(np.asarray(v, np.int32), (s.out_c,))
        return out

    return [pack_weights(weight, s, cb, int16_pairs), pad(fold_bias(weight, bias, in_zp, s)),
            pad(multiplier), pad(shift)]


def depthwise_te(shape: DepthwiseShape, *, in_zp: int, out_zp: int, act_range=(-128, 127),
                 channel_block: int | None = None, int16_pairs: bool = True,
                 max_shift: int | None = None, min_shift: int | None = None,
                 lane_dots: bool = False):
    """TE tensors of the depthwise conv2d: (inputs..., output) for ``te.create_prim_func``.

    Inputs: data NHWC [N, H, W, C] int8, weight_packed [kh, kw, M, C_pad] int8,
    bias_folded, multiplier, shift [C_pad * M] int32. Output: NHWC [N, OH, OW, C * M] int8.
    Stages as in the module docstring; ``act_range`` is the clamp (fused ReLU/ReLU6).
    ``int16_pairs``: two taps' products summed in int16 (weights in [-127, 127]);
    ``max_shift``, ``min_shift``: the largest and smallest shift of any channel, None if
    unknown (module docstring); with both, the int8 narrowing of ``qmuls.requantize_narrow``.
    ``lane_dots``: taps in groups of four through ``lane_dot.lane_dot4`` (sdot; build it
    only for a target with +dotprod), the taps left over as ``int16_pairs`` says.
    """
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import bounded_shift, requantize_narrow

    s = shape
    cb = channel_block or default_channel_block(s)
    cpad = padded_channels(s, cb)
    mlt = s.multiplier
    data = te.placeholder((s.batch, s.in_h, s.in_w, s.channels), "int8", "data")
    weight = te.placeholder((s.kh, s.kw, mlt, cpad), "int8", "weight_packed")
    bias = te.placeholder((cpad * mlt,), "int32", "bias_folded")
    mult = te.placeholder((cpad * mlt,), "int32", "multiplier")
    shift = te.placeholder((cpad * mlt,), "int32", "shift")
    acc = accumulate_te(s, data, weight, lambda n, oc: bias[oc].asobject(),
                        lambda n: tirx.const(in_zp, "int8"), channel_block=cb,
                        int16_pairs=int16_pairs, lane_dots=lane_dots)
    lo, hi = act_range
    narrow_below = min_shift if s.taps <= NARROW_MAX_TAPS else None  # see the module

    def requant_element(n, oh, ow, oc):
        x = acc[n, oh, ow, oc % mlt, oc // mlt].asobject()
        return requantize_narrow(x, mult[oc].asobject(),
                                 bounded_shift(shift[oc].asobject(), max_shift, narrow_below),
                                 out_zp, lo, hi)

    out = output_te(s, cb, requant_element)
    return data, weight, bias, mult, shift, out


def accumulate_te(shape: DepthwiseShape, data, weight, start, pad_value, *,
                  channel_block: int | None = None, int16_pairs: bool = True,
                  lane_dots: bool = False):
    """The ``acc`` stage, int32 [N, OH, OW, M, C_pad]: ``start(n, oc)`` plus every tap's
    product, over ``data`` [N, H, W, C] int8 and ``weight`` [kh, kw, M, C_pad] int8 (as
    ``pack_weights`` lays it), read through a ``pad`` stage holding ``pad_value(n)`` (int8)
    outside the image, when the layer has padding or padded channels. The taps as
    ``depthwise_te`` says (``int16_pairs``, ``lane_dots``); ``depthwise_te`` starts from the
    folded bias, the hybrid kernel from its run-time zero point's term."""
    from tvm import te, tirx

    from tvm_armq.intrinsics.lane_dot import TAPS as DOT_TAPS
    from tvm_armq.intrinsics.lane_dot import lane_dot4

    s = shape
    cb = channel_block or default_channel_block(s)
    cpad = padded_channels(s, cb)
    mlt = s.multiplier
    pt, pl, pb, pr = s.padding
    (sh, sw), (dh, dw) = s.strides, s.dilation
    taps = s.taps
    group = 2 if int16_pairs else 1

    if any(s.padding) or cpad != s.channels:
        def pad_element(n, h, w, c):
            inside = tirx.all(h >= pt, h < s.in_h + pt, w >= pl, w < s.in_w + pl, c < s.channels)
            return tirx.if_then_else(inside, data[n, h - pt, w - pl, c], pad_value(n))

        xp = te.compute((s.batch, s.in_h + pt + pb, s.in_w + pl + pr, cpad), pad_element,
                        name="pad")
    else:
        xp = data

    def operands(n, oh, ow, m, c, t):
        ky, kx = divmod(t, s.kw)
        return xp[n, oh * sh + ky * dh, ow * sw + kx * dw, c], weight[ky, kx, m, c]

    def product(n, oh, ow, m, c, t):
        x, w = operands(n, oh, ow, m, c, t)
        return x.astype("int16") * w.astype("int16")

    dotted = taps // DOT_TAPS * DOT_TAPS if lane_dots else 0

    def acc_element(n, oh, ow, m, c):
        # The taps are written out (unrolled by construction). With lane_dots, groups of
        # four go through lane_dot4 first: start + dot(x0..x3, w0..w3) + ... Then one int16
        # sum per group of ``group`` taps, each widened and added to the int32
        # accumulator: + int32(p0 + p1) + ...
        total = start(n, c * mlt + m)
        for first in range(0, dotted, DOT_TAPS):
            pairs = [operands(n, oh, ow, m, c, t) for t in range(first, first + DOT_TAPS)]
            total = lane_dot4(total, [x.asobject() for x, _ in pairs],
                              [w.asobject() for _, w in pairs])
        for first in range(dotted, taps, group):
            pair = None
            for t in range(first, min(first + group, taps)):
                p = product(n, oh, ow, m, c, t)
                pair = p if pair is None else pair + p
            total = total + pair.astype("int32")
        return total

    return te.compute((s.batch, s.out_h, s.out_w, mlt, cpad), acc_element, name="acc")


def output_te(shape: DepthwiseShape, channel_block: int, element):
    """The ``output`` stage [N, OH, OW, C * M] of ``element(n, oh, ow, oc)`` (the epilogue
    of one output channel, reading ``acc``); with padded channels a ``requant`` stage over
    all C_pad * M channels first, then the copy of the first C * M."""
    from tvm import te

    s = shape
    cpad = padded_channels(s, channel_block)
    if cpad == s.channels:
        return te.compute((s.batch, s.out_h, s.out_w, s.out_c), element, name="output")
    res = te.compute((s.batch, s.out_h, s.out_w, cpad * s.multiplier), element,
                     name="requant")
    return te.compute((s.batch, s.out_h, s.out_w, s.out_c),
                      lambda n, oh, ow, oc: res[n, oh, ow, oc], name="output")


def depthwise_func(shape: DepthwiseShape, **kwargs):
    """The depthwise conv2d as one TIR PrimFunc, unscheduled (see ``depthwise_te``)."""
    from tvm import te

    return te.create_prim_func(list(depthwise_te(shape, **kwargs)))


def _regions(n_out: int, size: int, pad_before: int, k: int, stride: int, dil: int):
    """Output indices along one axis cut in (border, interior, border): the sizes of the
    runs whose windows reach into the top/left padding, stay inside, reach the bottom/right
    padding (empty runs left out). In the interior every tap reads the input itself."""
    first = min(-(-pad_before // stride), n_out)  # first output whose window starts inside
    # one past the last output whose window ends inside
    stop = max(min((size - 1 + pad_before - (k - 1) * dil) // stride + 1, n_out), first)
    return [int(e) for e in (first, stop - first, n_out - stop) if e > 0]


def _row_regions(s: DepthwiseShape):
    return _regions(s.out_h, s.in_h, s.padding[0], s.kh, s.strides[0], s.dilation[0])


def _column_regions(s: DepthwiseShape):
    return _regions(s.out_w, s.in_w, s.padding[1], s.kw, s.strides[1], s.dilation[1])


def _inline_into_output(sch):
    """The padded input (if any) and the accumulator inlined: the in-place forms have no
    buffer between input and output."""
    blocks = {sch.get(b).name_hint: b for b in _leaves(sch)}
    if "pad" in blocks:
        sch.compute_inline(blocks["pad"])
    sch.compute_inline(blocks["acc"])


def _leaves(sch):
    out = []

    def walk(b):
        kids = sch.get_child_blocks(b)
        if not kids:
            out.append(b)
        for k in kids:
            walk(k)

    walk(sch.get_sblock("root"))
    return out


def _loop(sch, block, prefix: str):
    """The loop above ``block`` whose variable is ``prefix`` or a partition/split of it;
    None when there is none (a partition of extent 1 has no loop)."""
    loops = [lp for lp in sch.get_loops(block)
             if sch.get(lp).loop_var.name.rstrip("0123456789_") == prefix]
    assert len(loops) <= 1, prefix
    return loops[0] if loops else None


def _partition(sch, blocks, prefix: str, sizes):
    if len(sizes) > 1:
        for b in blocks:
            sch.loop_partition(_loop(sch, b, prefix), list(sizes[:-1]) + [None])


def schedule_depthwise(func, shape: DepthwiseShape, *, channel_block: int | None = None,
                       parallel: bool = True, parallel_min_rows: int = 2,
                       padded_copy: bool | None = None, parallel_axis: str | None = None):
    """Schedule ``depthwise_func(shape, ...)`` (built with the same ``channel_block``).

    The loop nests are in the module docstring: multiplier 1 reads the input directly,
    the border regions of the output apart from the interior; a multiplier > 1 goes
    through the padded copy. The taps are unrolled by construction (``depthwise_te``).

    Knobs: ``channel_block`` input channels per vector (16: one int8x16 register; 8 for
    C = 8, 24, ... with a multiplier); ``parallel`` over output rows; the parallel grain
    ``parallel_min_rows``: a row loop with fewer rows (a one-row border region) runs
    serially rather than paying for a parallel launch. (TVM's parallel launch already
    hands each thread one contiguous run of rows, so rows per task need no knob.)
    ``padded_copy`` (multiplier 1 with padding): read a padded copy of the input instead
    of the input in place with border regions; None: ``default_padded_copy``.
    ``parallel_axis`` of the in-place form: "rows" or "channels" (channel blocks, every
    row region inside; needs C % cb == 0); None: ``default_parallel_axis``. The other
    forms' loops over rows are parallel.
    """
    from tvm import s_tir

    s = shape
    sch = s_tir.Schedule(func)
    cb = channel_block or default_channel_block(s)
    if parallel_axis not in (None, "rows", "channels"):
        raise ValueError(f"depthwise: parallel_axis={parallel_axis!r}, not rows or channels")
    if parallel_axis == "channels" and (s.multiplier != 1 or s.channels % cb):
        raise ValueError(f"depthwise: parallel_axis='channels' needs multiplier 1 and "
                         f"channels in whole blocks of {cb}; the layer has {s.channels} "
                         f"channels, multiplier {s.multiplier}")

    def rows_parallel(rows):
        for lp in rows:
            if parallel and int(sch.get(lp).extent) >= max(parallel_min_rows, 2):
                sch.parallel(lp)

    if s.multiplier > 1:
        _schedule_staged(sch, s, cb, rows_parallel)
    elif any(s.padding) and (default_padded_copy(s) if padded_copy is None else padded_copy):
        _schedule_padded(sch, s, cb, rows_parallel)
    elif (parallel_axis or default_parallel_axis(s, cb, parallel_min_rows)) == "channels":
        _schedule_direct_channels(sch, s, cb, parallel)
    else:
        _schedule_direct(sch, s, cb, rows_parallel)
    return sch.mod["main"]


def _schedule_padded(sch, s: DepthwiseShape, cb: int, rows_parallel):
    """Multiplier 1 through a padded copy of the input: the copy's rows in parallel, its
    channels vectorized; then every output pixel reads 16-byte vectors of the copy with no
    condition, one loop nest over rows, columns and channel blocks (the C % cb remainder a
    narrower vector)::

        pad: for rows (parallel): for w: for c (vectorized)         zp_in outside the input
        for oh (parallel): for channel part: for cb_i: for ow: for c in cb (vectorized)
    """
    blocks = {sch.get(b).name_hint: b for b in _leaves(sch)}
    sch.compute_inline(blocks["acc"])
    pn, ph, _, pc = sch.get_loops(blocks["pad"])
    pad_rows = sch.fuse(pn, ph)
    vectorize_in_registers(sch, pc, cb)
    n, oh, _, _ = sch.get_loops(blocks["output"])
    rows_parallel([pad_rows, sch.fuse(n, oh)])
    _channel_blocks(sch, s.channels, cb)


def _channel_blocks(sch, channels: int, cb: int):
    """The channel loop of every output block (not the padded copy's): C // cb blocks of cb
    lanes, each block's loop outside the column loop (its weights stay in registers along
    the row), and the C % cb remainder as one narrower vector."""
    def outputs():
        return [b for b in _leaves(sch) if not sch.get(b).name_hint.startswith("pad")]

    main = channels // cb * cb
    _partition(sch, outputs(), "oc", [e for e in (main, channels - main) if e])
    for b in outputs():
        ow, oc = _loop(sch, b, "ow"), _loop(sch, b, "oc")
        if oc is not None and int(sch.get(oc).extent) > cb:  # main part: blocks of cb
            ocb, oc = sch.split(oc, [None, cb])
            if ow is not None:
                sch.reorder(ocb, ow)
        if oc is not None:
            sch.vectorize(oc)


def _schedule_direct(sch, s: DepthwiseShape, cb: int, rows_parallel):
    """Multiplier 1: everything inlined into the output block, no buffer between input and
    output; rows, columns and channels partitioned into regions::

        for each row region (top border | interior | bottom border), rows parallel:
          for each column region (left | interior | right):
            for each channel part (C // cb blocks | the C % cb remainder):
              for cb_i: for ow: for c in cb (vectorized): output = epilogue(taps)

    In the interior the pad's conditions fold away (every tap is a plain vector load); in
    a border region a tap that can only see padding becomes the constant zp_in. The
    channel remainder is one narrower vector (8, 3, ... lanes).
    """
    _inline_into_output(sch)
    _partition(sch, _leaves(sch), "oh", _row_regions(s))
    # The row loop of each row region, before the column partitions hide it in blocks.
    rows_parallel([lp for lp in (_loop(sch, b, "oh") for b in _leaves(sch)) if lp is not None])
    _partition(sch, _leaves(sch), "ow", _column_regions(s))
    _channel_blocks(sch, s.channels, cb)


def _schedule_direct_channels(sch, s: DepthwiseShape, cb: int, parallel: bool):
    """Multiplier 1, C % cb == 0, the input read in place as in ``_schedule_direct``, but
    one parallel loop over channel blocks holds every region::

        for cb_i in C / cb (parallel):
          for each row region (top border | interior | bottom border):
            for each column region (left | interior | right):
              for ow: for c in cb (vectorized): output = epilogue(taps)

    A task is a channel block over the whole map, border rows included, so no row runs
    on the calling thread alone; the block's weights stay in registers for the map.
    """
    _inline_into_output(sch)
    n, oh, ow, oc = sch.get_loops(sch.get_sblock("output"))
    block, lanes = sch.split(oc, [None, cb])
    sch.reorder(block, n, oh, ow, lanes)
    if parallel:
        sch.parallel(block)
    _partition(sch, _leaves(sch), "oh", _row_regions(s))
    _partition(sch, _leaves(sch), "ow", _column_regions(s))
    for b in _leaves(sch):
        sch.vectorize(sch.get_loops(b)[-1])


def _schedule_staged(sch, s: DepthwiseShape, cb: int, rows_parallel):
    """Multiplier > 1: padded copy, per-pixel accumulators, interleaving epilogue::

        pad: for rows (parallel): for w: for c (vectorized cb)
        for row in N * OH (parallel)
          for cb_i in C_pad / cb
            for ow in OW
              acc[M][cb] = bias + taps            int32 vectors, in registers
              for oc in cb * M (vectorized)       lane oc <- acc[oc % M][oc // M]: zip1/zip2
                requant[...] = epilogue(...)
          (output copy of the row's first C * M channels, when C_pad != C)
    """
    blocks = {sch.get(b).name_hint: b for b in _leaves(sch)}
    mlt = s.multiplier
    acc = blocks["acc"]
    cpad = int(sch.get(acc).iter_vars[4].dom.extent)
    if cpad % cb:
        raise ValueError(f"channel_block {cb} does not divide the func's {cpad} padded "
                         "channels: build and schedule with the same channel_block")
    # Without padded channels the epilogue block writes the output itself.
    req, copy = (blocks["requant"], blocks["output"]) if "requant" in blocks \
        else (blocks["output"], None)
    n, oh, ow, oc = sch.get_loops(req)
    row = sch.fuse(n, oh)
    ocb, ocl = sch.split(oc, [None, cb * mlt])
    sch.reorder(row, ocb, ow, ocl)
    # One pixel's accumulators, right where the epilogue reads them: int32 vectors that
    # live in registers (the block compacts to [M, cb]; no int32 tensor in memory).
    sch.compute_at(acc, ow, preserve_unit_loops=True)
    a_m, a_c = sch.get_loops(acc)[-2:]
    sch.unroll(a_m)
    sch.vectorize(a_c)
    sch.vectorize(ocl)
    if copy is not None:  # padded channels: the row's first C * M channels to the output
        sch.reverse_compute_at(copy, row)
    rows = [row]
    if "pad" in blocks:
        pn, ph, _, pc = sch.get_loops(blocks["pad"])
        rows.append(sch.fuse(pn, ph))
        sch.vectorize(sch.split(pc, [None, cb])[1])
    rows_parallel(rows)
