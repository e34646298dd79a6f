"""Dot-product micro-kernels: sdot / udot by element (+dotprod).

``sdot Vd.4s, Vn.16b, Vm.4b[idx]`` splits its vector source into four 4-byte groups and
adds the dot product of group g of Vn and the indexed group of Vm into int32 lane g of Vd:

    Vd[g] += sum over k < 4 of Vn[4g + k] * Vm[4*idx + k]

One family per signedness (``kernels.FAMILIES``), on the packed layouts of ``kernels.py``
(C[mr, nr] += A[mr, kr] · B[nr, kr]^T; C is any row-major window, each row one 4-lane
vector).

4x4x4 (math: 4 x 4 · 4 x 4 → 4 x 4): one instruction per row of C.

    Vm = packed A block  | A[0,0:4] | A[1,0:4] | A[2,0:4] | A[3,0:4] |   group i = row i
    Vn = packed B block  | B[0,0:4] | B[1,0:4] | B[2,0:4] | B[3,0:4] |   group j = row j
    row i of C:            sdot Vc_i.4s, Vn.16b, Vm.4b[i]
    Vc_i = C[i, 0:4]     | C[i,0]   | C[i,1]   | C[i,2]   | C[i,3]   |
                           Vc_i[j] += sum_k B[j, k] * A[i, k]

  The 4 bytes of A's row i are the indexed (broadcast) group, B's block is the vector
  operand, so lane j of the result is column j of C and each row of C is one register.

One row, 1x4x4 (math: 1 x 4 · 4 x 4 → 1 x 4): the same instruction for a GEMM of one row
(a dense layer on one vector) and a GEMM's row tail, where the 4-row block would multiply
three rows of padding. B's packing is the 4x4x4 kernel's; A's block is the row's 4 bytes.

    Va   = A[0, 0:4] in every group       (the direct form: a 16-byte load of A holds
                                           four blocks, lane t picks block t)
    Vn   = packed B block  | B[0,0:4] | B[1,0:4] | B[2,0:4] | B[3,0:4] |
    C[0, 0:4]:             sdot Vc.4s, Vn.16b, Va.4b[t]

  In the block form LLVM loads the 4 bytes already replicated (``ld1r {Va.4s}``) and
  emits the by-vector form on that register: the same arithmetic, the same one load.

  Every byte of B is used once, so this form is bound by B's loads: one 16-byte load per
  instruction. Its direct-read form (``impl_direct``) keeps several column blocks'
  accumulators in flight, one register each.

Signedness: sdot (s8 x s8), udot (u8 x u8, accumulated in int32: the bit pattern equals the
uint32 one while sums stay below 2**31). All of it is exact integer arithmetic.
"""

from __future__ import annotations

from . import forms, kernels
from .kernels import Kernel

# operand dtype -> LLVM intrinsic (acc, vector source, indexed source)
DOT_INTRINSIC = {
    "int8": "llvm.aarch64.neon.sdot.v4i32.v16i8",
    "uint8": "llvm.aarch64.neon.udot.v4i32.v16i8",
}
KERNELS = tuple(k for k in kernels.TABLE if k.module == "dot")

_GROUP = 4  # bytes per dot-product group: one int32 lane of the accumulator
_LANES = 4  # int32 lanes of a 128-bit accumulator (= groups per 16-byte source)
# Rows of A a by-element block can have: four (one indexed lane each), or one (the
# one-row kernels: its group broadcast; select gives them to GEMMs of one row)
ROWS = (1, _LANES)


def _dot(kernel: Kernel, acc, first, second):
    """acc + the per-group dot products of two 16-byte operands."""
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(f"int32x{_LANES}",
                                      DOT_INTRINSIC[kernel.a_dtype],
                                      acc, first, second)


def _by_element(kernel: Kernel):
    from tvm import tirx
    from tvm.script import tirx as T

    forms.check_shape(kernel, ROWS, _LANES, _GROUP)
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    vector = f"x{_LANES * _GROUP}"
    row = f"{kernel.acc_dtype}x{nr}"

    def emit(A, B, C):
        vb = T.bind(B.vload([0, 0], kernel.b_dtype + vector))
        # A's block as int32 lanes, one per row: lane i is row i's 4-byte group (one row:
        # a single int32, broadcast below)
        a_block = A.vload([0, 0], f"{kernel.a_dtype}x{mr * kr}")
        a_groups = T.bind(tirx.reinterpret("int32" if mr == 1 else f"int32x{mr}", a_block))
        for i in range(mr):
            group = (tirx.Broadcast(a_groups, _LANES) if mr == 1
                     else tirx.Shuffle([a_groups], [i] * _LANES))
            a_row_i = tirx.reinterpret(kernel.a_dtype + vector, group)
            # LLVM folds the broadcast into the indexed form where the instruction's
            # indexed operand sits: the second source
            value = _dot(kernel, C.vload([i, 0], row), vb, a_row_i)
            T.buffer_store(C, value, [i, tirx.Ramp(0, 1, nr)])

    return forms.build_impl(kernel, emit)


