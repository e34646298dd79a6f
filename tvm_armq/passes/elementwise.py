"""The two-input elementwise family: ADD, SUB, MUL, SQUARED_DIFFERENCE (TFLite's 8-bit
rescalings, ``schedules.int8_ops``), MAXIMUM and MINIMUM (raw 8-bit comparisons) and
PRELU, each broadcasting, with a tensor or a constant operand (a batch-norm left as a
per-channel MUL and ADD). An ADD, SUB or MUL of two functions of one int8 tensor is a
table of that tensor instead (``tables.one_input_table``).

The frontend's forms: ``op(dequantize(a), dequantize(b))`` under the quantize, a fused
ReLU / ReLU6 as a float ``relu`` / ``clip`` before it; SQUARED_DIFFERENCE as ``d * d`` of
``d = dequantize(a) - dequantize(b)``; PRELU as ``where(d >= 0, d, d * dequantize(alpha))``
(``frontend.converters._convert_prelu``).
"""

from __future__ import annotations

import numpy as np

from ..intrinsics import names
from ..report import Lowered
from .graph import Graph, NotInteger, shape_of
from .operands import (COMMON_SCALE_OPS, binary_call, binary_operands, elementwise_record,
                       int8_output, no_activation, operand_shape, quantized_operand,
                       quantized_var)
from .records import KernelCall, OpFamily, Options
from .tables import one_input_table

OPS = ("add", "subtract", "multiply", "maximum", "minimum", "where")


def _squared_difference(graph: Graph, core):
    """The ``subtract`` call of the frontend's SQUARED_DIFFERENCE (``d * d`` with
    ``d = dequantize(a) - dequantize(b)``), or None."""
    if core.op.name != "relax.multiply" or not core.args[0].same_as(core.args[1]):
        return None
    return graph.call(core.args[0], "relax.subtract")


def _arithmetic(graph: Graph, root, core, op: str, out_q, out_shape, act_range) -> KernelCall:
    """ADD, SUB, MUL, SQUARED_DIFFERENCE: TFLite's rescalings, or one table of x."""
    from tvm_armq.schedules import int8_ops as ops

    # a: a tensor; b: a tensor or a constant (passed last); swapped: b is the op's first
    (a, a_q), (b, b_q), swapped = binary_operands(graph, core, op,
                                                  symmetric=op in ("add", "multiply"))
    record = elementwise_record(op, root.label, a, out_shape, names.elementwise_name(op))
    try:
        folded = one_input_table(graph, op, a, a_q, b, b_q, out_q, act_range)
        if folded is not None:
            from tvm_armq.schedules import lut

            x, table = folded
            record = elementwise_record(op, root.label, x, out_shape,
                                        names.elementwise_name("lut"))
            return KernelCall(lut.lut_func(out_shape), "lut", [x], [table], out_shape, record)
        if op == "multiply":
            func = ops.mul_func(shape_of(a), operand_shape(b), out_shape, a_q, b_q, out_q,
                                act_range)
        else:
            (x, x_q), (y, y_q) = ((b, b_q), (a, a_q)) if swapped else ((a, a_q), (b, b_q))
            constant = b if isinstance(b, np.ndarray) else None
            func = ops.add_func(operand_shape(x), operand_shape(y), out_shape, x_q, y_q,
                                out_q, act_range, op=COMMON_SCALE_OPS[op], b_first=swapped,
                                constant=constant)
            if constant is not None:  # the kernel takes the constant already rescaled
                func, b = func
    except ValueError as e:  # TFLite's Prepare refuses these scales too
        raise NotInteger(f"{op}: {e}") from None
    return binary_call(func, op, a, b, out_shape, record)


def _prelu(graph: Graph, root, core, out_q, out_shape) -> KernelCall:
    """PRELU: where(d >= 0, d, d * dequantize(alpha)), d = dequantize(x)."""
    from tvm_armq.schedules import int8_ops as ops

    x, x_q = quantized_var(graph, core.args[1], "the PRELU input")
    negative = graph.call(core.args[2], "relax.multiply")
    if negative is None or not negative.args[0].same_as(core.args[1]) or \
            graph.call(core.args[0], "relax.greater_equal") is None:
        raise NotInteger("a select that is not the frontend's PRELU")
    alpha, alpha_q = quantized_operand(graph, negative.args[1], "the PRELU alpha")
    try:
        func = ops.prelu_func(shape_of(x), operand_shape(alpha), x_q, alpha_q, out_q)
    except ValueError as e:  # TFLite's Prepare refuses these scales too
        raise NotInteger(str(e)) from None
    return binary_call(func, "prelu", x, alpha, out_shape,
                       Lowered("prelu", root.label, shape_of(x), out_shape,
                               names.elementwise_name("prelu")))


def _lower(graph: Graph, root, core, _opts: Options) -> KernelCall:
    from tvm_armq.schedules import int8_ops as ops

    out_q, out_shape, act, act_range = int8_output(graph, root.quantize, root.clip)
    op = root.op
    square = _squared_difference(graph, core)
    if square is not None:  # SQUARED_DIFFERENCE: the frontend's d * d of d = a - b
        core, op = square, "squared_difference"
    if op in ("add", "subtract", "multiply", "squared_difference"):
        return _arithmetic(graph, root, core, op, out_q, out_shape, act_range)
    no_activation(op, act, act_range)
    if op == "where":
        return _prelu(graph, root, core, out_q, out_shape)
    (a, _), (b, _), _ = binary_operands(graph, core, op, symmetric=True)
    func = ops.min_max_func(op, shape_of(a), operand_shape(b), out_shape)
    return binary_call(func, op, a, b, out_shape,
                       elementwise_record(op, root.label, a, out_shape,
                                          names.elementwise_name(op)))


FAMILY = OpFamily("elementwise", ("relax.quantize",),
                  lambda graph, root: root.core if root.op in OPS else None, _lower)
