"""LayerNorm over the last axis as one row kernel, with the integer steps of the thirteen
TFLite ops its converter writes.

Read this first. TFLite's converter makes a Keras LayerNormalization of an int8 tensor x
(rows of C values) into a chain of 8-bit ops, each requantizing its result:

    m   = MEAN(x)                        per row          (keep_dims)
    nm  = QUANTIZE(NEG(DEQUANTIZE(m)))   per row          a float island: a table of m
    sq  = SQUARED_DIFFERENCE(x, m)       per element
    var = MEAN(sq)                       per row
    r   = RSQRT(ADD(var, epsilon))       per row          two tables of var: one table
    rg  = MUL(r, gamma)                  per channel      gamma: an int8 constant [C]
    a   = MUL(nm, rg)                    per element      (then ADD(a, beta), beta [C])
    out = ADD(MUL(x, rg), a)             per element

Each op alone is exact in ``int8_ops`` / ``lut``; run as thirteen kernels, every one reads
and writes a tensor (or broadcasts a per-row value over one). This kernel computes the
same values, op by op with the same arithmetic (``int8_ops``' Prepare: ``*_params``), one
row at a time: a pass over the row for the sum, one for the squared differences and
their sum, one that writes the output; the per-row values (m, nm, var, r) are scalars,
``rg`` a vector of the row. ``reference`` is the chain in NumPy, op by op
(``schedules.reference``), the definition the kernel is held to.

Layout: x is [rows, C] (the leading axes of the tensor flattened), the last axis the
vector axis, 16 lanes per register; rows run in parallel.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import int8_ops as ops
from . import lut
from .reference import broadcast_add, broadcast_mul, mean

INT8 = (-128, 127)


@dataclasses.dataclass(frozen=True)
class LayerNormQuant:
    """The chain's quantization, (scale, zero point) per tensor, and its constants."""

    x: tuple
    mean: tuple
    neg_mean: tuple
    square: tuple
    var: tuple
    epsilon: tuple            # the ADD's constant operand
    var_eps: tuple
    rsqrt: tuple
    gamma: tuple
    rg: tuple
    x_rg: tuple
    nm_rg: tuple
    out: tuple                # ADD(x_rg, nm_rg) (or of nm_rg_beta)
    epsilon_value: int        # the int8 constant
    gamma_values: np.ndarray  # int8 [C]
    beta: tuple | None = None
    beta_values: np.ndarray | None = None
    nm_rg_beta: tuple | None = None  # ADD(nm_rg, beta)


@dataclasses.dataclass(frozen=True)
class LayerNormParams:
    """What the kernel computes with: each op's Prepare, and the per-row tables."""

    channels: int
    mean: ops.MeanParams
    square: ops.AddParams
    var: ops.MeanParams
    rg: ops.MulParams
    x_rg: ops.MulParams
    nm_rg: ops.MulParams
    beta: ops.AddParams | None   # ADD(nm_rg, beta)
    out: ops.AddParams
    neg_table: np.ndarray     # int8 [256]: nm of m (the NEG island)
    rsqrt_table: np.ndarray   # int8 [256]: r of var (ADD of epsilon, then RSQRT)


def layer_norm_params(q: LayerNormQuant, channels: int) -> LayerNormParams:
    """Each op's Prepare (``int8_ops``); ValueError where TFLite's Prepare refuses one."""
    every = np.arange(-128, 128)
    add_eps = ops.add_params(q.var, q.epsilon, q.var_eps)
    var_eps = broadcast_add(every, np.int64(q.epsilon_value), **dataclasses.asdict(add_eps))
    rsqrt = lut.table("RSQRT", q.var_eps, q.rsqrt)
    return LayerNormParams(
        channels,
        ops.mean_params(channels, q.x, q.mean),
        ops.add_params(q.x, q.mean, q.square, op="SQUARED_DIFFERENCE"),
        ops.mean_params(channels, q.square, q.var),
        ops.mul_params(q.rsqrt, q.gamma, q.rg),
        ops.mul_params(q.x, q.rg, q.x_rg),
        ops.mul_params(q.neg_mean, q.rg, q.nm_rg),
        ops.add_params(q.nm_rg, q.beta, q.nm_rg_beta) if q.beta is not None else None,
        ops.add_params(q.x_rg, q.nm_rg if q.beta is None else q.nm_rg_beta, q.out),
        lut.table("NEG", q.mean, q.neg_mean),
        rsqrt[np.asarray(var_eps, np.int64) + 128].astype(np.int8))


