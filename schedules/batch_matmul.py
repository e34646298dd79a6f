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

Layout: both operands are read where they lie, row-major, no copy: ``lhs`` is
[..., M, K] (or [..., K, M] with ``adj_x``), ``rhs`` [..., K, N] (or [..., N, K] with
``adj_y``: Q.K^T reads K's rows, each a column of the product, contiguous in k).
``batch_matmul_func(schedule=False)`` is the plain definition; the schedule keeps its
arithmetic and runs the batch and row loops in parallel.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tvm_armq.intrinsics.requant import quantize_multiplier

OP = "BATCH_MATMUL"


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


def batch_matmul_func(shape: BatchMatmulShape, p: BatchMatmulParams, *, schedule: bool = True):
    """The PrimFunc ``(lhs, rhs, out)`` of ``shape``'s product with ``p``'s requantization."""
    from tvm import te

    from tvm_armq.intrinsics.qmuls import requantize

    lhs = te.placeholder(shape.lhs, "int8", "lhs")
    rhs = te.placeholder(shape.rhs, "int8", "rhs")
    k = te.reduce_axis((0, shape.depth), "k")
    batch = shape.batch

    def at(t, t_shape, adjoint, b_idx, r, c):
        """Element (r, c) of operand ``t`` (after its adjoint) at batch index ``b_idx``."""
        lead = len(batch) - (len(t_shape) - 2)
        idx = [0 if n == 1 else b_idx[lead + d] for d, n in enumerate(t_shape[:-2])]
        return t[(*idx, c, r) if adjoint else (*idx, r, c)]

    def acc(*idx):
        b_idx, i, j = idx[:-2], idx[-2], idx[-1]
        a = at(lhs, shape.lhs, shape.adj_x, b_idx, i, k).astype("int32") - p.lhs_zp
        b = at(rhs, shape.rhs, shape.adj_y, b_idx, k, j).astype("int32") - p.rhs_zp
        return te.sum(a * b, axis=k)

    total = te.compute(shape.out, acc, name="acc")
    out = te.compute(shape.out, lambda *i: requantize(
        total(*i), p.multiplier, p.shift, p.out_zp, *p.act_range).astype("int8"), name="out")
    func = te.create_prim_func([lhs, rhs, out])
    return _schedule(func) if schedule else func


def _schedule(func):
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
