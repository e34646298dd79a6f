"""Quantized BATCH_MATMUL of two int8 tensors made at run time (attention's Q.K^T and P.V).

Read this first. TFLite's BATCH_MATMUL multiplies the last two axes of its operands,
``out[b, i, j] = sum_k lhs[b, i, k] * rhs[b, k, j]``, the batch axes broadcast as NumPy
broadcasts them (an axis of 1 repeats), ``adj_x`` / ``adj_y`` swapping the last two axes of
that operand first. For int8 tensors its reference kernel (``reference_ops::BatchMatMul``)
computes, per output element,

    acc = sum_k (lhs - zp_lhs) * (rhs - zp_rhs)                 int32
    out = clamp(M(acc, m, e) + zp_out, act_lo, act_hi)          M: MultiplyByQuantizedMultiplier

with ``m, e`` from ``s_lhs * s_rhs / s_out``: the product of the two float32 scales in
float32, then divided in double (TFLite's ``GetQuantizedConvolutionMultipler``), split by
``QuantizeMultiplier``. ``M`` rounds twice (gemmlowp's way), as the 32-bit accumulator
overload does (measured on ``BUILTIN_REF``: ``tests/test_batch_matmul.py``).

Layout. ``batch_matmul_func(schedule=False)`` is the plain definition: both operands read
where they lie, one int32 reduction per output element. The scheduled func runs the
product on the level's GEMM micro-kernel (``intrinsics/kernels.py``: ``kernel_for`` is
``kernels.select`` for the product's M and K; ``kernel_name`` names it), as a dense layer
does, except that both operands arrive at run time, so both are packed by stages of the
same PrimFunc, per operand batch (a broadcast operand is packed once):

    A_packed[*lhs batch, M/mr, K/kr, mr, kr]   rows of lhs (its columns with adj_x)
    B_packed[*rhs batch, N/nr, K/kr, nr, kr]   columns of rhs (its rows with adj_y:
                                               Q.K^T's K rows are B's rows as they lie)

K is zero-padded to kr in both (the padded products are 0 x 0), rows past M and N repeat
the last one (computed, never stored). The zero points, with sums over the real K only:

    sum_k (a - za)(b - zb) = sum_k ab - zb * A_sum[m] - za * B_sum[n] + K za zb

``A_sum`` / ``B_sum`` (only where the other operand's zero point is not 0) add the packed
blocks in order, one vector per K block. The ``gemm`` stage is computed one macro tile
(``REGISTER_TILE``: the kernel's micro-tiles that fill the register file) at a time
where the ``output`` stage consumes it: the int32 tile stays in registers, gets the
zero-point terms and TFLite's double-rounded requantization (``qmuls.requantize_narrow``,
the int8 output step) and is stored as int8; only the tile's rows and columns inside
M x N are stored. Macro-tile columns of every batch run in parallel.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tvm_armq.intrinsics import kernels
from tvm_armq.intrinsics.kernels import Kernel
from tvm_armq.intrinsics.requant import quantize_multiplier

OP = "BATCH_MATMUL"
# stage names: the epilogue's (the func's output), and its scratch where N is cropped
OUTPUT, OUTPUT_TILES = "output", "output_tiles"


@dataclasses.dataclass(frozen=True)
class BatchMatmulShape:
    """The operands' shapes and what multiplies what: ``rows`` x ``depth`` times ``depth``
    x ``cols`` for each index of ``batch`` (the broadcast batch shape)."""

    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    adj_x: bool = False
    adj_y: bool = False

    def __post_init__(self):
        if len(self.lhs) < 2 or len(self.rhs) < 2:
            raise ValueError(f"{OP}: operands of rank 2 or more, got {self.lhs}, {self.rhs}")
        depth_rhs = self.rhs[-1] if self.adj_y else self.rhs[-2]
        if self.depth != depth_rhs:
            raise ValueError(f"{OP}: depth {self.depth} of {self.lhs} does not match "
                             f"{depth_rhs} of {self.rhs}")
        np.broadcast_shapes(self.lhs[:-2], self.rhs[:-2])  # ValueError if they do not

    @property
    def rows(self) -> int:
        return self.lhs[-1] if self.adj_x else self.lhs[-2]

    @property
    def depth(self) -> int:
        return self.lhs[-2] if self.adj_x else self.lhs[-1]

    @property
    def cols(self) -> int:
        return self.rhs[-2] if self.adj_y else self.rhs[-1]

    @property
    def batch(self) -> tuple[int, ...]:
        return tuple(np.broadcast_shapes(self.lhs[:-2], self.rhs[:-2]))

    @property
    def out(self) -> tuple[int, ...]:
        return (*self.batch, self.rows, self.cols)

    @property
    def macs(self) -> int:
        return int(np.prod(self.out)) * self.depth


@dataclasses.dataclass(frozen=True)
class BatchMatmulParams:
    """TFLite's Prepare of an 8-bit BATCH_MATMUL (the keywords of ``reference``)."""

    lhs_zp: int
    rhs_zp: int
    out_zp: int
    multiplier: int
    shift: int
    act_range: tuple[int, int]


