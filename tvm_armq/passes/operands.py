"""Reading a quantized layer's operands and output back out of the frontend's float chain:
what several op families share (the int8 tensors under their ``dequantize``, constant
operands, the output's quantization and clamp, the float activation before the
quantize)."""

from __future__ import annotations

import numpy as np

from ..frontend.layers import ACT_NONE, ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1, activation_range
from ..report import Lowered
from .graph import (Graph, NotInteger, dequantize_of, dtype_of, fused_activation, is_const,
                    qparams, shape_of)
from .records import KernelCall

INT8_RANGE = (-128, 127)

# The float activation the frontend puts between an ADD/MUL and its quantize.
_FLOAT_ACTIVATIONS = {(0.0, 6.0): ACT_RELU6, (-1.0, 1.0): ACT_RELU_N1_TO_1}


def act_before(graph: Graph, y):
    """(expr under a float relu/relu6 clip, its TFLite activation) or (y, ACT_NONE)."""
    relu = graph.call(y, "relax.nn.relu")
    if relu is not None:
        return relu.args[0], ACT_RELU
    clip = graph.call(y, "relax.clip")
    if clip is not None:
        bounds = tuple(float(v.value) for v in clip.args[1:3])
        if bounds in _FLOAT_ACTIVATIONS:
            return clip.args[0], _FLOAT_ACTIVATIONS[bounds]
        if bounds[0] == 0.0 and bounds[1] >= 3.4e38:
            return clip.args[0], ACT_RELU
    return y, ACT_NONE


def quantized_operand(graph: Graph, expr, what: str):
    """(int8 variable or constant array, (scale, zp)) of a dequantized per-tensor operand:
    ADD, SUB, MUL, MAXIMUM and MINIMUM take a constant operand (a batch-norm left as a
    per-channel MUL and ADD) exactly as they take a tensor."""
    deq = dequantize_of(graph, expr)
    value = graph.const(deq.args[0]) if deq is not None else None
    if value is None:
        return quantized_var(graph, expr, what)
    if value.dtype != np.int8:
        raise NotInteger(f"{what} is a {value.dtype} constant (int8 only)")
    q = qparams(graph, deq).scalar(what)
    return value.reshape(shape_of(expr)), q


def binary_operands(graph: Graph, core, op: str, symmetric: bool):
    """((a, a_q), (b, b_q), swapped) of a two-input op, a constant operand (if any)
    second: for an op ``symmetric`` in its inputs the swap changes nothing; for SUB and
    SQUARED_DIFFERENCE ``swapped`` says the kernel must take its operands in the other
    order (``int8_ops.add_func``'s ``b_first``)."""
    (a, a_q), (b, b_q) = (quantized_operand(graph, e, f"{op} input {i}")
                          for i, e in enumerate(core.args))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        raise NotInteger(f"{op} of two constants")
    swapped = isinstance(a, np.ndarray)
    if swapped:
        (a, a_q), (b, b_q) = (b, b_q), (a, a_q)
    return (a, a_q), (b, b_q), swapped and not symmetric


# the op names of int8_ops.add_func for the pass's two-input ops of ADD's recipe
COMMON_SCALE_OPS = {"add": "ADD", "subtract": "SUB", "squared_difference": "SQUARED_DIFFERENCE"}


def operand_shape(x) -> tuple[int, ...]:
    """The shape of a graph operand or of a constant operand."""
    return tuple(x.shape) if isinstance(x, np.ndarray) else shape_of(x)


def binary_call(func, op: str, a, b, out_shape, record) -> "KernelCall":
    """The call of a two-input kernel: ``b`` a graph input, or a constant operand."""
    if isinstance(b, np.ndarray):
        return KernelCall(func, op, [a], [b], out_shape, record)
    return KernelCall(func, op, [a, b], [], out_shape, record)


def quantized_var(graph: Graph, expr, what: str):
    """(int8 variable, (scale, zp)) of ``dequantize(var)`` with per-tensor parameters."""
    deq = graph.call(expr, "relax.dequantize")
    if deq is None or is_const(deq.args[0]) or graph.const(deq.args[0]) is not None:
        raise NotInteger(f"{what} is not a dequantized int8 tensor")
    x = deq.args[0]
    if dtype_of(x) != "int8":
        raise NotInteger(f"{what} has dtype {dtype_of(x)} (int8 only)")
    return x, qparams(graph, deq).scalar(what)


def out_range(clip, act, out_q) -> tuple[int, int]:
    """The output clamp: the float activation before the quantize and/or the frontend's
    clip after it, both recomputed TFLite's way, intersected."""
    lo, hi = activation_range(act, out_q[0], out_q[1], "int8")
    if clip is not None:
        clo, chi = fused_activation(*(float(v.value) for v in clip.args[1:3]), *out_q, "int8")
        lo, hi = max(lo, clo), min(hi, chi)
    return lo, hi


def float_const(graph: Graph, expr) -> float | None:
    value = graph.const(expr)
    return float(value.reshape(())) if value is not None and value.size == 1 else None


def tflite_code(label: str) -> str | None:
    """The TFLite op code of a layer's variable (``frontend.converters.operator_name``), if
    named so."""
    from ..frontend.converters import operator_of

    found = operator_of(label)
    return found[1] if found else None


def int8_output(graph: Graph, quantize, clip):
    """(output (scale, zero point), output shape, TFLite's float activation before the
    quantize, the output clamp) of a layer ending in an int8 ``quantize``."""
    out_q = qparams(graph, quantize).scalar("the output")
    if str(quantize.attrs.out_dtype) != "int8":
        raise NotInteger(f"output dtype {quantize.attrs.out_dtype} (int8 only)")
    _, act = act_before(graph, quantize.args[0])
    return out_q, shape_of(quantize), act, out_range(clip, act, out_q)


def no_activation(op: str, act, act_range) -> None:
    """Ops without a fused activation in TFLite: refuse a chain that clamps their output."""
    if act != ACT_NONE or tuple(act_range) != INT8_RANGE:
        raise NotInteger(f"{op} followed by an activation")


def elementwise_record(op: str, label: str, x, out_shape, kernel: str) -> Lowered:
    """The ``Lowered`` record of an elementwise layer whose first operand is ``x``."""
    return Lowered(op, label, operand_shape(x), out_shape, kernel)
