"""The Armv8.0 int8 micro-kernel: smull/umull + saddlp/sadalp (uaddlp/uadalp) + addp.

Plain Advanced SIMD (Cortex-A53/A72) has no int8 dot product, so a 4x4 block of C over 16
values of K (math: 4 x 16 · 16 x 4 → 4 x 4) is built from widening multiplies and pairwise
widening adds, the design of TVM's original arm_cpu ``gemm_quantized`` int8 kernel:

    Va_i = A[i, 0:16]   (row i of the packed A block, one 128-bit register)
    Vb_j = B[j, 0:16]   (row j of the packed B block)

    for each (i, j):
      lo   = smull  Va_i.8b,  Vb_j.8b      int16 x 8: A[i, k] * B[j, k], k = 0..7
      hi   = smull2 Va_i.16b, Vb_j.16b     int16 x 8: A[i, k] * B[j, k], k = 8..15
      S_ij = saddlp lo                      int32 x 4: lo[0]+lo[1] | lo[2]+lo[3] | ...
      S_ij = sadalp S_ij, hi                int32 x 4: += hi[0]+hi[1] | hi[2]+hi[3] | ...
    C[i, 0:4] += addp(addp(S_i0, S_i1), addp(S_i2, S_i3))
              =  | sum(S_i0) | sum(S_i1) | sum(S_i2) | sum(S_i3) |

(umull/umull2 + uaddlp/uadalp for uint8 x uint8, accumulated in int32.)

8 bytes of K, 4x4x8 (math: 4 x 8 · 8 x 4 → 4 x 4): the same sequence on one 8-byte half
per row (smull, saddlp; sadalp over a K loop), for a GEMM whose K is 1-8 past a multiple of
16 (``kernels.select`` with its depth: K = 24 is three such blocks, not two of 16).

One row, 1x4x16 (math: 1 x 16 · 16 x 4 → 1 x 4): the same sequence with i = 0 only, for a
GEMM of one row (``kernels.select`` with rows = 1), where the 4-row block would multiply
three rows of padding. Each B row is then used once: 16 bytes of B per smull/smull2 pair.

Overflow rule. An int8 x int8 product lies in [-16256, 16384] and always fits int16, so
smull is exact. A SUM of two products in int16 is not: it overflows exactly when both are
(-128) x (-128) = 16384, since 16384 + 16384 = 32768 > 32767 (every other pair stays within
[-32512, 32640]). The RFC-era kernel did exactly that sum (smull, then smlal adding the
second product into the same int16 lanes), so it was exact only as long as no lane ever
paired two (-128) x (-128) products. This kernel never adds two products in 16 bits:
saddlp/sadalp widen each int16 product to int32 BEFORE adding the pair, so the block is
exact on the whole int8 range, -128 included (tests/test_intrinsics.py runs all -128
inputs). For uint8, umull products are at most 255 x 255 = 65025 < 2**16 and uadalp widens
likewise. Sums are exact while they fit int32: K <= 131071 for int8, K <= 33025 for uint8.
"""

from __future__ import annotations

from . import forms, kernels
from .kernels import Kernel

# dtype of both operands -> (widening multiply, pairwise add long, product vector dtype)
WIDENING = {
    "int8": ("llvm.aarch64.neon.smull.v8i16", "llvm.aarch64.neon.saddlp.v4i32.v8i16", "int16"),
    "uint8": ("llvm.aarch64.neon.umull.v8i16", "llvm.aarch64.neon.uaddlp.v4i32.v8i16",
              "uint16"),
}
ADDP = "llvm.aarch64.neon.addp.v4i32"
KERNELS = tuple(k for k in kernels.TABLE if k.module == "neon")

