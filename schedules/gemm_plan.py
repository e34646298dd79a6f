"""Decide once how a conv2d GEMM layer runs: its ``GemmPlan``.

Every choice the compute (``gemm_compute.py``) and the schedule (``gemm_schedule.py``)
need is made here, from the layer (``gemm_layout.Conv2DShape``) and the kernel the
selection table gave it (``kernels.select``), and nowhere downstream:

    GemmPlan                     one per layer
      main: GemmPart             the GEMM of rows [0, M - tail), with the kernel
      tail: GemmPart | None      the last M % mr rows with the family's one-row kernel
      input_copy                 the copy of the input A is read from (bordered, rows)
    GemmPart
      kernel, first, rows        which rows, by which micro-kernel
      window                     A read in place (a DirectWindow), or None: packed
      form                       BLOCK, K_LOOP, DIRECT (the TensorIntrin's form) or
                                 INDIRECT (read by pixel, lowered by intrinsics/indirect.py)
      knobs                      the macro tile and K unrolling (``GemmKnobs``)

The policy, with the measurements behind each constant:

    read in place or pack   ``reads_input_directly``: K >= DIRECT_MIN_K, or few column
                            passes, or a widening kernel on a pointwise layer; where
                            micro-tiles would cross output rows, ``reads_by_pixel``
    row tail                ``tail_kernel``: at most TAIL_MAX_SHARE of mr rows left over
    parallel tasks          ``row_chunks``: macro-tile columns, times row chunks where a
                            layer has fewer than SPLIT_MIN_COLUMN_BLOCKS channel blocks
    knobs                   ``default_knobs``: a register model of the K loop and the
                            epilogue on the 32 NEON registers, fed by the kernel's ``Cost``
"""

from __future__ import annotations

import dataclasses

from tvm_armq.intrinsics import kernels
from tvm_armq.intrinsics.forms import DirectWindow
from tvm_armq.intrinsics.kernels import Kernel

from .gemm_layout import (ROWS, Conv2DShape, RowsCopy, ceil_div, direct_window, input_copy,
                          rows_copy)

# Suffix of a row tail's stage names (A_packed_tail, gemm_tail, output_tail).
TAIL = "_tail"

# A GEMM's parallel tasks are its macro-tile columns (output-channel blocks, n_tiles * nr
# channels each), so a column's per-channel epilogue operands and B blocks are loaded once
# per task. TVM's pool hands a parallel loop of E iterations to N threads as chunks of
# ceil(E / N): a layer of few channels has too few columns to go round (MobileNetV2's
# 32 -> 16 projection at 112 x 112 is one column and ran on one thread of two; measured
# with `estimate --threads 2`). A layer with fewer channel blocks than
# SPLIT_MIN_COLUMN_BLOCKS also cuts its rows into ``row_chunks`` chunks, each a task per
# column: a divisor of its row blocks (the chunks are equal and the tiles need no
# predicate), at most ROW_CHUNKS_MAX, leaving each chunk ROW_CHUNK_MIN_BLOCKS row blocks or
# more (room for the m_tiles knob to choose from), a multiple of 4 where one divides, else
# of 2 (so 2 and 4 threads get equal shares). A task is a run of macro tiles: each task
# allocates its accumulator tile once (TVM puts a buffer used inside a parallel loop in
# the loop's body; one tile per task had doubled the 1-thread cycles of MobileNetV1
# 0.25's 8 -> 16 layer with a workspace allocation per tile).
SPLIT_MIN_COLUMN_BLOCKS = 8
ROW_CHUNKS_MAX = 8
ROW_CHUNK_MIN_BLOCKS = 4


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


def can_read_input_directly(shape: Conv2DShape, kernel, rows: int | None = None) -> bool:
    """Whether the GEMM of ``shape`` (its ``rows``, as in ``direct_window``) *can* read A
    from the input in place with ``kernel``: a kernel with a direct-read form
    (``kernels.DIRECT`` in its forms: int8 sdot by element and smull/sadalp) and a layer
    ``direct_window`` accepts."""
    return (kernel is not None and kernels.DIRECT in kernel.forms
            and direct_window(shape, (kernel.mr, kernel.nr, kernel.kr), rows) is not None)


