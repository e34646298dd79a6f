"""The table family: 8-bit unary ops as one 256-entry table of TFLite's arithmetic
(``schedules.lut``), and two-input ops whose operands are both functions of one int8
tensor (swish: ``x * LOGISTIC(x)``), which are a table of that tensor too.

The frontend's forms of the unary ops (``unary_of``): sigmoid, tanh, exp, rsqrt, gelu,
leakyrelu, relu or a clip of ``dequantize(x)``; HARD_SWISH as ``x * relu6(x + 3) / 6``;
and the float island DEQUANTIZE -> NEG -> QUANTIZE that TFLite's converter leaves in a
LayerNorm.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..frontend.layers import ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1, activation_range
from ..intrinsics import names
from ..report import Lowered
from .graph import Graph, NotInteger, dtype_of, qparams, shape_of
from .operands import COMMON_SCALE_OPS, float_const
from .records import KernelCall, OpFamily, Options


def unary_of(graph: Graph, y):
    """(TFLite op, the ``dequantize`` call, options) if ``y`` is the frontend's float form
    of an 8-bit unary op that ``schedules.lut`` tabulates, else None::

        sigmoid(d) LOGISTIC   tanh(d) TANH   leakyrelu(d) LEAKY_RELU   relu(d) RELU
        rsqrt(d) RSQRT   exp(d) EXP   gelu(d), gelu_tanh(d) GELU
        negative(d) NEG: the float island DEQUANTIZE -> NEG -> QUANTIZE that TFLite's
                    converter leaves in a LayerNorm (``lut.island_table``)
        clip(d, 0, 6) RELU6   clip(d, -1, 1) RELU_N1_TO_1
        divide(multiply(d, clip(add(d, 3), 0, 6)), 6) HARD_SWISH
    """
    simple = {"relax.sigmoid": "LOGISTIC", "relax.tanh": "TANH", "relax.rsqrt": "RSQRT",
              "relax.exp": "EXP", "relax.nn.gelu": "GELU", "relax.nn.gelu_tanh": "GELU",
              "relax.negative": "NEG",
              "relax.nn.leakyrelu": "LEAKY_RELU", "relax.nn.relu": "RELU"}
    call = graph.call(y, *simple, "relax.clip", "relax.divide")
    if call is None:
        return None
    name = call.op.name
    if name in simple:
        deq = graph.call(call.args[0], "relax.dequantize")
        options = {"alpha": float(call.attrs.alpha)} if name == "relax.nn.leakyrelu" else \
            {"approximate": name == "relax.nn.gelu_tanh"} if simple[name] == "GELU" else {}
        return (simple[name], deq, options) if deq is not None else None
    if name == "relax.clip":
        bounds = tuple(float(v.value) for v in call.args[1:3])
        op = {(0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1"}.get(bounds)
        deq = graph.call(call.args[0], "relax.dequantize")
        return (op, deq, {}) if op and deq is not None else None
    # HARD_SWISH: x * relu6(x + 3) / 6, all on one dequantized tensor
    product = graph.call(call.args[0], "relax.multiply")
    if product is None or float_const(graph, call.args[1]) != 6.0:
        return None
    x, relu6 = product.args
    relu6 = graph.call(relu6, "relax.clip")
    shifted = graph.call(relu6.args[0], "relax.add") if relu6 is not None else None
    deq = graph.call(x, "relax.dequantize")
    if shifted is None or deq is None or \
            tuple(float(v.value) for v in relu6.args[1:3]) != (0.0, 6.0) or \
            not shifted.args[0].same_as(x) or float_const(graph, shifted.args[1]) != 3.0:
        return None
    return "HARD_SWISH", deq, {}


_RELU_ACTIVATIONS = {"RELU": ACT_RELU, "RELU6": ACT_RELU6, "RELU_N1_TO_1": ACT_RELU_N1_TO_1}


def lut_table(graph: Graph, quantize, unary):
    """(input variable, dtype, 256-entry table) of the unary op ``unary`` (``unary_of``)
    that ``quantize`` ends."""
    from tvm_armq.schedules import lut

    op, deq, options = unary
    dtype = str(quantize.attrs.out_dtype)
    x, in_q = deq.args[0], qparams(graph, deq).scalar("the input")
    if graph.const(x) is not None or dtype_of(x) != dtype or dtype not in lut.DTYPES:
        raise NotInteger(f"{op} of a {dtype_of(x)} input to {dtype} (8-bit tensors only)")
    out_q = qparams(graph, quantize).scalar("the output")
    if op in _RELU_ACTIVATIONS:  # its clamp: the range TFLite gives the activation
        options = {"act_range": activation_range(_RELU_ACTIVATIONS[op], *out_q, dtype)}
    try:
        return x, dtype, lut.table(op, in_q, out_q, dtype, **options)
    except ValueError as e:  # TFLite's Prepare refuses these parameters too
        raise NotInteger(str(e)) from None


def _as_table(graph: Graph, v):
    """(x, table): the int8 tensor ``v`` as a function of an int8 tensor ``x``, entry k
    for x = -128 + k: ``v`` = a table op (``unary_of``) of ``x``, or ``v`` itself (the
    identity table)."""
    q = graph.call(v, "relax.quantize")
    unary = unary_of(graph, q.args[0]) if q is not None else None
    if unary is not None:
        try:
            x, dtype, table = lut_table(graph, q, unary)
            if dtype == "int8":
                return x, table
        except NotInteger:
            pass
    info = np.iinfo(np.int8)
    return v, np.arange(info.min, info.max + 1).astype(np.int8)


def one_input_table(graph: Graph, op: str, a, a_q, b, b_q, out_q, act_range):
    """If both operands of the two-input ``op`` (same shape, no broadcast) are functions
    of one int8 tensor x (x itself or a table op of x: swish is ``x * LOGISTIC(x)``), the
    op is a function of x too: (x, its table), TFLite's arithmetic for every value of x
    (``reference.broadcast_mul`` / ``broadcast_add`` over the two operand tables), else
    None. One lookup then replaces the op and, where nothing else reads it, the table op
    before it."""
    from tvm_armq.schedules import int8_ops as ops
    from tvm_armq.schedules import reference as ref

    if isinstance(b, np.ndarray) or shape_of(a) != shape_of(b):
        return None
    (x, ta), (x_b, tb) = _as_table(graph, a), _as_table(graph, b)
    if not x.same_as(x_b):
        return None
    if op == "multiply":
        p = ops.mul_params(a_q, b_q, out_q, act_range)
        return x, ref.broadcast_mul(ta, tb, **dataclasses.asdict(p))
    p = ops.add_params(a_q, b_q, out_q, act_range, op=COMMON_SCALE_OPS[op])
    return x, ref.broadcast_add(ta, tb, **dataclasses.asdict(p))


def _lower(graph: Graph, root, unary, _opts: Options) -> KernelCall:
    """An 8-bit unary op as a 256-entry table of TFLite's arithmetic (``schedules.lut``)."""
    from tvm_armq.schedules import lut

    op = unary[0]
    if root.clip is not None:
        raise NotInteger(f"{op} followed by a clip")
    x, dtype, table = lut_table(graph, root.quantize, unary)
    shape = shape_of(root.quantize)
    record = Lowered(op.lower(), root.label, shape_of(x), shape,
                     names.elementwise_name("lut", dtype))
    return KernelCall(lut.lut_func(shape, dtype), "lut", [x], [table], shape, record, dtype)


FAMILY = OpFamily("table", ("relax.quantize",),
                  lambda graph, root: unary_of(graph, root.quantize.args[0]), _lower,
                  lambda root, unary: unary[0].lower())