_HALF = 8  # int8 lanes a widening multiply takes from each 128-bit row (one half)
_LANES = 4  # int32 lanes of the accumulator
# Rows of A a block has: four, or one (the one-row kernels, which select gives to GEMMs of
# one row; every sequence below is per row of A, so it is the same code with mr = 1)
ROWS = (1, _LANES)
# Bytes of K a block has: 16 (two 8-byte halves: smull and smull2), or 8 (one half: for
# GEMMs whose K is 1-8 past a multiple of 16, which kernels.select picks by the depth)
DEPTHS = (_HALF, 2 * _HALF)


def _half_of(rows: list, h, half: str, kr: int) -> list:
    """Inside a loop over the halves ``h`` of a block: half ``h`` of each whole-block
    vector of ``rows`` (itself when the block is one half). Each row is loaded once per
    block as one 16-byte vector: its two halves are then the low and high halves of one
    register, which smull and smull2 read as they are, where two 8-byte loads per row
    were two load instructions (a one-row GEMM's K loop, which loads every B row once,
    issued 41 loads for 40 multiplies and ran at the core's dispatch width, not at its
    one widening multiply a cycle). The select on ``h`` folds once the loop is unrolled."""
    from tvm import tirx

    if kr == _HALF:
        return rows
    return [tirx.Select(h == 0, tirx.vectorlow(half, v), tirx.vectorhigh(half, v))
            for v in rows]


def _widening_setup(kernel: Kernel):
    """Check ``kernel`` is one of this module's and return what both forms build from:
    (mull, addlp, product dtype, mr, nr, kr, half-register dtype, accumulator dtype)."""
    if kernel not in KERNELS:
        raise ValueError(f"{kernel.name} is not an Armv8.0 widening kernel")
    if kernel.a_dtype != kernel.b_dtype:
        raise ValueError(f"{kernel.name}: smull/umull need operands of one signedness")
    forms.check_shape(kernel, ROWS, _LANES, kernel.kr if kernel.kr in DEPTHS else 2 * _HALF)
    mull, addlp, prod_dtype = WIDENING[kernel.a_dtype]
    return (mull, addlp, prod_dtype, kernel.mr, kernel.nr, kernel.kr,
            f"{kernel.a_dtype}x{_HALF}", f"int32x{_LANES}")


def impl(kernel: Kernel):
    """The impl PrimFunc of the Armv8.0 kernel (see the module docstring)."""
    from tvm import tirx
    from tvm.script import tirx as T

    mull, addlp, prod_dtype, mr, nr, kr, half, acc = _widening_setup(kernel)

    def halves(buf, r):
        v = T.bind(buf.vload([r, 0], f"{kernel.a_dtype}x{kr}"))
        return [v] if kr == _HALF else [tirx.vectorlow(half, v), tirx.vectorhigh(half, v)]

    def emit(A, B, C):
        a_rows = [halves(A, i) for i in range(mr)]
        b_rows = [halves(B, j) for j in range(nr)]
        for i in range(mr):
            s = []
            for j in range(nr):
                # addlp(lo) + addlp(hi): LLVM folds the add into the accumulating sadalp
                products = [tirx.call_llvm_pure_intrin(f"{prod_dtype}x{_HALF}", mull, a, b)
                            for a, b in zip(a_rows[i], b_rows[j])]
                total = tirx.call_llvm_pure_intrin(acc, addlp, products[0])
                for p in products[1:]:
                    total = total + tirx.call_llvm_pure_intrin(acc, addlp, p)
                s.append(total)
            pairs = [tirx.call_llvm_pure_intrin(acc, ADDP, s[j], s[j + 1])
                     for j in range(0, nr, 2)]
            row = tirx.call_llvm_pure_intrin(acc, ADDP, *pairs)
            T.buffer_store(C, C.vload([i, 0], f"{kernel.acc_dtype}x{nr}") + row,
                           [i, tirx.Ramp(0, 1, nr)])

    return forms.build_impl(kernel, emit)