def impl_direct(kernel: Kernel, window: forms.DirectWindow, n_tiles: int, rows=None,
                a_extent: int | None = None):
    """A by-element kernel over a whole K loop with A read in place (``forms.desc_direct``):
    A is mr rows of the input laid out as ``window`` says (``forms.DirectWindow``: each
    row one or more runs of contiguous K elements), unpacked; B is n_tiles packed column
    blocks.

    B's packed 4x4 block of K step s (kr = 4 bytes of K per step) is already the vector
    operand of the by-element form, and a 16-byte load of a run of A's row i holds four K
    steps; the lane index picks the step, so A needs no interleaving:

        for each run r of the rows (a kernel row of a kh x kw convolution; one run for
        a pointwise one), for each 16 bytes c of the run:
            Va_i = A[row i, run r, 16c:16c+16] = | step 4c | 4c+1 | 4c+2 | 4c+3 |
            for t < 4, tile < n_tiles:
                Vb = B[tile, step 4c + t of run r]    (the 4 columns' bytes of the step)
                for i < mr: Vc[tile, i] += sdot(Vb, Va_i.4b[t])

    The n_tiles * mr accumulators stay in registers across K and every A load serves
    n_tiles * 4 instructions. A run's tail of fewer than four steps loads each step's
    4 bytes of a row on its own.

    A by-pixel window (the INDIRECT form) takes each row's offset in A from ``rows``
    (``DirectWindow.row_offsets``), A being the whole flat input of ``a_extent``
    elements; the instructions are the same.
    """
    from tvm import tirx
    from tvm.script import tirx as T

    if kernels.DIRECT not in kernel.forms:
        raise ValueError(f"{kernel.name} has no direct-read form (int8 sdot only)")
    forms.check_shape(kernel, ROWS, _LANES, _GROUP)
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    steps = window.segment // kr  # K steps per run
    chunk = _LANES  # K steps per 16-byte row load
    full, tail = divmod(steps, chunk)
    vector = f"x{_LANES * _GROUP}"
    row = f"{kernel.acc_dtype}x{nr}"

    def emit(A, B, C):
        load = forms.row_loader(A, window, mr, rows)
        # tile's accumulator row i at lanes [i * nr, +nr) of acc[tile]
        acc = forms.registers(n_tiles, mr * nr, kernel.acc_dtype)

        def lanes(i):
            return tirx.Ramp(i * nr, 1, nr)

        def accumulate(step, a_groups, lane):
            for tile in range(n_tiles):
                vb = T.bind(B.vload([tile, step, 0, 0], kernel.b_dtype + vector))
                for i in range(mr):
                    a_step = tirx.reinterpret(kernel.a_dtype + vector,
                                              tirx.Shuffle([a_groups[i]], [lane] * _LANES))
                    old = acc[tile].vload([i * nr], row)
                    # the broadcast A step is the second source, where sdot's indexed
                    # operand sits, so LLVM emits the by-element form (see _by_element)
                    T.buffer_store(acc[tile], _dot(kernel, old, vb, a_step), [lanes(i)])

        def run(r):
            """The K steps of run r (a Python int or a loop variable)."""
            start, first_step = r * window.segment_stride, r * steps
            if full:
                with forms.run_loop(window, full) as c:
                    a_groups = [T.bind(tirx.reinterpret(
                        f"int32x{_LANES}",
                        load(i, start + c * chunk * kr, kernel.a_dtype + vector)))
                        for i in range(mr)]
                    for t in range(chunk):
                        accumulate(first_step + c * chunk + t, a_groups, t)
            for t in range(tail):
                step = full * chunk + t
                a_groups = [T.bind(tirx.Broadcast(tirx.reinterpret(
                    "int32", load(i, start + step * kr, f"{kernel.a_dtype}x{kr}")), _LANES))
                    for i in range(mr)]
                accumulate(first_step + step, a_groups, 0)

        for tile in range(n_tiles):
            for i in range(mr):
                T.buffer_store(acc[tile], C.vload([tile, i, 0], row), [lanes(i)])
        forms.for_each_run(window, run)
        for tile in range(n_tiles):
            for i in range(mr):
                T.buffer_store(C, acc[tile].vload([i * nr], row),
                               [tile, i, tirx.Ramp(0, 1, nr)])

    return forms.build_impl_direct(kernel, window, n_tiles, emit, a_extent)


def impl(kernel: Kernel):
    """The impl PrimFunc of a dot-product kernel's block form."""
    if kernel not in KERNELS:
        raise ValueError(f"{kernel.name} is not a dot-product kernel")
    return _by_element(kernel)


IMPLEMENTS = forms.Implementation(block=impl, direct=impl_direct)
