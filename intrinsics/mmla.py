"""Matrix multiply-accumulate micro-kernels: smmla, ummla, usmmla (+i8mm) and bfmmla (+bf16).

Each of these instructions multiplies two 2-row matrices held in one 128-bit register each
and adds the 2x2 product into a third register, so one instruction is one whole
micro-kernel block of ``kernels.py``:

    C[2, 2] += A[2, kr] · B[2, kr]^T        (math: 2 x kr · kr x 2 → 2 x 2)

    int8 (smmla / ummla / usmmla), kr = 8:   Vd.4s += Vn.16b · Vm.16b
    bf16 (bfmmla),                 kr = 4:   Vd.4s += Vn.8h  · Vm.8h

Register layout (int8 shown; for bf16 read 4 halfwords per row instead of 8 bytes):

    Vn = packed A block   | A[0,0] A[0,1] .. A[0,7] | A[1,0] A[1,1] .. A[1,7] |
    Vm = packed B block   | B[0,0] B[0,1] .. B[0,7] | B[1,0] B[1,1] .. B[1,7] |
                            (row j of B is column j of the kr x 2 right operand)
    Vd = C window         | C[0,0] | C[0,1] | C[1,0] | C[1,1] |   (lane 2*i + j)

    Vd[2*i + j] += sum over k < kr of A[i, k] * B[j, k]

The packed layouts A[M/2, K/kr, 2, kr] and B[N/2, K/kr, 2, kr] put each block in 16
consecutive bytes, so the operands are plain 128-bit loads. C is any row-major 2x2 window
(its row stride is free): its two rows are loaded as 2-lane vectors and joined.

Integer kernels are exact (32-bit products and sums; the accumulator is int32 for ummla too,
whose bit pattern equals the uint32 one while sums stay below 2**31). ``usmmla`` treats Vn
(A) as unsigned and Vm (B) as signed.

bfmmla rounds: with FPCR.EBF = 0 (Linux's default) each output element is
``((c + (a0*b0 + a1*b1)) + (a2*b2 + a3*b3))`` where every product and sum is rounded to
float32 with round-to-odd and denormal inputs and results are flushed to zero. It is not
bit-identical to the scalar reference (``forms.desc``), which only describes what is
computed for tensorize to match.
"""

from __future__ import annotations

import contextlib

from . import forms, kernels
from .kernels import Kernel

# kernel name -> the LLVM intrinsic of its block (bfmmla: called through BFMMLA_SHIM below)
LLVM_INTRINSIC = {
    kernels.GEMM_S8S8S32_2X2X8_I8MM: "llvm.aarch64.neon.smmla.v4i32.v16i8",
    kernels.GEMM_U8U8S32_2X2X8_I8MM: "llvm.aarch64.neon.ummla.v4i32.v16i8",
    kernels.GEMM_U8S8S32_2X2X8_I8MM: "llvm.aarch64.neon.usmmla.v4i32.v16i8",
    kernels.GEMM_BF16BF16F32_2X2X4_BF16: "llvm.aarch64.neon.bfmmla",
}
KERNELS = tuple(kernels.get(name) for name in LLVM_INTRINSIC)

# Geometry of every mmla instruction: two rows of A and two of B per 128-bit register.
_ROWS = 2
_VECTOR_BITS = 128

# TVM 0.27 cannot call llvm.aarch64.neon.bfmmla directly: its LLVM code generator has no
# bfloat type (DTypeToLLVMType maps only int/uint/float) and its bf16 legalization turns
# bf16 values into uint16 storage / float32 math before code generation, so the intrinsic's
# <8 x bfloat> operands can never be produced from TIR. The impl therefore calls this
# three-instruction LLVM IR shim, which TVM links into the module (``pragma_import_llvm``)
# and LLVM inlines: the emitted code is one bfmmla on the loaded registers.
BFMMLA_SHIM = "tvm_armq_bfmmla_v4f32"
BFMMLA_SHIM_IR = f"""
define linkonce_odr hidden <4 x float> @{BFMMLA_SHIM}(
    <4 x float> %c, <8 x i16> %a, <8 x i16> %b) #0 {{
  %va = bitcast <8 x i16> %a to <8 x bfloat>
  %vb = bitcast <8 x i16> %b to <8 x bfloat>
  %r = call <4 x float> @llvm.aarch64.neon.bfmmla(
      <4 x float> %c, <8 x bfloat> %va, <8 x bfloat> %vb)
  ret <4 x float> %r
}}
declare <4 x float> @llvm.aarch64.neon.bfmmla(<4 x float>, <8 x bfloat>, <8 x bfloat>)
attributes #0 = {{ alwaysinline nounwind "target-features"="+neon,+bf16" }}
"""