def reference(x, p: LayerNormParams, gamma, beta=None) -> np.ndarray:
    """The chain in NumPy, op by op (TFLite's arithmetic): x [..., C] int8."""
    x = np.asarray(x)
    axis = [x.ndim - 1]

    def asdict(params):
        return dataclasses.asdict(params)

    m = mean(x, axis, True, **asdict(p.mean))
    nm = p.neg_table[m.astype(np.int64) + 128]
    sq = broadcast_add(x, m, **asdict(p.square))
    var = mean(sq, axis, True, **asdict(p.var))
    r = p.rsqrt_table[var.astype(np.int64) + 128]
    rg = broadcast_mul(r, np.asarray(gamma), **asdict(p.rg))
    a = broadcast_mul(nm, rg, **asdict(p.nm_rg))
    if p.beta is not None:
        a = broadcast_add(a, np.asarray(beta), **asdict(p.beta))
    out = broadcast_add(broadcast_mul(x, rg, **asdict(p.x_rg)), a, **asdict(p.out))
    return np.asarray(out, np.int8)


def layer_norm_func(rows: int, p: LayerNormParams, *, schedule: bool = True):
    """The PrimFunc ``(x, gamma, [beta,] neg_table, rsqrt_table, out)`` over x [rows, C]."""
    from tvm import te, tirx

    from tvm_armq.intrinsics.qmuls import requantize_narrow

    c = p.channels
    x = te.placeholder((rows, c), "int8", "x")
    gamma = te.placeholder((c,), "int8", "gamma")
    beta = te.placeholder((c,), "int8", "beta") if p.beta is not None else None
    neg_table = te.placeholder((lut.TABLE_SIZE,), "int8", "neg_table")
    rsqrt_table = te.placeholder((lut.TABLE_SIZE,), "int8", "rsqrt_table")

    def narrow(total, m, e, zp, act=INT8):
        return requantize_narrow(total, m, e, zp, *act)

    def add(a, b, q: ops.AddParams):  # int8_ops.add_func's recipe
        return ops.add_output(ops.common_scale(a, q.a_zp, q.a_multiplier, q.a_shift, q.left_shift),
                              ops.common_scale(b, q.b_zp, q.b_multiplier, q.b_shift, q.left_shift),
                              q, "int8")

    def mul(a, b, q: ops.MulParams):  # int8_ops.mul_func's
        return ops.mul_output(a.astype("int16") - tirx.const(q.a_zp, "int16"),
                              b.astype("int16") - tirx.const(q.b_zp, "int16"), q, "int8")

    def row_mean(sums, q: ops.MeanParams):
        return narrow(sums - q.in_zp * c, q.multiplier, q.shift, q.out_zp)

    k = te.reduce_axis((0, c), "k")
    s_x = te.compute((rows,), lambda r: te.sum(x[r, k].astype("int32"), axis=k), "sum_x")
    m = te.compute((rows,), lambda r: row_mean(s_x[r], p.mean), "mean")
    nm = te.compute((rows,), lambda r: neg_table[m[r].astype("int32") + 128], "neg_mean")
    sq = te.compute((rows, c), lambda r, j: add(x[r, j], m[r], p.square), "square")
    k2 = te.reduce_axis((0, c), "k2")
    s_sq = te.compute((rows,), lambda r: te.sum(sq[r, k2].astype("int32"), axis=k2), "sum_sq")
    var = te.compute((rows,), lambda r: row_mean(s_sq[r], p.var), "var")
    r_ = te.compute((rows,), lambda r: rsqrt_table[var[r].astype("int32") + 128], "rsqrt")
    rg = te.compute((rows, c), lambda r, j: mul(r_[r], gamma[j], p.rg), "rg")

    def element(r, j):
        a = mul(nm[r], rg[r, j], p.nm_rg)
        if beta is not None:
            a = add(a, beta[j], p.beta)
        return add(mul(x[r, j], rg[r, j], p.x_rg), a, p.out)

    out = te.compute((rows, c), element, "out")
    params = [x, gamma, *([beta] if beta is not None else []), neg_table, rsqrt_table, out]
    func = te.create_prim_func(params)
    return _schedule(func) if schedule else func


def _schedule(func):
    """Rows in parallel; under each row its scalars and its two vectors (the squared
    differences, rg), the channel loops 16 lanes at a time."""
    from tvm import s_tir

    from .tir_util import vectorize_in_registers

    sch = s_tir.Schedule(func)
    out = sch.get_sblock("out")
    row, _ = sch.get_loops(out)
    if int(sch.get(row).extent) > 1:
        sch.parallel(row)
    for name in ("rg", "rsqrt", "var", "sum_sq", "square", "neg_mean", "mean", "sum_x"):
        sch.compute_at(sch.get_sblock(name), row)
    for name in ("square", "rg", "out"):
        vectorize_in_registers(sch, sch.get_loops(sch.get_sblock(name))[-1], ops.LANES)
    return sch.mod["main"]
