"""Schedule a conv2d GEMM func as its plan says: macro tiles, the epilogue where a tile is
computed, the micro-kernel tensorized in the part's form.

``schedule_conv2d_gemm(func, plan, target)`` is the schedule tvm_armq compiles by default
(knobs from the plan); ``sample_conv2d_gemm(sch, plan, target)`` is the same loop nest
with the main GEMM's knobs sampled, the autotuner's design space. Both read every choice
from the plan (``gemm_plan.GemmPlan``): the form of each part, its window, the input copy;
nothing is re-derived from the func's stages.
"""

from __future__ import annotations

from tvm_armq.intrinsics import kernels

from .gemm_layout import BORDERED, COPY_LANES, ROWS, RowsCopy
from .gemm_plan import GemmKnobs, GemmPart, GemmPlan, direct_n_tiles
from .tir_util import (cut_at_the_image, largest_divisor, loops_below, merge_outputs,
                       only_block, partition, vectorize_in_registers)


def schedule_conv2d_gemm(func, plan: GemmPlan, target=None, *,
                         border_at_run_time: bool = False):
    """Schedule ``func`` (``gemm_compute.conv2d_gemm_func(plan, ...)``) as ``plan`` says:
    GEMM tiles computed where the epilogue consumes them.

    Loop nest of the result, per group g and macro tile (no, mo) of
    (m_tiles * mr) x (n_tiles * nr) outputs; a task per macro-tile column no and chunk of
    rows (``GemmPlan.row_chunks``, 1 but for layers of few channels):

      for chunk, no (fused, parallel):        A_packed is built up front, rows in parallel
          for mo:                             (per-channel epilogue operands hoisted here)
            acc[m_tiles, n_tiles, mr, nr] = 0      one macro tile, never a layer-sized tensor
            for kb in K/kr (unrolled by k_unroll):
              for ti < m_tiles, tj < n_tiles (unrolled):
                acc[ti, tj] += A_packed[mo, ti, kb] . B_packed[no, tj, kb]^T   <- micro-kernel
            for each output row of the tile (unrolled):
              output[row, n_tiles * nr channels] = epilogue(acc)   (one vector)

    The part's form (``GemmPart.form``) decides what is tensorized: BLOCK the (mr, nr, kr)
    block as above; K_LOOP the kb loop, one K loop per micro-tile (k_unroll unused);
    DIRECT (tj, kb): one K loop per row of micro-tiles, its n_tiles micro-tiles inside
    it, A read in place (k_unroll unused); INDIRECT the same loops with A read by pixel,
    blockized and marked for ``intrinsics.indirect``'s lowering at build time (the block
    is not affine, so not tensorized). A row tail is scheduled the same way with its
    own part, and the result has one output (``tir_util.merge_outputs``). The scalar
    reference keeps scalar loops; any other kernel is tensorized for ``target``
    (``MissingTargetFeature`` if the target lacks its instruction).
    ``sample_conv2d_gemm`` is the same schedule with every knob sampled.

    ``border_at_run_time``: the bordered input copy's border is a value known only at
    run time (a hybrid layer's zero point), so the copy is cut at the image's edges here
    (``_cut_bordered_copy``); with a constant border LLVM cuts it itself.
    """
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    for part in _tail_first(plan):
        _schedule_part(sch, plan, part, _fixed_tiles(sch, part.knobs), target,
                       border_at_run_time)
    return merge_outputs(sch.mod["main"])


def _tail_first(plan: GemmPlan) -> tuple[GemmPart, ...]:
    """The plan's parts in the order they are scheduled: a row tail before the main GEMM.
    A by-pixel main GEMM's block, once marked (``indirect.mark``), reads its input copy at
    indices the schedule cannot analyse, and from then on no other consumer of that copy
    can be moved (``reverse_compute_at`` needs a stage pipeline)."""
    return plan.parts[::-1]


# Largest inner factor ``sample_conv2d_gemm`` draws per knob: beyond these a macro tile's
# accumulators no longer fit the 32 NEON registers, and unrolling K further only grows code.
SAMPLE_MAX_INNER = {"m_tiles": 4, "n_tiles": 4, "k_unroll": 4}