def batch_matmul_params(lhs_q, rhs_q, out_q, act_range=None) -> BatchMatmulParams:
    """``*_q`` = (float32 scale, zero point); ``act_range`` the fused activation's clamp in
    output units (None: the int8 range)."""
    product = np.float32(lhs_q[0]) * np.float32(rhs_q[0])  # float32, as TFLite
    real = np.float64(product) / np.float64(np.float32(out_q[0]))
    m, e = quantize_multiplier(float(real))
    info = np.iinfo(np.int8)
    lo, hi = (int(info.min), int(info.max)) if act_range is None else map(int, act_range)
    return BatchMatmulParams(int(lhs_q[1]), int(rhs_q[1]), int(out_q[1]), int(m), int(e),
                             (lo, hi))


def _operand(x: np.ndarray, adjoint: bool) -> np.ndarray:
    return np.swapaxes(x, -1, -2) if adjoint else x


def reference(lhs, rhs, shape: BatchMatmulShape, p: BatchMatmulParams) -> np.ndarray:
    """NumPy definition: the int8 output of ``shape``'s product (TFLite's arithmetic)."""
    from .reference import requantize

    a = _operand(np.asarray(lhs, np.int64), shape.adj_x) - p.lhs_zp
    b = _operand(np.asarray(rhs, np.int64), shape.adj_y) - p.rhs_zp
    acc = np.matmul(a, b)
    return requantize(acc, p.multiplier, p.shift, p.out_zp, *p.act_range, "int8")


# ------------------------------------------------------------------ the kernel
# The target of ``target=None`` ("any aarch64"): the Armv8.0 baseline every aarch64 CPU runs.
AARCH64_BASELINE = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def _target(target):
    """``target`` as a ``tvm.target.Target`` (None: ``AARCH64_BASELINE``). A portable
    target's own attributes are its baseline level's (``tvm_armq.targets.portable``), so
    the kernel chosen for it is the baseline's and never SIGILLs there."""
    import tvm

    if target is None:
        return tvm.target.Target(AARCH64_BASELINE)
    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def kernel_for(shape: BatchMatmulShape, target=None) -> Kernel:
    """The GEMM micro-kernel of the selection table the scheduled func runs ``shape`` on:
    ``kernels.select`` for int8 x int8 with the product's rows (M) and depth (K)."""
    return kernels.select(_target(target), "int8", "int8", rows=shape.rows, depth=shape.depth)


def kernel_name(shape: BatchMatmulShape, target=None) -> str:
    """The name of the micro-kernel the scheduled func of ``shape`` uses on ``target`` (the
    naming grammar's GEMM name, ``gemm_s8s8s32_<mr>x<nr>x<kr>_<isa>``)."""
    return kernel_for(shape, target).name


