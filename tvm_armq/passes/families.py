"""The op families of the integer pass, in the order it tries them: the first whose
``match`` recognizes a layer lowers it (``records.OpFamily``). Adding an op is one module of
``passes/`` with its ``FAMILY`` record and one line here.

Order matters where two families could claim one chain: a BATCH_MATMUL's matmul before the
GEMM family's (which takes a matmul with a constant weight: FULLY_CONNECTED); the GEMM
family before the elementwise one (a conv's bias is an ``add``); TRANSPOSE_CONV and the
tables before the elementwise family (an ADD of two functions of one tensor is a table);
the LayerNorm family, which recognizes a whole chain at its last ADD, before the
elementwise family, which would take that ADD alone. The hybrid family's layers end in
float ops no other family takes.
"""

from __future__ import annotations

from . import (avg_pool, batch_matmul, concat, elementwise, gemm, hybrid, layer_norm, reduce,
               requantize, resize, tables, transpose_conv)

FAMILIES = (
    batch_matmul.FAMILY,
    gemm.FAMILY,
    hybrid.FAMILY,
    transpose_conv.FAMILY,
    tables.FAMILY,
    layer_norm.FAMILY,
    elementwise.FAMILY,
    reduce.FAMILY,
    requantize.FAMILY,
    concat.FAMILY,
    resize.FAMILY,
    resize.NEAREST,
    avg_pool.FAMILY,
)