def sample_conv2d_gemm(sch, plan: GemmPlan, target) -> None:
    """``schedule_conv2d_gemm`` as a MetaSchedule design space, in place on ``sch``.

    ``sch`` (a ``tvm.s_tir.Schedule``) holds the unscheduled PrimFunc of
    ``conv2d_gemm_func(plan, ...)``. The loop nest is exactly the one
    ``schedule_conv2d_gemm`` makes; each of the main GEMM's m_tiles, n_tiles and k_unroll
    is drawn by ``sch.sample_perfect_tile`` (2 factors, inner at most
    ``SAMPLE_MAX_INNER``) and the random variables feed the splits directly, so replaying
    or mutating the trace changes the tiles and every candidate stays tensorized. (A
    K_LOOP or DIRECT part has no k_unroll; the direct-read intrinsic is registered per
    n_tiles, so there n_tiles is not sampled but fixed at the plan's, and m_tiles is the
    one sample: a mutated trace then always tensorizes.) Parallelism is the plan's (it
    follows how the module will be run, not a tunable). A row tail keeps its plan's
    knobs, and its two outputs stay apart (the tuner measures the func as built). Usable
    as the schedule function of ``tvm.s_tir.meta_schedule.space_generator.ScheduleFn``.
    """
    main = plan.main
    if main.form is None:
        raise ValueError(f"sample_conv2d_gemm: {main.kernel.name} is the scalar reference; "
                         "the design space is for tensorized micro-kernels")

    def max_inner(knob):
        # the space always holds the plan's own knobs: a tuned layer is never slower
        # than its default for want of the default being a candidate (a 7 x 7 layer at
        # i8mm: 25 row blocks, default m_tiles 5, which a bound of 4 left out)
        return max(SAMPLE_MAX_INNER[knob], getattr(main.knobs, knob))

    def sampled_tile(loop, knob):
        if main.window is not None and knob == "n_tiles":
            return [None, direct_n_tiles(sch.get(loop).extent.value, main.kernel)]
        return list(sch.sample_perfect_tile(loop, n=2,
                                            max_innermost_factor=max_inner(knob)))

    for part in _tail_first(plan):
        tile = sampled_tile if part is main else _fixed_tiles(sch, part.knobs)
        _schedule_part(sch, plan, part, tile, target)


def _fixed_tiles(sch, knobs: GemmKnobs):
    """The ``tile`` function of ``_schedule_body`` for fixed ``knobs``. Knobs must divide
    the block counts: a ragged split puts a predicate on the block, which the
    micro-kernel's pattern does not match. Each is cut to the largest divisor not above it
    (the autotuner samples perfect tiles in the first place)."""
    wants = {"m_tiles": knobs.m_tiles, "n_tiles": knobs.n_tiles, "k_unroll": knobs.k_unroll}

    def fixed_tile(loop, knob):
        return [None, largest_divisor(sch.get(loop).extent.value, wants[knob])]

    return fixed_tile