# ------------------------------------------------------------------ the definition
def _operand_index(operand_shape, batch, b_idx):
    """The batch indices of an operand of ``operand_shape`` at output batch index
    ``b_idx``: its batch axes align with the last ones of ``batch``; an axis of 1 repeats."""
    lead = len(batch) - (len(operand_shape) - 2)
    return [0 if n == 1 else b_idx[lead + d] for d, n in enumerate(operand_shape[:-2])]


def _element(t, adjoint: bool, idx, r, c):
    """Element (r, c) of operand ``t`` after its adjoint, at its batch index ``idx``."""
    return t[(*idx, c, r) if adjoint else (*idx, r, c)]


def _definition_te(shape: BatchMatmulShape, p: BatchMatmulParams):
    """(lhs, rhs, out) of the plain definition: one int32 reduction per output element."""
    from tvm import te

    from tvm_armq.intrinsics.qmuls import requantize

    lhs = te.placeholder(shape.lhs, "int8", "lhs")
    rhs = te.placeholder(shape.rhs, "int8", "rhs")
    k = te.reduce_axis((0, shape.depth), "k")
    batch = shape.batch

    def acc(*idx):
        b_idx, i, j = idx[:-2], idx[-2], idx[-1]
        a = _element(lhs, shape.adj_x, _operand_index(shape.lhs, batch, b_idx), i, k)
        b = _element(rhs, shape.adj_y, _operand_index(shape.rhs, batch, b_idx), k, j)
        return te.sum((a.astype("int32") - p.lhs_zp) * (b.astype("int32") - p.rhs_zp), axis=k)

    total = te.compute(shape.out, acc, name="acc")
    out = te.compute(shape.out, lambda *i: requantize(
        total(*i), p.multiplier, p.shift, p.out_zp, *p.act_range).astype("int8"), name="out")
    return lhs, rhs, out


