"""The forms a micro-kernel is tensorized in: the scalar desc each TensorIntrin is matched
against, and the signature every instruction module builds its impl to.

A kernel (``kernels.Kernel``) lists the forms it can be tensorized in (``kernel.forms``):

    BLOCK    C[mr, nr] += A[mr, kr] . B[nr, kr]^T, one block        desc
    K_LOOP   the same over a whole loop of k_blocks K blocks,       desc_k_loop
             partial sums kept in registers and reduced once
    DIRECT   a whole K loop of n_tiles micro-tiles side by side     desc_direct
             with A read in place from the input (``DirectWindow``)
    INDIRECT DIRECT's instructions with each row of A at its own    (none: indirect.py
             output pixel (a by-pixel ``DirectWindow``)              lowers it)

Each desc is scalar TVMScript, the same for every kernel. The impl (the instruction
sequence) comes from the kernel's module (``mmla.py``, ``dot.py``, ``neon.py``), which
builds it with ``build_impl`` / ``build_impl_k_loop`` / ``build_impl_direct`` (the desc's
signature around its instructions) and exports the builders as one ``Implementation``
object, ``IMPLEMENTS``. The K-loop and direct TensorIntrins are named after the kernel and
their parameters (``k_loop_name``, ``direct_name``). ``registry.py`` registers them with
TVM and tensorizes.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from .kernels import BLOCK, DIRECT, INDIRECT, K_LOOP, Kernel


@dataclasses.dataclass(frozen=True)
class Implementation:
    """What an instruction module implements: one impl builder per form (None: not
    implemented). ``block(kernel)``, ``k_loop(kernel, k_blocks)``, ``direct(kernel,
    window, n_tiles)`` each return an impl PrimFunc with the signature of the form's desc.
    A kernel's ``forms`` must be among its module's (tests/test_intrinsics.py)."""

    block: Callable
    k_loop: Callable | None = None
    direct: Callable | None = None

    @property
    def forms(self) -> tuple[str, ...]:
        """The forms implemented: the direct builder also does INDIRECT (given each
        row's offset, ``DirectWindow.row_offsets``)."""
        return tuple(f for f, fn in ((BLOCK, self.block), (K_LOOP, self.k_loop),
                                     (DIRECT, self.direct), (INDIRECT, self.direct))
                     if fn is not None)


# ------------------------------------------------------------- desc / impl
def _intrin_func(kernel: Kernel, name: str, a_shape, b_shape, c_shape, body):
    """A PrimFunc with a TensorIntrin's signature (a, b, c): A and B packed operands of
    the given shapes, C the accumulators, any strides but a unit innermost one; its root
    block reads all of C, A and B and writes all of C, and ``body(A, B, C)`` fills it.
    The block, whole-K and direct-read forms differ only in these shapes."""
    from tvm.script import tirx as T
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder.tirx import prim_func as ir_prim_func

    def whole(buf, shape):
        return buf[tuple(slice(0, d) for d in shape)]

    with IRBuilder() as ib:
        with ir_prim_func():
            T.func_name(name)
            a = T.arg("a", T.handle())
            b = T.arg("b", T.handle())
            c = T.arg("c", T.handle())
            A = T.match_buffer(a, a_shape, kernel.a_dtype, offset_factor=1)
            B = T.match_buffer(b, b_shape, kernel.b_dtype, offset_factor=1)
            C = T.match_buffer(c, c_shape, kernel.acc_dtype, offset_factor=1,
                               strides=[T.int32() for _ in c_shape[1:]] + [1])
            with T.sblock("root"):
                T.reads(whole(C, c_shape), whole(A, a_shape), whole(B, b_shape))
                T.writes(whole(C, c_shape))
                body(A, B, C)
    return ib.get()


def _block_func(kernel: Kernel, name: str, body):
    """A PrimFunc with the signature of the block form: A[mr, kr], B[nr, kr], C[mr, nr]."""
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    return _intrin_func(kernel, name, (mr, kr), (nr, kr), (mr, nr), body)


def _bind_iters(T, spatial, reduce) -> tuple[list, list]:
    """In a desc's block: iters bound to the loop variables of ``spatial`` ((var, extent)
    pairs) and ``reduce`` (vars), in that order, returned as (spatial iters, reduce iters).
    A spatial loop of extent 1 (one row, one micro-tile) gets the constant 0 and no iter:
    blockize drops such an iter from the GEMM's block, so the pattern must not bind one."""
    kept = [var for var, extent in spatial if extent > 1]
    bound = iter(T.axis.remap("S" * len(kept) + "R" * len(reduce), kept + list(reduce)))
    return ([next(bound) if extent > 1 else 0 for _, extent in spatial],
            [next(bound) for _ in reduce])


def desc(kernel: Kernel):
    """The scalar reference of ``kernel`` as a PrimFunc (the TensorIntrin desc):
    C[i, j] += acc(A[i, k]) * acc(B[j, k]) over i < mr, j < nr, k < kr."""
    from tvm.script import tirx as T

    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    c_dt = kernel.acc_dtype

    def body(A, B, C):
        with T.grid(mr, nr, kr) as (i, j, k):
            with T.sblock("update"):
                (vi, vj), (vk,) = _bind_iters(T, [(i, mr), (j, nr)], [k])
                T.reads(C[vi, vj], A[vi, vk], B[vj, vk])
                T.writes(C[vi, vj])
                product = T.Cast(c_dt, A[vi, vk]) * T.Cast(c_dt, B[vj, vk])
                T.buffer_store(C, C[vi, vj] + product, [vi, vj])

    return _block_func(kernel, kernel.name + "_desc", body)


def build_impl(kernel: Kernel, emit):
    """An impl PrimFunc with the same signature as ``desc(kernel)``: ``emit(A, B, C)`` adds
    the instruction sequence (IRBuilder statements) inside the root block."""
    return _block_func(kernel, kernel.name, emit)


def check_shape(kernel: Kernel, mr: int | tuple[int, ...], nr: int, kr: int) -> None:
    """Raise unless ``kernel`` has the block shape its instruction sequence computes
    (``mr``: one row count, or the row counts it can do)."""
    rows = mr if isinstance(mr, tuple) else (mr,)
    if kernel.mr not in rows or (kernel.nr, kernel.kr) != (nr, kr):
        want = "|".join(str(r) for r in rows)
        raise ValueError(f"{kernel.name}: its instruction computes a {want}x{nr}x{kr} block, "
                         f"the record says {kernel.mr}x{kernel.nr}x{kernel.kr}")


# ------------------------------------------------------- whole-K intrinsics
# Some kernels reduce inside the block: the Armv8.0 widening kernel ends every block with
# a pairwise-add tree that turns per-(row, column) partial-sum vectors into a row of C.
# Tensorized block by block, that tree runs on every K step. Their K_LOOP form is the
# instruction sequence of a whole K loop of ``k_blocks`` blocks, which keeps the partial
# sums in registers across K and reduces once. Its TensorIntrin is registered per K-block
# count (``k_loop_name``), on demand.


def k_loop_name(kernel: Kernel, k_blocks: int) -> str:
    """The TensorIntrin name of ``kernel`` over a K loop of ``k_blocks`` blocks."""
    return f"{kernel.name}__k{k_blocks}"


def _k_loop_func(kernel: Kernel, k_blocks: int, name: str, body):
    """A PrimFunc with the signature of the whole-K form: ``k_blocks`` blocks of A and B."""
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    return _intrin_func(kernel, name, (k_blocks, mr, kr), (k_blocks, nr, kr), (mr, nr), body)


def desc_k_loop(kernel: Kernel, k_blocks: int):
    """The scalar reference of ``kernel`` over a whole K loop: A and B are ``k_blocks``
    consecutive packed blocks, C[i, j] += sum over kb, k of A[kb, i, k] * B[kb, j, k]."""
    from tvm.script import tirx as T

    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    c_dt = kernel.acc_dtype

    def body(A, B, C):
        with T.grid(k_blocks, mr, nr, kr) as (kb, i, j, k):
            with T.sblock("update"):  # block iters in the GEMM block's order
                (vi, vj), (vb, vk) = _bind_iters(T, [(i, mr), (j, nr)], [kb, k])
                T.reads(C[vi, vj], A[vb, vi, vk], B[vb, vj, vk])
                T.writes(C[vi, vj])
                product = T.Cast(c_dt, A[vb, vi, vk]) * T.Cast(c_dt, B[vb, vj, vk])
                T.buffer_store(C, C[vi, vj] + product, [vi, vj])

    return _k_loop_func(kernel, k_blocks, k_loop_name(kernel, k_blocks) + "_desc", body)


def build_impl_k_loop(kernel: Kernel, k_blocks: int, emit):
    """An impl PrimFunc with the signature of ``desc_k_loop(kernel, k_blocks)``;
    ``emit(A, B, C)`` adds the instruction sequence."""
    return _k_loop_func(kernel, k_blocks, k_loop_name(kernel, k_blocks), emit)


# ---------------------------------------------------- direct-read intrinsics
# A 1x1 stride-1 convolution's A is the input itself: row m of A is pixel m's channels,
# contiguous, and consecutive pixels are in_c bytes apart. A by-element dot-product kernel
# needs no interleaved A block for it: one 16-byte load of a row holds four K steps, and
# the lane index of ``sdot Vc.4s, Vb.16b, Va.4b[t]`` picks K step t of that row. Its
# DIRECT form is a whole-K instruction sequence for C[n_tiles, mr, nr] (n_tiles
# micro-tiles side by side, sharing every A load) whose A is the rows of the input where
# they lie (no pack), as a ``DirectWindow`` says. Its TensorIntrin is registered per
# (window, n_tiles) (``direct_name``), on demand.


@dataclasses.dataclass(frozen=True)
class DirectWindow:
    """Where a direct-read GEMM finds its mr rows of A in place, as flat element offsets
    into the input (NHWC is contiguous, so any pixel's channels start at a flat offset).

    Row i of A (one output pixel) is ``segments`` runs of ``segment`` contiguous
    elements; run s of row i starts at ``i * row_stride + s * segment_stride`` from the
    window's origin, and K = segments * segment:

        pointwise conv / dense   one run of K; rows K apart (consecutive pixels)
        kh x kw conv (columns    one run per kernel row: its kw taps are adjacent
        not dilated, stride sw)  pixels, kw * C contiguous elements; runs dh rows of the
                                 (padded) image apart; rows sw * C apart, the mr output
                                 pixels being consecutive in one output row
    """

    segment: int
    segments: int = 1
    segment_stride: int = 0
    row_stride: int | None = None  # None: the rows are consecutive runs (pointwise)
    # Rows at their own output pixels (the INDIRECT form): each row of a micro-tile starts
    # at its pixel's origin, so a micro-tile may cross output rows (and images); the
    # window then describes one row's runs, and ``row_stride`` is unused.
    by_pixel: bool = False

    @classmethod
    def of_pixels(cls, segment: int, segments: int = 1, segment_stride: int = 0):
        """The window of the INDIRECT form: one row's runs, rows where their pixels are."""
        return cls(segment, segments, segment_stride, None, True)

    @classmethod
    def pointwise(cls, k: int) -> "DirectWindow":
        return cls(k)

    @property
    def k(self) -> int:
        return self.segment * self.segments

    @property
    def stride(self) -> int:
        """Elements from one row's start to the next's."""
        return self.segment if self.row_stride is None else self.row_stride

    def extent(self, mr: int) -> int:
        """Elements from the window's first to one past its last."""
        return (mr - 1) * self.stride + (self.segments - 1) * self.segment_stride + self.segment

    @property
    def tag(self) -> str:
        """The window's part of a TensorIntrin name (a by-pixel window's ends in _p)."""
        if self.by_pixel:
            return f"k{self.segment}x{self.segments}_s{self.segment_stride}_p"
        if self.segments == 1 and self.row_stride is None:
            return f"k{self.segment}"
        return f"k{self.segment}x{self.segments}_s{self.segment_stride}_r{self.stride}"

    def row_offsets(self, mr: int, rows=None) -> list:
        """Where each of the mr rows of A starts in an impl's A buffer: ``i * stride`` in
        an affine window, the given offsets (``rows``, one PrimExpr per row) in a
        by-pixel one."""
        if self.by_pixel:
            if rows is None or len(rows) != mr:
                raise ValueError(f"a by-pixel window needs {mr} row offsets, got {rows!r}")
            return list(rows)
        if rows is not None:
            raise ValueError("an affine window's rows are i * stride apart: no offsets")
        return [i * self.stride for i in range(mr)]


def direct_name(kernel: Kernel, window: DirectWindow, n_tiles: int) -> str:
    """The TensorIntrin name of ``kernel``'s direct-read form for ``window`` and n_tiles."""
    return f"{kernel.name}__direct_{window.tag}_n{n_tiles}"


def _direct_func(kernel: Kernel, window: DirectWindow, n_tiles: int, name: str, body,
                 a_extent: int | None = None):
    """A PrimFunc with the signature of the direct-read form. A: the flat window of the
    input holding the mr rows (``DirectWindow``), so the GEMM may index the NHWC input by
    flat offset; by pixel (``window.by_pixel``), the whole flat input, ``a_extent``
    elements. B: n_tiles packed column blocks over the whole K loop. C: n_tiles
    row-major [mr, nr] windows."""
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    if window.by_pixel == (a_extent is None):
        raise ValueError(f"{kernel.name}: the A extent is given for a by-pixel window, "
                         "and only for one")
    a_shape = (a_extent,) if window.by_pixel else (window.extent(mr),)
    return _intrin_func(kernel, name, a_shape, (n_tiles, window.k // kr, nr, kr),
                        (n_tiles, mr, nr), body)


def desc_direct(kernel: Kernel, window: DirectWindow, n_tiles: int):
    """The scalar reference of the direct-read form (``window``: ``DirectWindow``):

        C[t, i, j] += sum over s, kb, kk of A[i * row_stride + s * segment_stride
                                              + kb * kr + kk] * B[t, s * blocks + kb, j, kk]

    (blocks = segment / kr; a single-segment window has no s loop). The loops and block
    iters are in the GEMM block's order (``conv2d_gemm.direct_gemm_te``)."""
    from tvm.script import tirx as T

    if window.by_pixel:
        raise ValueError(f"{kernel.name}: a by-pixel window has no desc: its rows are not "
                         "affine in the row index, so tensorize cannot match it (the "
                         "INDIRECT form is lowered by indirect.py)")
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    blocks, c_dt = window.segment // kr, kernel.acc_dtype
    segmented = window.segments > 1

    def body(A, B, C):
        extents = [n_tiles] + ([window.segments] if segmented else []) + [blocks, mr, nr, kr]
        with T.grid(*extents) as loops:
            t, rest = loops[0], loops[1:]
            seg, (kb, i, j, kk) = (rest[0], rest[1:]) if segmented else (None, rest)
            with T.sblock("update"):
                (vt, vi, vj), reduced = _bind_iters(
                    T, [(t, n_tiles), (i, mr), (j, nr)], ([seg] if segmented else []) + [kb, kk])
                vs, vb, vk = reduced if segmented else (0, *reduced)
                a_at = vi * window.stride + vs * window.segment_stride + vb * kr + vk
                b_at = (vt, vs * blocks + vb, vj, vk)
                T.reads(C[vt, vi, vj], A[a_at], B[b_at])
                T.writes(C[vt, vi, vj])
                product = T.Cast(c_dt, A[a_at]) * T.Cast(c_dt, B[b_at])
                T.buffer_store(C, C[vt, vi, vj] + product, [vt, vi, vj])

    return _direct_func(kernel, window, n_tiles, direct_name(kernel, window, n_tiles) + "_desc",
                        body)


def build_impl_direct(kernel: Kernel, window: DirectWindow, n_tiles: int, emit,
                      a_extent: int | None = None):
    """An impl PrimFunc with the signature of ``desc_direct(kernel, window, n_tiles)``;
    ``emit(A, B, C)`` adds the instruction sequence. A by-pixel window's impl (the
    INDIRECT form, which ``indirect.py`` lowers: it has no desc) reads A from the whole
    flat input of ``a_extent`` elements."""
    return _direct_func(kernel, window, n_tiles, direct_name(kernel, window, n_tiles), emit,
                        a_extent)


def row_loader(A, window: DirectWindow, mr: int, rows=None):
    """In an impl being built: ``load(i, offset, dtype)``, the vector of ``dtype`` at
    ``offset`` into row i of A, its mr rows where ``window.row_offsets(mr, rows)`` puts
    them. An affine window reads A at the row's constant offset. A by-pixel window's row
    starts (each a few divisions of the micro-tile's pixel index) become one pointer per
    row, computed once: the K loop then walks mr pointers by the
    same increments. (Indexed as A[start_i + offset] instead, LLVM's SLP vectorizer
    packed the mr sums into vector registers and moved each address back lane by lane,
    every K step: neon's by-pixel K loop ran 35% slower than the packed one.)"""
    from tvm.script import tirx as T

    offsets = window.row_offsets(mr, rows)
    if not window.by_pixel:
        return lambda i, offset, dtype: A.vload([offsets[i] + offset], dtype)
    views = [T.decl_buffer((window.extent(1),), A.ty.dtype, data=T.bind(T.address_of(A[o])))
             for o in offsets]
    return lambda i, offset, dtype: views[i].vload([offset], dtype)


# TVM 0.27 lowers a CPU allocation to the stack only when its scope is "global" and it is
# smaller than this (runtime::kMaxStackAlloca; tirx LowerTVMBuiltin). Any other one, a
# "local" one included, becomes a TVMBackendAllocWorkspace / FreeWorkspace pair, run each
# time its block runs: once per macro tile inside a GEMM's parallel loop.
STACK_ALLOCATION_LIMIT = 1024  # bytes


def registers(tiles: int, elems: int, dtype: str) -> list:
    """In an impl being built: one buffer of ``elems`` ``dtype`` values per micro-tile for
    values the instructions keep in registers (accumulators, partial sums). Indexed with
    constants only, each is an LLVM stack slot that SROA promotes to registers outright:
    hence "global" scope and one buffer per tile, each under STACK_ALLOCATION_LIMIT."""
    from tvm.script import tirx as T

    size = elems * np.dtype(dtype).itemsize
    if size >= STACK_ALLOCATION_LIMIT:
        raise ValueError(f"{elems} {dtype} registers per micro-tile ({size} bytes) do not fit "
                         f"a stack slot under {STACK_ALLOCATION_LIMIT} bytes")
    return [T.alloc_buffer((elems,), dtype, scope="global") for _ in range(tiles)]


# A kernel row of at most this many elements of K is unrolled in a direct-read impl with
# several kernel rows (``run_loop``): a 3x3 conv's row of up to 32 int8 channels.
UNROLLED_RUN = 96


def run_loop(window: DirectWindow, steps: int, single_run: bool = False):
    """In an impl being built: the loop over the ``steps`` of one run of ``window``'s rows
    (its 16-byte blocks or loads), unrolled when a run is at most UNROLLED_RUN elements and
    the window has several runs (a kh x kw conv's kernel rows, themselves a loop) or
    ``single_run`` says to unroll a single one too.

    A short loop inside the loop over kernel rows left that outer loop's step a block of
    code of its own, between the inner loop's last block and the next row's first
    (armperf prices each block apart: 2.5e4 of resnet_block_dynamic's 2.23e6 cycles at
    neon); unrolled, a kernel row is one straight block. A single run (a pointwise layer)
    unrolled has B loads at constant addresses, which LLVM may hoist out of the loop over
    tiles: measured per kernel, the smull kernel gains (bert_encoder_dynamic at neon
    7.09e5 -> 6.94e5, mobilenet_v2_1.0 -0.4%), the sdot kernel's hoisted loads spill
    (mobilenet_v2_1.0 at dotprod +2.5%). A by-pixel window (the INDIRECT form) keeps its
    loops: unrolled, two_in_two_out's strided 3x3 layer at neon took 3% more."""
    from tvm.script import tirx as T

    unrolled = (not window.by_pixel and (window.segments > 1 or single_run)
                and window.segment <= UNROLLED_RUN)
    return (T.unroll if unrolled else T.serial)(steps)


def for_each_run(window: DirectWindow, run) -> None:
    """In an impl being built: ``run(r)`` for every run r of ``window``'s rows, r a
    constant for a single run, else the variable of a serial loop over the runs."""
    from tvm.script import tirx as T

    if window.segments == 1:
        run(0)
    else:
        with T.serial(window.segments) as r:
            run(r)