def _schedule_part(sch, plan: GemmPlan, part: GemmPart, tile, target=None,
                   border_at_run_time: bool = False) -> None:
    """The one schedule of a plan's part, for ``schedule_conv2d_gemm`` and
    ``sample_conv2d_gemm``.

    ``tile(loop, knob)`` gives the [outer, inner] split factors of ``loop`` for ``knob``
    ("m_tiles", "n_tiles" or "k_unroll"): ints, or sampled random variables. Nothing
    below branches on a factor's value, so a trace of it replays for any decision. The
    main part also schedules the input copy (``GemmPlan.input_copy``), which a row tail
    reads as it is.
    """
    from tvm_armq.intrinsics import indirect, registry

    kernel, suffix, form = part.kernel, part.suffix, part.form
    parallel, vector_epilogue = plan.parallel, part.knobs.vector_epilogue
    direct = form in (kernels.DIRECT, kernels.INDIRECT)  # A read in place
    out, gemm = sch.get_sblock("output" + suffix), sch.get_sblock("gemm" + suffix)
    a_packed = None if part.window is not None else sch.get_sblock("A_packed" + suffix)
    # a direct-read conv reduces over (kernel row, K block, kk): the rows stay outermost
    g, mo, no, i, j, *k_loops = sch.get_loops(gemm)
    kb, kk = k_loops[-2:]
    # A kernel that reduces inside its block is tensorized over the whole K loop (its
    # K_LOOP form), so its partial sums stay in registers across K; K is then unrolled
    # inside the instruction sequence and the k_unroll knob does not apply.
    whole_k = form == kernels.K_LOOP
    # a layer of few channels: its row chunks (GemmPlan.row_chunks) outermost, each a run
    # of whole macro tiles (the chunks divide the row blocks)
    chunks = plan.row_chunks if part is plan.main else 1
    chunk, mo = sch.split(mo, [chunks, None])
    mo, ti = sch.split(mo, tile(mo, "m_tiles"))
    no, tj = sch.split(no, tile(no, "n_tiles"))
    # Macro-tile columns outside, rows inside: the epilogue's per-channel parameters
    # (bias, multiplier, shift and the shifts derived from it) and the column's B blocks
    # are the same for every macro tile of the inner loop, so LLVM loads and prepares
    # them once per column instead of once per tile.
    if direct:
        # One K loop per row of micro-tiles, all n_tiles of the row inside the intrinsic
        # (they share each A row load); k_unroll does not apply.
        sch.reorder(chunk, no, mo, ti, tj, *k_loops[:-1], i, j, kk)
        k_outer, unrolled = tj, (ti,)
    elif whole_k:
        sch.reorder(chunk, no, mo, ti, tj, kb, i, j, kk)
        k_outer, unrolled = kb, (ti, tj)
    else:
        kb_o, kb_i = sch.split(kb, tile(kb, "k_unroll"))
        sch.reorder(chunk, no, mo, kb_o, kb_i, ti, tj, i, j, kk)
        k_outer, unrolled = kb_o, (kb_i, ti, tj)
    # The epilogue of a macro tile runs right after its K loop, so its accumulators are
    # dead afterwards and buffer compaction shrinks them to one macro tile.
    sch.reverse_compute_at(out, mo)
    # The pack copies kr bytes per (block row, K block): one vector (kr = 4, 8 or 16 bytes)
    # when they are consecutive channels (see im2col_packed_te), lane by lane otherwise.
    # Where a kernel row is whole blocks, the pack runs per row of A over (kernel row,
    # block in the row): the pixel's offset is then computed once per row of A and the
    # block's offset is affine in the block, where the K-outer order divided each block's
    # index by the kernel row's size (d121's 14 x 14 x 128 3x3 at dotprod: 38% of the
    # layer in the pack, 10.6 cycles per 16 bytes).
    if a_packed is not None:
        pack_loops = sch.get_loops(a_packed)  # g, row block, K block, row in block, kr
        row_blocks = plan.shape.kernel_row_blocks(kernel.kr)
        k_blocks = int(sch.get(pack_loops[2]).extent)
        if row_blocks is not None and k_blocks % row_blocks == 0 and k_blocks > row_blocks:
            ky, kb_row = sch.split(pack_loops[2], [None, row_blocks])
            sch.reorder(pack_loops[3], ky, kb_row)
        elif plan.input_copy == ROWS and plan.rows_copy.dense:
            # K dense from the row copy (gemm_compute._dense_k): per row of A, its K blocks
            # unrolled, so which kernel row each lane takes is a constant (a blend)
            sch.reorder(pack_loops[3], pack_loops[2])
            sch.unroll(pack_loops[2])
        sch.vectorize(sch.get_loops(a_packed)[-1])
    # the input copy is the main GEMM's to schedule
    if part is plan.main and plan.input_copy == ROWS:
        _schedule_rows_copy(sch, sch.get_sblock(ROWS), plan.rows_copy, parallel)
    if part is plan.main and plan.input_copy == BORDERED:
        # the bordered input copy: rows in parallel, channels in vectors of COPY_LANES
        # (a layer's whole channel loop as one vector, 384 lanes of InceptionV3's 8 x 8
        # layers, was legalized lane by lane: a byte load, a store and an insert each)
        block = sch.get_sblock(BORDERED)
        if border_at_run_time:
            _cut_bordered_copy(sch, block, plan.shape, parallel)
        else:
            loops = sch.get_loops(block)
            rows, channels = loops[1], loops[-1]
            vectorize_in_registers(sch, channels, COPY_LANES)
            if parallel:
                sch.parallel(rows)
    if parallel:  # before the reduction is split in init + update (parallel rejects it)
        sch.parallel(sch.fuse(chunk, no))  # a task per (row chunk, column)
        if a_packed is not None:
            sch.parallel(sch.get_loops(a_packed)[1])
    sch.decompose_reduction(gemm, k_outer)
    for loop in unrolled:  # an extent-1 loop unrolls to nothing
        sch.unroll(loop)
    own = loops_below(sch, out, mo)  # none when the macro tile is one output (ref kernel)
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
    if form == kernels.INDIRECT:
        # rows of A at their own pixels: not affine, so marked for intrinsics.indirect's
        # lowering (the same instructions) instead of tensorized
        indirect.mark(sch, tj, kernel, part.window, sch.get(tj).extent.value, target)
    elif direct:
        n_tiles = sch.get(tj).extent.value  # a sampled n_tiles: its current decision
        registry.tensorize(sch, tj, kernel, target, direct=(part.window, n_tiles))
    elif whole_k:
        registry.tensorize(sch, kb, kernel, target, k_blocks=part.k_blocks)
    elif form is not None:
        # The micro-kernels take C as a plain (global-scope) window; the compacted
        # tile is a few dozen bytes on the stack, which LLVM keeps in registers.
        registry.tensorize(sch, i, kernel, target)


