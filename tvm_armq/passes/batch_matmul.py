"""The BATCH_MATMUL family: the product of two int8 tensors made at run time (attention's
Q.K^T and P.V), or of a tensor and a constant, as TFLite's BATCH_MATMUL computes it
(``schedules.batch_matmul``: the level's GEMM micro-kernel, both operands packed at run
time). The frontend's form (``frontend.converters._convert_batch_matmul``):
quantize(matmul(a, b)) of the dequantized operands, ``adj_x`` / ``adj_y`` a ``permute_dims``
swapping that operand's last two axes. A matmul of a tensor and a constant weight that is
not a BATCH_MATMUL (a FULLY_CONNECTED) is the GEMM family's.
"""

from __future__ import annotations

import numpy as np

from ..frontend.layers import ACT_NONE
from ..report import Lowered
from .graph import Graph, NotInteger, dequantize_of, qparams, shape_of
from .operands import binary_call, operand_shape, out_range, quantized_operand, tflite_code
from .records import KernelCall, OpFamily, Options


def _matmul_operand(graph: Graph, expr, what: str):
    """(int8 variable or constant, (scale, zp), adjoint) of a BATCH_MATMUL operand as the
    frontend writes it: ``dequantize(x)``, or ``permute_dims`` of that swapping the last two
    axes (``adj_x`` / ``adj_y``)."""
    adjoint = False
    perm = graph.call(expr, "relax.permute_dims")
    if perm is not None:
        rank = len(shape_of(perm.args[0]))
        if [int(a) for a in perm.attrs.axes] != [*range(rank - 2), rank - 1, rank - 2]:
            raise NotInteger(f"{what} is permuted other than by a swap of its last two axes")
        expr, adjoint = perm.args[0], True
    x, q = quantized_operand(graph, expr, what)
    return x, q, adjoint


def is_constant_weight(graph: Graph, matmul) -> bool:
    """A matmul whose right operand is a dequantized constant (a dense layer's weight)."""
    deq = dequantize_of(graph, matmul.args[1])
    return deq is not None and graph.const(deq.args[0]) is not None


def _lower(graph: Graph, root, matmul, opts: Options) -> KernelCall:
    """BATCH_MATMUL of two int8 tensors (or of a tensor and a constant), TFLite's
    arithmetic (``schedules.batch_matmul``)."""
    from tvm_armq.schedules import batch_matmul as bm

    quantize, label = root.quantize, root.label

    if str(quantize.attrs.out_dtype) != "int8":
        raise NotInteger(f"output dtype {quantize.attrs.out_dtype} (int8 only)")
    out_q = qparams(graph, quantize).scalar("the output")
    (a, a_q, adj_x), (b, b_q, adj_y) = (_matmul_operand(graph, e, f"operand {i}")
                                        for i, e in enumerate(matmul.args))
    if isinstance(a, np.ndarray):
        raise NotInteger("a constant left operand")
    try:
        shape = bm.BatchMatmulShape(operand_shape(a), operand_shape(b), adj_x, adj_y)
        p = bm.batch_matmul_params(a_q, b_q, out_q, out_range(root.clip, ACT_NONE, out_q))
    except ValueError as e:
        raise NotInteger(str(e)) from None
    if shape.out != shape_of(quantize):
        raise NotInteger(f"output shape {shape_of(quantize)} is not {shape.out}")
    record = Lowered("batch_matmul", label, shape.lhs, shape.out,
                     bm.kernel_name(shape, opts.target))
    func = bm.batch_matmul_func(shape, p, target=opts.target, schedule=opts.schedule)
    return binary_call(func, "batch_matmul", a, b, shape.out, record)


def _match(graph: Graph, root):
    if root.op != "matmul":
        return None
    if not is_constant_weight(graph, root.core) or tflite_code(root.label) == "BATCH_MATMUL":
        return root.core
    return None


FAMILY = OpFamily("batch_matmul", ("relax.quantize",), _match, _lower,
                  lambda root, match: "batch_matmul")