# ------------------------------------------------------------------ the packed GEMM
@dataclasses.dataclass(frozen=True)
class PackedLayout:
    """The blocks of ``shape``'s GEMM on ``kernel``: mb x nb micro-tiles of mr x nr
    outputs over kb blocks of kr (each ceil: rows and columns past M and N repeat the last
    one and are never stored, K past ``depth`` is zero), computed m_tiles x n_tiles
    micro-tiles (one macro tile) at a time; mb and nb are rounded up to multiples of
    m_tiles and n_tiles."""

    shape: BatchMatmulShape
    kernel: Kernel
    m_tiles: int = 1
    n_tiles: int = 1

    @property
    def mb(self) -> int:
        """ceil(M / mr) rounded up to whole macro-tile rows."""
        blocks = -(-self.shape.rows // self.kernel.mr)
        return -(-blocks // self.m_tiles) * self.m_tiles

    @property
    def nb(self) -> int:
        """ceil(N / nr) rounded up to whole macro-tile columns."""
        blocks = -(-self.shape.cols // self.kernel.nr)
        return -(-blocks // self.n_tiles) * self.n_tiles

    @property
    def kb(self) -> int:
        return -(-self.shape.depth // self.kernel.kr)

    @property
    def crops(self) -> bool:
        """Whether the epilogue writes whole micro-tile columns to a scratch
        (``OUTPUT_TILES``) that a copy crops to N: nb * nr is more than N."""
        return self.nb * self.kernel.nr != self.shape.cols


# The macro tile of each kind of micro-kernel (``Kernel.usage``), m_tiles x n_tiles
# micro-tiles: the register tile whose K loop runs closest to the MAC instruction's rate
# and whose epilogue keeps up. Measured with armperf 4 (est. cycles, one thread; ViT-Tiny's
# 3 heads of 197 x 64 x 197 and 197 x 197 x 64, the zoo ViT's 4 heads of 65 x 16 x 65),
# against the conv2d GEMM's plan (``gemm_plan``) cut to divisors of the block counts:
#   widening (neon, 4 x 4):    2 x 1. ViT-Tiny Q.K^T 1.50e6 -> 1.38e6, P.V 1.23e6 ->
#                              1.20e6; ViT Q.K^T 1.10e5 -> 9.80e4 (2 x 2: 1.45e6, 9.86e4)
#   by_element (dotprod, 4x4): 2 x 2, sixteen int32x4 accumulators. ViT-Tiny Q.K^T
#                              5.65e5 -> 4.62e5, P.V 4.72e5 -> 4.36e5; ViT Q.K^T 5.19e4
#                              -> 4.86e4 (2 x 3: 5.40e5; 3 x 2: 4.93e5)
#   matrix (i8mm, 2 x 2):      4 x 4, sixteen accumulators. ViT-Tiny Q.K^T 3.12e5 ->
#                              3.09e5, P.V 2.78e5 -> 2.63e5 (4 x 2: 3.84e5; 6 x 4: 3.11e5)
REGISTER_TILE = {"widening": (2, 1), "by_element": (2, 2), "matrix": (4, 4)}


def packed_layout(shape: BatchMatmulShape, kernel: Kernel) -> PackedLayout:
    """The layout the scheduled func uses: ``REGISTER_TILE``'s macro tile for the kernel,
    no larger than the product (a macro tile of several micro-tiles on a product of one
    would compute padding). M and N are padded to whole macro tiles: the rows past M are
    not stored (a predicate per row of the tile), the columns past N are cropped
    (``PackedLayout.crops``). A tile row must also be whole int32x4 registers, the only
    vectors ``requantize_narrow`` runs on NEON's narrowing instructions (others fall back
    to 64-bit lanes): where it is not (nr = 2 at i8mm with one micro-tile), n_tiles is
    rounded up to whole registers."""
    import math

    from tvm_armq.intrinsics.qmuls import NEON_INT32_LANES

    base = PackedLayout(shape, kernel)
    m_tiles, n_tiles = REGISTER_TILE[kernel.usage]
    m_tiles, n_tiles = min(m_tiles, base.mb), min(n_tiles, base.nb)
    if n_tiles * kernel.nr % NEON_INT32_LANES:
        per_register = NEON_INT32_LANES // math.gcd(NEON_INT32_LANES, kernel.nr)
        n_tiles = -(-n_tiles // per_register) * per_register
    return PackedLayout(shape, kernel, m_tiles, n_tiles)


def _pack_te(t, operand_shape, adjoint: bool, rows: int, depth: int, xr: int, kr: int,
             name: str, transposed: bool, blocks: int):
    """``name``[*batch of t, blocks, depth/kr, xr, kr]: operand ``t`` as the kernel's
    packed blocks (``blocks`` * xr >= rows), row x of block bx at row min(bx * xr + x,
    rows - 1), K past ``depth`` zero. ``transposed``: the GEMM operand is t's rows
    (False) or t's columns (True) after its adjoint."""
    from tvm import te, tirx

    xb, kb = blocks, -(-depth // kr)

    def element(*ix):
        idx, bx, bk, x, kk = ix[:-4], *ix[-4:]
        r = bx * xr + x
        if xb * xr != rows:
            r = tirx.min(r, rows - 1)
        k = bk * kr + kk
        v = _element(t, adjoint != transposed, idx, r, k)
        if depth % kr:
            v = tirx.if_then_else(k < depth, v, tirx.const(0, "int8"))
        return v

    return te.compute((*operand_shape[:-2], xb, kb, xr, kr), element, name=name)


def _sums_te(packed, name: str):
    """``name``[*batch, blocks, xr]: each packed row summed over K (int32; K's zero
    padding adds nothing), in two stages read in the packed order: ``name``_part[*batch,
    blocks, xr, kr], the block row's K blocks added (one vector of xr * kr lanes each),
    then each row's kr lanes."""
    from tvm import te

    *lead, xb, kb, xr, kr = (int(d) for d in packed.shape)
    rb = te.reduce_axis((0, kb), "sb")
    part = te.compute(
        (*lead, xb, xr, kr),
        lambda *ix: te.sum(packed[(*ix[:-2], rb, *ix[-2:])].astype("int32"), axis=rb),
        name=name + "_part")
    rk = te.reduce_axis((0, kr), "sk")
    return te.compute((*lead, xb, xr), lambda *ix: te.sum(part[(*ix, rk)], axis=rk),
                      name=name)


def _packed_te(shape: BatchMatmulShape, p: BatchMatmulParams, kernel: Kernel):
    """(lhs, rhs, out) of the packed GEMM: stages ``A_packed``, ``B_packed``, their row
    sums ``A_sum`` / ``B_sum`` (where the other operand's zero point needs them),
    ``gemm`` (int32 blocks) and ``output`` (zero-point terms and requantization)."""
    from tvm import te

    from tvm_armq.intrinsics.qmuls import requantize_narrow

    lay = packed_layout(shape, kernel)
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    m, n, k = shape.rows, shape.cols, shape.depth
    batch = shape.batch
    lhs = te.placeholder(shape.lhs, "int8", "lhs")
    rhs = te.placeholder(shape.rhs, "int8", "rhs")
    a_packed = _pack_te(lhs, shape.lhs, shape.adj_x, m, k, mr, kr, "A_packed", False,
                        lay.mb)
    b_packed = _pack_te(rhs, shape.rhs, shape.adj_y, n, k, nr, kr, "B_packed", True,
                        lay.nb)
    a_sum = _sums_te(a_packed, "A_sum") if p.rhs_zp else None
    b_sum = _sums_te(b_packed, "B_sum") if p.lhs_zp else None
    rb, rk = te.reduce_axis((0, lay.kb), "kb"), te.reduce_axis((0, kr), "kk")

    def block(*ix):
        b_idx, (bm, bn, i, j) = ix[:-4], ix[-4:]
        ia, ib = _operand_index(shape.lhs, batch, b_idx), _operand_index(shape.rhs, batch, b_idx)
        return te.sum(a_packed[(*ia, bm, rb, i, rk)].astype("int32")
                      * b_packed[(*ib, bn, rb, j, rk)].astype("int32"), axis=[rb, rk])

    gemm = te.compute((*batch, lay.mb, lay.nb, mr, nr), block, name="gemm")

    def output(*ix):
        # as TE says it: the gemm tile plus the zero-point terms, requantized. The
        # scheduled func moves the terms to the tile's start (``_start_at_zero_point_terms``)
        b_idx, r, c = ix[:-2], ix[-2], ix[-1]
        x = gemm(*b_idx, r // mr, c // nr, r % mr, c % nr) + zero_point_terms(
            shape, p, a_sum, b_sum, *b_idx, r // mr, c // nr, r % mr, c % nr)
        return requantize_narrow(x, p.multiplier, p.shift, p.out_zp, *p.act_range)

    if not lay.crops:
        return lhs, rhs, te.compute(shape.out, output, name=OUTPUT)
    # N is no whole number of micro-tile columns: the epilogue writes whole tile rows of
    # a scratch buffer (a predicate on the last tile's columns would turn every tile's
    # requantization into scalar code), and a copy crops them to N
    tile = te.compute((*batch, m, lay.nb * nr), output, name=OUTPUT_TILES)
    out = te.compute(shape.out, lambda *ix: tile[ix], name=OUTPUT)
    return lhs, rhs, out


def zero_point_terms(shape: BatchMatmulShape, p: BatchMatmulParams, a_sum, b_sum, *ix):
    """What element ``ix`` = (*batch, bm, bn, i, j) of the ``gemm`` tiles starts at,
    so that it ends at sum_k (a - za)(b - zb) (the sums over the real K only):

        sum_k (a - za)(b - zb) = sum_k ab - zb * A_sum[m] - za * B_sum[n] + K za zb

    ``a_sum`` / ``b_sum``: the sums' buffers (None where the other zero point is 0)."""
    from tvm import tirx

    b_idx, (bm, bn, i, j) = ix[:-4], ix[-4:]
    x = tirx.const(shape.depth * p.lhs_zp * p.rhs_zp, "int32")
    if a_sum is not None:
        ia = _operand_index(shape.lhs, shape.batch, b_idx)
        x = x - _load(a_sum, [*ia, bm, i]) * p.rhs_zp
    if b_sum is not None:
        ib = _operand_index(shape.rhs, shape.batch, b_idx)
        x = x - _load(b_sum, [*ib, bn, j]) * p.lhs_zp
    return x


def _load(t, index):
    """Element ``index`` of a TE tensor or a TIR buffer."""
    from tvm import tirx

    return tirx.BufferLoad(t, index) if isinstance(t, tirx.Buffer) else t(*index)


def _start_at_zero_point_terms(func, shape: BatchMatmulShape, p: BatchMatmulParams,
                               epilogue: str):
    """The scheduled ``func`` with its ``gemm_init`` block (``decompose_reduction``'s)
    storing ``zero_point_terms`` instead of 0: the int32 tile starts there and the
    epilogue requantizes it as it is: per accumulator register one vector add and its
    zeroing fewer (BERT's Q.K^T tile loop at dotprod 49 -> 41 est. cycles per 4 x 8
    outputs). TE cannot say it: ``te.create_prim_func`` drops a reduction's ``init``.
    Run after every schedule primitive (the init block reads the sums without declaring
    it); ``epilogue`` names the block whose requantization drops the terms."""
    import tvm_ffi
    from tvm import s_tir, tirx
    from tvm.ir.expr import TensorLoad  # what tirx.BufferLoad makes
    from tvm.tirx.buffer import Buffer

    buffers = {}

    def note(buffer):
        buffers.setdefault(buffer.name, buffer)
        return buffer

    tvm_ffi.structural_map(func.body, [(Buffer, note)])

    def rewrite(block):
        store = block.body
        if block.name_hint == "gemm_init":
            value = zero_point_terms(shape, p, buffers.get("A_sum"), buffers.get("B_sum"),
                                     *(iv.var for iv in block.iter_vars))
        elif block.name_hint == epilogue:
            # requantize_narrow(gemm + terms, ...) -> requantize_narrow(gemm, ...)
            call = store.value
            loads = []

            def note_gemm(load):
                if load.source.name == "gemm":
                    loads.append(load)
                return load

            tvm_ffi.structural_map(call.args[0], [(TensorLoad, note_gemm)])
            (tile,) = loads
            value = tirx.call_intrin(call.ty.dtype, call.op.name, tile, *call.args[1:])
        else:
            return block
        return s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                            tirx.BufferStore(store.buffer, value, store.indices),
                            block.init, block.alloc_buffers, block.match_buffers,
                            block.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, [(s_tir.SBlock, rewrite)]))


def batch_matmul_func(shape: BatchMatmulShape, p: BatchMatmulParams, *, target=None,
                      schedule: bool = True):
    """The PrimFunc ``(lhs, rhs, out)`` of ``shape``'s product with ``p``'s requantization,
    for ``target`` (a tvm.target.Target; None: any aarch64). ``schedule=False``: the plain
    definition (one reduction per output element); else the packed GEMM on the target's
    micro-kernel (``kernel_for``), scheduled."""
    from tvm import te

    if not schedule:
        return te.create_prim_func(list(_definition_te(shape, p)))
    kernel = kernel_for(shape, target)
    if kernel.intrin is None:  # the scalar reference: the definition's loops, parallel
        return _schedule_definition(te.create_prim_func(list(_definition_te(shape, p))))
    func = te.create_prim_func(list(_packed_te(shape, p, kernel)))
    scheduled = _schedule_packed(func, shape, kernel, _target(target))
    epilogue = OUTPUT_TILES if packed_layout(shape, kernel).crops else OUTPUT
    return _start_at_zero_point_terms(scheduled, shape, p, epilogue)


def _schedule_definition(func):
    """Batch and row loops fused and parallel; the output row's requantization vectorized."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    acc, out = sch.get_sblock("acc"), sch.get_sblock("out")
    loops = sch.get_loops(out)
    outer = sch.fuse(*loops[:-1])
    sch.parallel(outer)
    sch.compute_at(acc, outer)
    sch.vectorize(sch.get_loops(out)[-1])
    return sch.mod["main"]


def _k_unroll(shape: BatchMatmulShape, kernel: Kernel) -> int:
    """K blocks per step of the K loop: the conv2d / dense GEMM's plan for one batch's
    M x K x N (``gemm_plan``, A and B packed)."""
    from .gemm_layout import Conv2DShape
    from .gemm_plan import plan

    lay = PackedLayout(shape, kernel)
    dense = Conv2DShape.dense(lay.mb * kernel.mr, shape.depth, shape.cols)
    return plan(dense, kernel, direct=False, by_pixel=False).main.knobs.k_unroll


# Most rows a packed block (xr rows of kr bytes) is gathered from where K is contiguous:
# i8mm's 2 x 8 bytes are two loads into one vector, 4 rows (neon, dotprod) lane inserts
GATHER_MAX_ROWS = 2


def _schedule_pack(sch, name: str, k_contiguous: bool):
    """A pack stage: its outer loop parallel, each block row's kr bytes one vector (a
    gather where the operand is stored K-major: measured, reading the xr bytes of each K
    step as one vector and storing them across the block was no faster at dotprod and
    slower at i8mm). Where K is the operand's last axis (``k_contiguous``) and a block
    has more than GATHER_MAX_ROWS rows, the pack walks one row of the operand across its
    K blocks, each kr bytes a plain load and store, where the block order gathered the
    xr rows into its vectors lane by lane. ViT's P.V, est. cycles: neon (4 rows of 8)
    9.27e4 -> 8.23e4, dotprod (4 of 4) 4.53e4 -> 4.38e4; at i8mm (2 rows of 8: a vector
    is two loads) walking was 1-2% slower."""
    block = sch.get_sblock(name)
    loops = sch.get_loops(block)
    xr = int(sch.get(loops[-2]).extent)
    if k_contiguous and xr > GATHER_MAX_ROWS:
        bk, x, _ = loops[-3:]
        sch.reorder(x, bk)
    sch.parallel(sch.fuse(*loops[:-3]))
    sch.vectorize(sch.get_loops(block)[-1])


def _schedule_sums(sch, name: str):
    """Row sums of a packed operand: per block row, a loop over its K blocks adding each
    block (xr * kr int32 lanes, one vector), then each row's kr lanes; the block rows in
    parallel."""
    from .tir_util import loops_below

    part, total = sch.get_sblock(name + "_part"), sch.get_sblock(name)
    loops = sch.get_loops(total)
    row_block = sch.fuse(*loops[:-2])
    sch.compute_at(part, row_block, preserve_unit_loops=True)
    x, kk, kb = loops_below(sch, part, row_block)[-3:]
    sch.reorder(kb, x, kk)
    lanes = sch.fuse(x, kk)
    sch.vectorize(lanes)
    sch.parallel(row_block)
    sch.decompose_reduction(part, kb)


# int8 lanes of one NEON register: the crop copies output rows this many bytes at a time
CROP_LANES = 16


def _schedule_crop(sch):
    """The crop of ``OUTPUT_TILES`` to N: output rows (of every batch) in parallel, each
    copied CROP_LANES bytes at a time, its last N % CROP_LANES bytes as one narrower
    vector."""
    from .tir_util import vectorize_in_registers

    loops = sch.get_loops(sch.get_sblock(OUTPUT))
    sch.parallel(sch.fuse(*loops[:-1]))
    vectorize_in_registers(sch, loops[-1], CROP_LANES)


def _has_block(sch, name: str) -> bool:
    try:
        sch.get_sblock(name)
    except Exception:  # noqa: BLE001 - s_tir raises its own error type
        return False
    return True


def _schedule_packed(func, shape: BatchMatmulShape, kernel: Kernel, target):
    from tvm import s_tir

    from tvm_armq.intrinsics import registry

    from .tir_util import largest_divisor, loops_below

    sch = s_tir.Schedule(func)
    lay = packed_layout(shape, kernel)
    mr, nr = kernel.mr, kernel.nr
    m_tiles, n_tiles, crops = lay.m_tiles, lay.n_tiles, lay.crops
    gemm = sch.get_sblock("gemm")
    out = sch.get_sblock(OUTPUT_TILES if crops else OUTPUT)
    nbatch = len(shape.batch)
    # the output's loops as macro tiles: (batch, column tile, row tile, row, column)
    o_loops = sch.get_loops(out)
    outer = [sch.fuse(*o_loops[:nbatch])] if nbatch else []
    mo, mi = sch.split(o_loops[nbatch], [lay.mb // m_tiles, m_tiles * mr])
    no, ni = sch.split(o_loops[nbatch + 1], [lay.nb // n_tiles, n_tiles * nr])
    sch.reorder(*outer, no, mo, mi, ni)
    sch.compute_at(gemm, mo)
    # compute_at makes a loop for each of the tile's block axes longer than 1
    extents = {"bm": m_tiles, "bn": n_tiles, "i": mr, "j": nr, "kb": lay.kb,
               "kk": kernel.kr}
    found = iter(loops_below(sch, gemm, mo))
    g = {name: next(found) for name, extent in extents.items() if extent > 1}
    tiles = [g[name] for name in ("bm", "bn") if name in g]
    if "i" not in g:  # a one-row kernel: its desc still has the (unit) row loop
        g["i"] = sch.add_unit_loop(g["j"])
    block = [g[name] for name in ("i", "j", "kk")]
    whole_k = kernels.K_LOOP in kernel.forms and lay.kb > 1
    if whole_k:
        sch.reorder(*tiles, g["kb"], *block)
        k_outer, unrolled, tensorized = g["kb"], tiles, g["kb"]
    elif "kb" in g:
        k_unroll = largest_divisor(lay.kb, _k_unroll(shape, kernel))
        kb_o, kb_i = sch.split(g["kb"], [None, k_unroll])
        sch.reorder(kb_o, kb_i, *tiles, *block)
        k_outer, unrolled, tensorized = kb_o, [kb_i, *tiles], block[0]
    else:  # one K block: the tile's blocks, each initialised in place
        k_outer, unrolled, tensorized = block[0], tiles, block[0]
    # K is the last axis of lhs unless adj_x, of rhs only with adj_y (Q.K^T's K rows)
    _schedule_pack(sch, "A_packed", k_contiguous=not shape.adj_x)
    _schedule_pack(sch, "B_packed", k_contiguous=shape.adj_y)
    for name in ("A_sum", "B_sum"):
        if _has_block(sch, name):
            _schedule_sums(sch, name)
    sch.parallel(sch.fuse(*outer, no))
    if crops:
        _schedule_crop(sch)
    init = sch.decompose_reduction(gemm, k_outer)
    # the tile's start (``_start_at_zero_point_terms``): a vector per micro-tile row
    shared = [sch.get(loop) for loop in sch.get_loops(gemm)]
    *init_rows, init_cols = [loop for loop in sch.get_loops(init)
                             if not any(sch.get(loop).same_as(s) for s in shared)]
    sch.vectorize(init_cols)
    for loop in init_rows:
        sch.unroll(loop)
    for loop in unrolled:
        sch.unroll(loop)
    sch.vectorize(ni)
    sch.unroll(mi)
    if whole_k:
        registry.tensorize(sch, tensorized, kernel, target, k_blocks=lay.kb)
    else:
        registry.tensorize(sch, tensorized, kernel, target)
    return sch.mod["main"]