def _cut_bordered_copy(sch, block, shape, parallel: bool) -> None:
    """The bordered input copy cut where the image starts and ends
    (``tir_util.cut_at_the_image``), each part's pixel's channels in vectors of
    COPY_LANES, rows in parallel.

    For a border known only at run time: LLVM then left a branch per pixel in the copy's
    loop (3.5 cycles per 16-channel pixel at neon, 7e3 cycles of each of
    resnet_block_dynamic's 16-channel 3x3 layers); with a constant border it cuts the
    loop itself, as well as this."""
    for rows, channel_loops in cut_at_the_image(sch, block, shape.padding, shape.in_h,
                                                shape.in_w):
        for channels in channel_loops:
            vectorize_in_registers(sch, channels, COPY_LANES)
        if parallel:
            sch.parallel(rows)


def _schedule_rows_copy(sch, block, layout: RowsCopy, parallel: bool) -> None:
    """The row copy of a few-channel im2col (``gemm_layout.RowsCopy``), in ``COPY_LANES``
    vectors, cut where the image starts and ends.

    In the image's rows, the vectors holding input only are plain loads and stores (the
    cut lets the simplifier drop every bounds test), the border vectors before them are
    fills; after them, a vector mixing the row's last input elements with the border
    (when the row is no whole number of vectors) is copied element by element, each
    tested, since a vector load there could read past the input. The border rows are
    fills.
    """
    top, height = layout.top, layout.height
    lead, whole, mixed = layout.lead_vectors, layout.whole_vectors, layout.mixed
    _, y, t = sch.get_loops(block)
    sch.split(t, [None, COPY_LANES])
    extent = sch.get(y).extent.value
    y_top, y_mid, y_bottom = partition(sch, y, [top, height, extent - top - height])
    for part in (y_top, y_bottom):
        if part is not None:
            sch.vectorize(sch.get_loops(only_block(sch, part))[-1])
    vectors = sch.get_loops(only_block(sch, y_mid))[-2]
    count = sch.get(vectors).extent.value
    parts = partition(sch, vectors, [lead, whole, count - lead - whole])
    for idx, part in enumerate(parts):
        if part is None:
            continue
        lanes = sch.get_loops(only_block(sch, part))[-1]
        if idx == 2 and mixed:
            # element by element: each test is then a branch, and only the input loads
            sch.unroll(lanes)
        else:
            sch.vectorize(lanes)
    if parallel:
        sch.parallel(y_mid)