def _bits(dtype: str) -> int:
    return 16 if dtype == "bfloat16" else int("".join(ch for ch in dtype if ch.isdigit()))


def impl(kernel: Kernel):
    """The impl PrimFunc of an mmla kernel: load the A and B blocks whole, gather the C
    window into one register, one (b)fmmla, scatter the 2x2 result back to C's rows."""
    from tvm import tirx
    from tvm.ir import StringImm
    from tvm.script import tirx as T

    if kernel.name not in LLVM_INTRINSIC:
        raise ValueError(f"{kernel.name} is not an mmla kernel")
    kr = _VECTOR_BITS // (_ROWS * _bits(kernel.a_dtype))
    forms.check_shape(kernel, _ROWS, _ROWS, kr)
    mr, nr = kernel.mr, kernel.nr
    ab_lanes = mr * kr  # elements of one A (or B) block: one 128-bit register
    c_lanes = mr * nr
    acc_vec = f"{kernel.acc_dtype}x{c_lanes}"
    row_vec = f"{kernel.acc_dtype}x{nr}"
    bf16 = kernel.a_dtype == "bfloat16"

    def mmla(acc, va, vb):
        if bf16:
            return T.bind(tirx.call_pure_extern(acc_vec, BFMMLA_SHIM, acc, va, vb))
        return T.bind(tirx.call_llvm_pure_intrin(acc_vec, LLVM_INTRINSIC[kernel.name], acc,
                                                 va, vb))

    def emit(A, B, C):
        if bf16:  # read bf16 blocks as their bits (see BFMMLA_SHIM above)
            A = T.decl_buffer(A.shape, "uint16", data=A.data, elem_offset=A.elem_offset)
            B = T.decl_buffer(B.shape, "uint16", data=B.data, elem_offset=B.elem_offset)
        va = A.vload([0, 0], f"{A.dtype}x{ab_lanes}")
        vb = B.vload([0, 0], f"{B.dtype}x{ab_lanes}")
        # bf16: the shim's IR is linked in by an attribute around every use of it
        scope = (T.attr(0, "pragma_import_llvm", StringImm(BFMMLA_SHIM_IR)) if bf16
                 else contextlib.nullcontext())
        # The row stride of C is known once the block is tensorized, so one of these two
        # branches folds away. A contiguous 2x2 window (the GEMM schedule's accumulator
        # tile) is exactly the register's lane order: one 128-bit load and one store, and
        # LLVM keeps it in a register across the K loop. Any other window is gathered
        # from and scattered to its two rows.
        with scope:
            with T.If(C.strides[0] == nr):
                with T.Then():
                    flat = T.decl_buffer((c_lanes,), C.dtype, data=C.data,
                                         elem_offset=C.elem_offset)
                    res = mmla(flat.vload([0], acc_vec), va, vb)
                    T.buffer_store(flat, res, [tirx.Ramp(0, 1, c_lanes)])
                with T.Else():
                    rows = [C.vload([i, 0], row_vec) for i in range(mr)]
                    res = mmla(tirx.Shuffle(rows, list(range(c_lanes))), va, vb)
                    for i in range(mr):
                        T.buffer_store(C, tirx.Shuffle([res], list(range(i * nr, (i + 1) * nr))),
                                       [i, tirx.Ramp(0, 1, nr)])

    return forms.build_impl(kernel, emit)