def reads_input_directly(shape: Conv2DShape, kernel, rows: int | None = None) -> bool:
    """Whether the GEMM of ``shape`` (its ``rows`` run by ``kernel``: by default
    ``gemm_rows``) reads A in place (no A_packed stage): where it
    can (``can_read_input_directly``) and K is at least ``DIRECT_MIN_K``; below that
    (where the pack is cheaper) a pointwise layer still reads in place with a widening
    kernel, or where at most ``DIRECT_MAX_PASSES`` column passes read A (both measured on
    pointwise layers only). Never with a kernel whose ``Cost.reads_in_place`` is False
    (smmla: its packed loop is faster)."""
    rows = gemm_rows(shape, kernel) if rows is None else rows
    if not can_read_input_directly(shape, kernel, rows) or not kernel.cost.reads_in_place:
        return False
    if shape.gemm_k >= DIRECT_MIN_K:
        return True
    nb = ceil_div(shape.gemm_n, kernel.nr)
    return shape.is_pointwise and (kernel.cost.direct_at_any_k
                                   or nb // direct_n_tiles(nb, kernel) <= DIRECT_MAX_PASSES)


def can_read_by_pixel(shape: Conv2DShape, kernel) -> bool:
    """Whether the GEMM of ``shape`` *can* read A in place row by row at each row's own
    output pixel (the INDIRECT form): a kernel with that form and a layer whose by-pixel
    window exists (``direct_window(..., by_pixel=True)``)."""
    return (kernel is not None and kernels.INDIRECT in kernel.forms
            and direct_window(shape, (kernel.mr, kernel.nr, kernel.kr), by_pixel=True)
            is not None)


def reads_by_pixel(shape: Conv2DShape, kernel) -> bool:
    """Whether the GEMM of ``shape`` reads A in place by pixel (INDIRECT) rather than
    packing it: where the affine window does not apply (``reads_input_directly`` is
    False: out_w no whole number of micro-tiles, or a strided 1x1 layer into such a map),
    the by-pixel one does (``can_read_by_pixel``), K is at least ``DIRECT_MIN_K`` (the
    same per-micro-row costs as the DIRECT form), and A is read by no more column passes
    than the kernel's ``Cost.by_pixel_max_passes`` (the measurements are at its constants
    in ``intrinsics/kernels.py``)."""
    if (reads_input_directly(shape, kernel) or not can_read_by_pixel(shape, kernel)
            or shape.gemm_k < DIRECT_MIN_K or not kernel.cost.reads_in_place):
        return False
    most = kernel.cost.by_pixel_max_passes  # the instruction's measured limit, if any
    nb = ceil_div(shape.gemm_n, kernel.nr)
    return most is None or nb // direct_n_tiles(nb, kernel) <= most


def tail_kernel(shape: Conv2DShape, kernel):
    """The kernel that runs the last M % mr rows of the GEMM of ``shape`` (module
    docstring: row tail), or None when they are padded up to a whole micro-tile instead.

    A tail is the one-row member of the kernel's family with its kr (``Family.tail_for``:
    the same B_packed), one K loop per row over all of B. It pays where the padding would be
    most of a micro-tile: at most ``TAIL_MAX_SHARE`` of mr rows (M = 49 at mr = 4: one row
    instead of four, 49 rows of work instead of 52). Any layer whose A the tail can read
    from the input copy the main GEMM reads (``input_copy``): the input itself, or its
    bordered copy, which both GEMMs then share. Not a few-channel layer (``ROWS``), whose
    copy is packed for all rows at once. The tail rows are the last pixels of the last
    image, read in place at any stride (``direct_window`` with mr = 1) when they are in
    one output row (``gemm_compute.direct_gemm_te``): out_w at least M % mr.
    """
    if kernel is None or shape.gemm_m < kernel.mr:
        return None
    if input_copy(shape, kernel.kr, kernel.a_dtype, direct=False) == ROWS:
        return None
    rest = shape.gemm_m % kernel.mr
    if not rest or rest > kernel.mr * TAIL_MAX_SHARE:
        return None
    if not shape.is_pointwise and rest > shape.out_w:  # the tail's rows: one output row
        return None
    return kernels.family_of(kernel).tail_for(kernel)


def gemm_rows(shape: Conv2DShape, kernel) -> int:
    """The rows of the GEMM of ``shape`` that ``kernel`` runs: all of M, or those before a
    row tail (``tail_kernel``)."""
    if tail_kernel(shape, kernel) is None:
        return shape.gemm_m
    return shape.gemm_m - shape.gemm_m % kernel.mr


@dataclasses.dataclass(frozen=True)
class GemmKnobs:
    """Tunable choices of a GEMM's schedule (the autotuner's design space).

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
# Widest output row of a one-row kernel's K loop (a GEMV: M = 1, ``Kernel.one_row``).
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


def k_loop_registers(kernel, m_tiles: int, n_tiles: int) -> tuple[int, int]:
    """NEON registers the K loop of an m_tiles x n_tiles macro tile keeps live, as
    (accumulators, operands): one K step's A and B blocks are the operands (a 128-bit
    register holds 16 bytes, so this is also the number of loads); the accumulators are
    the kernel's ``Cost.accumulators`` per micro-tile. A kernel tensorized over the whole
    K loop (a ``K_LOOP`` form) runs one K loop per micro-tile: one micro-tile's
    worth is live whatever the macro tile."""
    acc = kernel.cost.accumulators
    if kernels.K_LOOP in kernel.forms:
        m_tiles = n_tiles = 1
    a_regs, b_regs = -(-kernel.mr * kernel.kr // 16), -(-kernel.nr * kernel.kr // 16)
    return acc * m_tiles * n_tiles, a_regs * m_tiles + b_regs * n_tiles


def _epilogue_registers(kernel, m_tiles: int, n_tiles: int) -> int:
    """NEON registers the epilogue of an m_tiles x n_tiles macro tile keeps live: the
    tile's int32 results and the per-channel and fixed requantization operands."""
    results = m_tiles * n_tiles * -(-kernel.mr * kernel.nr // EPILOGUE_LANES)
    channels = -(-n_tiles * kernel.nr // EPILOGUE_LANES)
    return results + EPILOGUE_CHANNEL_REGISTERS * channels + EPILOGUE_FIXED_REGISTERS


def direct_n_tiles(nb: int, kernel) -> int:
    """n_tiles of a direct-read GEMM: its K loop covers n_tiles micro-tiles side by side,
    which share every A row load. The largest divisor of the column blocks whose output
    row is at most ``STORE_CHANNELS`` (``ONE_ROW_CHANNELS`` for a one-row kernel) and
    whose K loop fits the register file: the kernel's ``Cost.accumulators`` per
    micro-tile, and its ``Cost.direct_operands``."""
    budget = NEON_REGISTERS - SCRATCH_REGISTERS
    per_tile, operands = kernel.cost.accumulators, kernel.cost.direct_operands
    row = ONE_ROW_CHANNELS if kernel.one_row else STORE_CHANNELS
    fits = [d for d in range(1, nb + 1) if nb % d == 0 and d * kernel.nr <= row
            and d * per_tile + operands <= budget]
    return max(fits)


def default_knobs(shape: Conv2DShape, kernel, *, parallel: bool = True,
                  rows: int | None = None) -> GemmKnobs:
    """Good knobs for ``shape`` with micro-kernel ``kernel`` (any ISA level), for the
    GEMM's ``rows`` that the kernel runs (default ``gemm_rows``: M but a row tail).

    Among macro tiles whose tile counts divide the layer's block counts (so no ragged
    tile) and whose K loop fits the register file (``k_loop_registers``), rank by, in order:
    output rows of whole int32x4 registers (``EPILOGUE_LANES``; else the requantization
    is scalar); an epilogue that fits the register file (``_epilogue_registers``; a
    spilling epilogue costs more than any K loop saves on the MobileNet layers: measured
    with scripts/bench_layers.py, e.g. 2x4 beats 2x8 smmla tiles from K = 16 to K = 96
    and ties at K = 512); the most multiply-accumulate instructions per load in a K step
    (loads stop mattering once there are fewer loads than MAC instructions); the widest
    power-of-two output row up to ``STORE_CHANNELS`` (whole stores); the fewest live
    epilogue registers. (A by-element kernel's epilogue may spill from ``LONG_K_BLOCKS``
    K blocks.) K is unrolled by 2 when the K blocks allow. The scalar
    reference kernel gets 1 x 1 tiles. A direct-read GEMM (``reads_input_directly``, or
    ``reads_by_pixel``) runs one K loop per row of micro-tiles: m_tiles 1, n_tiles from
    ``direct_n_tiles``. A kernel tensorized over the whole K loop (a ``K_LOOP`` form, more
    than one K block) gets one micro-tile per macro tile.
    """
    by_pixel = rows is None and reads_by_pixel(shape, kernel)
    rows = gemm_rows(shape, kernel) if rows is None else rows
    return _knobs(kernel, ceil_div(rows, kernel.mr), ceil_div(shape.gemm_n, kernel.nr),
                  shape.packed_k(kernel.kr, kernel.a_dtype) // kernel.kr,
                  by_pixel or reads_input_directly(shape, kernel, rows), parallel)


def _knobs(kernel, mb: int, nb: int, kb: int, direct: bool, parallel: bool) -> GemmKnobs:
    """``default_knobs`` of a GEMM of mb x nb micro-tiles over kb K blocks, read in place
    if ``direct``."""
    if kernel.intrin is None:
        return GemmKnobs(parallel=parallel)
    if direct:
        return GemmKnobs(n_tiles=direct_n_tiles(nb, kernel), parallel=parallel)
    if kernels.K_LOOP in kernel.forms and kb > 1:
        # Tensorized over the whole K loop: one micro-tile per macro tile. A short K loop is
        # unrolled into the tile, and LLVM then interleaves the K loops of a macro tile's
        # micro-tiles, whose mr * nr partial sums each no longer fit the registers
        # together; a long one gains nothing from more tiles. Measured at neon (corrected,
        # 1 x 2 -> 1 x 1 tiles): v1.pw1 (K = 32) 0.957 -> 1.142, v2.b2-3.expand (K = 24)
        # 0.810 -> 0.955, v1.pw12 (K = 512) 0.974 -> 0.973.
        return GemmKnobs(parallel=parallel)
    # MAC instructions of one micro-tile's K step (``Cost.macs``)
    per_tile = kernel.cost.macs
    budget = NEON_REGISTERS - SCRATCH_REGISTERS
    best, best_score = (1, 1), None
    for mt in (d for d in range(1, min(mb, MAX_TILES) + 1) if mb % d == 0):
        for nt in (d for d in range(1, min(nb, MAX_TILES) + 1) if nb % d == 0):
            acc, loads = k_loop_registers(kernel, mt, nt)
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
            fits = epilogue <= NEON_REGISTERS or (kernel.cost.spills_over_long_k
                                                  and kb >= LONG_K_BLOCKS)
            score = (whole_vectors, fits, macs / max(macs, loads), store, -epilogue)
            if best_score is None or score > best_score:
                best, best_score = (mt, nt), score
    return GemmKnobs(m_tiles=best[0], n_tiles=best[1], k_unroll=2 if kb % 2 == 0 else 1,
                     parallel=parallel)


# ------------------------------------------------------------------ the plan
@dataclasses.dataclass(frozen=True)
class GemmPart:
    """One GEMM of a layer: rows [first, first + rows) of M, run by ``kernel``.

    ``k_blocks``: K blocks of its reduction (the packed K over kr). ``window``: where it
    reads A in place (the kernel's DIRECT form), or None when A is packed. ``knobs``: its
    macro tile. ``suffix``: of its stage names ("" for the main GEMM, ``TAIL``)."""

    kernel: Kernel
    first: int
    rows: int
    k_blocks: int
    window: DirectWindow | None
    knobs: GemmKnobs
    suffix: str

    @property
    def tile(self) -> tuple[int, int, int]:
        return (self.kernel.mr, self.kernel.nr, self.kernel.kr)

    @property
    def form(self) -> str | None:
        """The form the kernel is tensorized in, None for the scalar reference: DIRECT
        where A is read in place; K_LOOP for a kernel that reduces inside its block, over
        more than one K block (one block has no loop to keep partial sums across); else
        BLOCK."""
        if self.kernel.intrin is None:
            return None
        if self.window is not None:
            return kernels.INDIRECT if self.window.by_pixel else kernels.DIRECT
        if kernels.K_LOOP in self.kernel.forms and self.k_blocks > 1:
            return kernels.K_LOOP
        return kernels.BLOCK


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    """How one conv2d / dense layer runs (module docstring). ``input_copy``: the copy of
    the input its A is read from (``gemm_layout.BORDERED``, ``ROWS``) or None;
    ``rows_copy`` the layout of the ``ROWS`` copy."""

    shape: Conv2DShape
    main: GemmPart
    tail: GemmPart | None
    input_copy: str | None
    rows_copy: RowsCopy | None
    parallel: bool
    row_chunks: int = 1  # the main GEMM's parallel tasks: its columns times this

    @property
    def kernel(self) -> Kernel:
        return self.main.kernel

    @property
    def parts(self) -> tuple[GemmPart, ...]:
        return (self.main,) if self.tail is None else (self.main, self.tail)

    def describe(self) -> str:
        """One line for logs and reports: each part's kernel, form, rows and knobs."""
        def part(p: GemmPart) -> str:
            k = p.knobs
            return (f"{p.kernel.name} {p.form or 'scalar'} rows {p.first}..{p.first + p.rows}"
                    f" tiles {k.m_tiles}x{k.n_tiles} k_unroll {k.k_unroll}")
        return " + ".join(part(p) for p in self.parts)


def _part(shape: Conv2DShape, kernel: Kernel, first: int, rows: int, direct: bool,
          knobs: GemmKnobs | None, parallel: bool, suffix: str,
          by_pixel: bool = False) -> GemmPart:
    tile = (kernel.mr, kernel.nr, kernel.kr)
    window = (direct_window(shape, tile, by_pixel=True) if by_pixel
              else direct_window(shape, tile, rows) if direct else None)
    direct = window is not None
    k_blocks = shape.packed_k(kernel.kr, kernel.a_dtype) // kernel.kr
    if knobs is None:
        knobs = _knobs(kernel, ceil_div(rows, kernel.mr), ceil_div(shape.gemm_n, kernel.nr),
                       k_blocks, direct, parallel)
    return GemmPart(kernel, first, rows, k_blocks, window, knobs, suffix)


def plan(shape: Conv2DShape, kernel: Kernel, *, knobs: GemmKnobs | None = None,
         parallel: bool = True, direct: bool | None = None,
         by_pixel: bool | None = None) -> GemmPlan:
    """The plan of the GEMM of ``shape`` run by ``kernel`` (a record of
    ``intrinsics.kernels``; the reference keeps scalar loops).

    ``knobs``: the main GEMM's macro tile (default: ``default_knobs``'s; given knobs'
    ``parallel`` then decides). ``direct``: whether the main GEMM reads A in place, None
    as the policy says (``reads_input_directly``); True where the policy would pack (for
    tests and measurements) requires that it can (``can_read_input_directly``). A row
    tail (``tail_kernel``) always follows the policy and gets its default knobs; it reads
    A in place where the policy says so and its window reads the main GEMM's input copy.
    ``by_pixel``: whether the main GEMM reads A in place by pixel (INDIRECT form: its
    last micro-tile may be partly rows past its own), None as the policy says (``reads_by_pixel``, where the affine
    read is not taken); True requires that it can (``can_read_by_pixel``) and excludes
    ``direct``."""
    if knobs is not None:
        parallel = knobs.parallel
    main_rows = gemm_rows(shape, kernel)
    if by_pixel:
        if direct:
            raise ValueError(f"conv2d_gemm: {shape}: read in place affinely (direct) or "
                             "by pixel, not both")
        if not can_read_by_pixel(shape, kernel):
            raise ValueError(f"conv2d_gemm: {shape} cannot read A by pixel with "
                             f"{kernel.name} (gemm_layout.direct_window(by_pixel=True))")
    if direct is None:
        direct = not by_pixel and reads_input_directly(shape, kernel, main_rows)
    elif direct and not can_read_input_directly(shape, kernel, main_rows):
        raise ValueError(f"conv2d_gemm: {shape} cannot read A in place with {kernel.name} "
                         "(gemm_layout.direct_window)")
    if by_pixel is None:
        by_pixel = not direct and reads_by_pixel(shape, kernel)
    main = _part(shape, kernel, 0, main_rows, direct, knobs, parallel, "", by_pixel)
    copy = input_copy(shape, kernel.kr, kernel.a_dtype, main.window is not None)
    tail = None
    twin = tail_kernel(shape, kernel)
    if twin is not None:
        rest = shape.gemm_m - main_rows
        # read in place where the policy says and the window's copy is the main GEMM's
        # (a padded layer whose main GEMM packs from the input itself: the tail packs too)
        tail_direct = (reads_input_directly(shape, twin, rest)
                       and input_copy(shape, twin.kr, twin.a_dtype, True) == copy)
        tail = _part(shape, twin, main_rows, rest, tail_direct, None, parallel, TAIL)
    rows = rows_copy(shape, kernel.kr, kernel.a_dtype) if copy == ROWS else None
    chunks = row_chunks(shape, kernel, main_rows) if parallel else 1
    return GemmPlan(shape, main, tail, copy, rows, parallel, chunks)


def row_chunks(shape: Conv2DShape, kernel: Kernel, rows: int) -> int:
    """How many chunks the main GEMM's ``rows`` are cut into for its parallel tasks (a
    task per chunk and macro-tile column): 1 where the layer has SPLIT_MIN_COLUMN_BLOCKS
    channel blocks or more, else the divisor of its row blocks described at
    SPLIT_MIN_COLUMN_BLOCKS. Decided from the layer alone, so a tuning trace (whose m_tiles
    then divides a chunk) replays for any sampled tile."""
    if ceil_div(shape.gemm_n, kernel.nr) >= SPLIT_MIN_COLUMN_BLOCKS:
        return 1
    blocks = ceil_div(rows, kernel.mr)
    most = min(blocks // ROW_CHUNK_MIN_BLOCKS, ROW_CHUNKS_MAX)
    divisors = [d for d in range(1, most + 1) if blocks % d == 0] or [1]
    return max(divisors, key=lambda d: (d % 4 == 0, d % 2 == 0, d))