def impl_k_loop(kernel: Kernel, k_blocks: int):
    """The Armv8.0 kernel over a whole K loop of ``k_blocks`` blocks (``forms.desc_k_loop``).

    The 16 partial-sum vectors S_ij (one int32x4 per row i and column j of C) stay in
    registers across K: each K step is only the 32 widening multiplies and 32 pairwise
    accumulates (smull, smull2, sadalp, sadalp per pair), and the addp tree that turns
    them into rows of C runs once, after the loop:

        S_ij = 0
        for kb < k_blocks:   S_ij += saddlp(A[kb, i, 0:8] * B[kb, j, 0:8])      (sadalp)
                             S_ij += saddlp(A[kb, i, 8:16] * B[kb, j, 8:16])    (sadalp)
        C[i, 0:4] += addp(addp(S_i0, S_i1), addp(S_i2, S_i3))
    """
    from tvm import tirx
    from tvm.script import tirx as T

    mull, addlp, prod_dtype, mr, nr, kr, half, acc = _widening_setup(kernel)
    products = f"{prod_dtype}x{_HALF}"

    def emit(A, B, C):
        # S_ij lives at lanes [(i * nr + j) * 4, +4); constant indices only, so LLVM
        # promotes the whole buffer to registers.
        partial, = forms.registers(1, mr * nr * _LANES, "int32")

        def lanes(i, j):
            return tirx.Ramp((i * nr + j) * _LANES, 1, _LANES)

        for i in range(mr):
            for j in range(nr):
                T.buffer_store(partial, tirx.Broadcast(tirx.const(0, "int32"), _LANES),
                               [lanes(i, j)])
        # One loop step per 8-byte half of a block: S_ij += saddlp(smull(half, half)) is
        # one smull and one sadalp. Written per block (lo and hi halves in one expression)
        # LLVM's reassociation would first add the two saddlp results together and then
        # add that to S: three instructions instead of two. The half loop is unrolled only
        # after that pass has run.
        block = f"{kernel.a_dtype}x{kr}"
        with T.serial(k_blocks) as kb:
            a_rows = [T.bind(A.vload([kb, i, 0], block)) for i in range(mr)]
            b_rows = [T.bind(B.vload([kb, j, 0], block)) for j in range(nr)]
            with T.serial(kr // _HALF) as h:
                a_half = [T.bind(v) for v in _half_of(a_rows, h, half, kr)]
                b_half = [T.bind(v) for v in _half_of(b_rows, h, half, kr)]
                for i in range(mr):
                    for j in range(nr):
                        prod = tirx.call_llvm_pure_intrin(products, mull, a_half[i], b_half[j])
                        s_ij = partial.vload([(i * nr + j) * _LANES], acc)
                        T.buffer_store(partial,
                                       s_ij + tirx.call_llvm_pure_intrin(acc, addlp, prod),
                                       [lanes(i, j)])
        for i in range(mr):
            s = [partial.vload([(i * nr + j) * _LANES], acc) for j in range(nr)]
            pairs = [tirx.call_llvm_pure_intrin(acc, ADDP, s[j], s[j + 1])
                     for j in range(0, nr, 2)]
            row = tirx.call_llvm_pure_intrin(acc, ADDP, *pairs)
            T.buffer_store(C, C.vload([i, 0], f"{kernel.acc_dtype}x{nr}") + row,
                           [i, tirx.Ramp(0, 1, nr)])

    return forms.build_impl_k_loop(kernel, k_blocks, emit)


def impl_direct(kernel: Kernel, window: forms.DirectWindow, n_tiles: int, rows=None,
                a_extent: int | None = None):
    """The whole-K kernel (``impl_k_loop``) with A read in place (``forms.desc_direct``):
    its rows are runs of the input as ``window`` says (``forms.DirectWindow``), not a
    packed block. The packed A block of this kernel is four rows of 16 consecutive K
    bytes, which is exactly what 16 bytes of an input row already are: reading A in place
    changes only the address of each row's load, not a single instruction.

        for each run r of the rows (one for a pointwise conv, one per kernel row of a
        kh x kw one), each 16-byte block kb of the run, each 8-byte half h, each tile t:
            S_tij += saddlp(smull(A[row i, run r, 16kb + 8h : +8],
                                  B[t, kb of run r, j, 8h : +8]))
        C[t, i, 0:4] += addp(addp(S_ti0, S_ti1), addp(S_ti2, S_ti3))

    One micro-tile's 16 partial-sum vectors and 8 operand halves fill the register file,
    so ``conv2d_gemm`` picks n_tiles = 1 (more tiles are correct, and spill).

    A by-pixel window (the INDIRECT form) takes each row's offset in A from ``rows``, A
    being the whole flat input of ``a_extent`` elements (as ``dot.impl_direct``).
    """
    from tvm import tirx
    from tvm.script import tirx as T

    if kernels.DIRECT not in kernel.forms:
        raise ValueError(f"{kernel.name} has no direct-read form (int8 smull/sadalp only)")
    mull, addlp, prod_dtype, mr, nr, kr, half, acc = _widening_setup(kernel)
    products = f"{prod_dtype}x{_HALF}"
    blocks = window.segment // kr

    def emit(A, B, C):
        load = forms.row_loader(A, window, mr, rows)
        # S_tij at lanes [(i * nr + j) * 4, +4) of partial[t]: constant indices only
        partial = forms.registers(n_tiles, mr * nr * _LANES, "int32")

        def at(i, j):
            return (i * nr + j) * _LANES

        for t in range(n_tiles):
            for i in range(mr):
                for j in range(nr):
                    T.buffer_store(partial[t], tirx.Broadcast(tirx.const(0, "int32"), _LANES),
                                   [tirx.Ramp(at(i, j), 1, _LANES)])

        def run(r):
            # rows loaded whole per block, then one loop step per 8-byte half as in
            # impl_k_loop (one smull + one sadalp each); B one tile at a time, so that one
            # tile's rows are live at once (all n_tiles' spill beside the accumulators)
            block = f"{kernel.a_dtype}x{kr}"
            # a pointwise layer's one run unrolled too (forms.run_loop: measured)
            with forms.run_loop(window, blocks, single_run=True) as kb:
                offset = r * window.segment_stride + kb * kr
                a_rows = [T.bind(load(i, offset, block)) for i in range(mr)]
                for t in range(n_tiles):
                    b_rows = [T.bind(B.vload([t, r * blocks + kb, j, 0], block))
                              for j in range(nr)]
                    with T.serial(kr // _HALF) as h:
                        a_half = [T.bind(v) for v in _half_of(a_rows, h, half, kr)]
                        b_half = [T.bind(v) for v in _half_of(b_rows, h, half, kr)]
                        for i in range(mr):
                            for j in range(nr):
                                prod = tirx.call_llvm_pure_intrin(products, mull, a_half[i],
                                                                  b_half[j])
                                s_tij = partial[t].vload([at(i, j)], acc)
                                T.buffer_store(
                                    partial[t],
                                    s_tij + tirx.call_llvm_pure_intrin(acc, addlp, prod),
                                    [tirx.Ramp(at(i, j), 1, _LANES)])

        forms.for_each_run(window, run)
        for t in range(n_tiles):
            for i in range(mr):
                s = [partial[t].vload([at(i, j)], acc) for j in range(nr)]
                pairs = [tirx.call_llvm_pure_intrin(acc, ADDP, s[j], s[j + 1])
                         for j in range(0, nr, 2)]
                row = tirx.call_llvm_pure_intrin(acc, ADDP, *pairs)
                T.buffer_store(C, C.vload([t, i, 0], f"{kernel.acc_dtype}x{nr}") + row,
                               [t, i, tirx.Ramp(0, 1, nr)])

    return forms.build_impl_direct(kernel, window, n_tiles, emit, a_extent)


IMPLEMENTS = forms.Implementation(block=impl, k_loop=impl_k_loop, direct=impl_direct)