def impl_direct(kernel: Kernel, window: forms.DirectWindow, n_tiles: int, rows=None,
                a_extent: int | None = None):
    """An integer mmla kernel over a whole K loop with A read in place (``forms.desc_direct``;
    a by-pixel window, the INDIRECT form, takes each row's start from ``rows`` in the whole
    flat input of ``a_extent`` elements): the micro-tile's two rows of A are runs of the
    input (``forms.DirectWindow``), B is n_tiles packed column blocks.

    smmla wants the two rows interleaved by K block (Vn = row 0's 8 bytes, then row 1's),
    which the pack does once. Read in place, 16 bytes of each row hold two K blocks, and
    two zips of the 64-bit halves make both operands:

        for each run r, each 16 bytes c of the run:
            R0 = A[row 0, run r, 16c : 16c+16]      R1 = A[row 1, ...]
            Vn_even = zip1.2d(R0, R1)   = | row 0, block 2c   | row 1, block 2c   |
            Vn_odd  = zip2.2d(R0, R1)   = | row 0, block 2c+1 | row 1, block 2c+1 |
            for tile < n_tiles:  Vc[tile] = smmla(Vc[tile], Vn_even, B[tile, block 2c])
                                 Vc[tile] = smmla(Vc[tile], Vn_odd, B[tile, block 2c+1])

    The n_tiles accumulators (one register each: the 2 x 2 block, lane 2i + j) stay in
    registers across K and every pair of A loads serves 2 * n_tiles instructions. A run of
    an odd number of blocks takes its last block from two 8-byte loads.
    """
    from tvm import tirx
    from tvm.script import tirx as T

    if kernels.DIRECT not in kernel.forms:
        raise ValueError(f"{kernel.name} has no direct-read form (integer mmla only)")
    kr = _VECTOR_BITS // (_ROWS * _bits(kernel.a_dtype))
    forms.check_shape(kernel, _ROWS, _ROWS, kr)
    mr, nr = kernel.mr, kernel.nr
    ab_lanes = mr * kr  # elements of one A (or B) block: one 128-bit register
    acc_vec, row_vec = f"{kernel.acc_dtype}x{mr * nr}", f"{kernel.acc_dtype}x{nr}"
    blocks = window.segment // kr  # K blocks per run
    pairs, odd = divmod(blocks, 2)
    # lanes of two rows' 16 bytes that make the even and the odd block's operand
    even = list(range(kr)) + list(range(ab_lanes, ab_lanes + kr))
    odd_lanes = list(range(kr, ab_lanes)) + list(range(ab_lanes + kr, 2 * ab_lanes))

    def emit(A, B, C):
        load = forms.row_loader(A, window, mr, rows)
        acc = forms.registers(n_tiles, mr * nr, kernel.acc_dtype)  # a tile's 2 x 2 window
        for t in range(n_tiles):  # lane 2i + j
            c_rows = [C.vload([t, i, 0], row_vec) for i in range(mr)]
            T.buffer_store(acc[t], tirx.Shuffle(c_rows, list(range(mr * nr))),
                           [tirx.Ramp(0, 1, mr * nr)])

        def multiply(block, va):
            for t in range(n_tiles):
                vb = B.vload([t, block, 0, 0], f"{kernel.b_dtype}x{ab_lanes}")
                old = acc[t].vload([0], acc_vec)
                T.buffer_store(acc[t], tirx.call_llvm_pure_intrin(
                    acc_vec, LLVM_INTRINSIC[kernel.name], old, va, vb),
                    [tirx.Ramp(0, 1, mr * nr)])

        def run(r):
            start, first = r * window.segment_stride, r * blocks
            if pairs:
                with T.serial(pairs) as c:
                    both = [T.bind(load(i, start + c * 2 * kr, f"{kernel.a_dtype}x{ab_lanes}"))
                            for i in range(mr)]
                    multiply(first + 2 * c, T.bind(tirx.Shuffle(both, even)))
                    multiply(first + 2 * c + 1, T.bind(tirx.Shuffle(both, odd_lanes)))
            if odd:
                halves = [load(i, start + pairs * 2 * kr, f"{kernel.a_dtype}x{kr}")
                          for i in range(mr)]
                multiply(first + 2 * pairs, T.bind(tirx.Shuffle(halves, list(range(ab_lanes)))))

        forms.for_each_run(window, run)
        for t in range(n_tiles):
            res = acc[t].vload([0], acc_vec)
            for i in range(mr):
                T.buffer_store(C, tirx.Shuffle([res], list(range(i * nr, (i + 1) * nr))),
                               [t, i, tirx.Ramp(0, 1, nr)])

    return forms.build_impl_direct(kernel, window, n_tiles, emit, a_extent)


IMPLEMENTS = forms.Implementation(block=impl, direct=impl_direct)
