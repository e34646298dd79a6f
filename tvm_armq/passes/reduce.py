"""The row-reduction family: MEAN (any axes, keep_dims or not) and SOFTMAX over the last
axis (any beta), TFLite's 8-bit arithmetic (``schedules.int8_ops`` for MEAN,
``schedules.softmax`` for SOFTMAX). The frontend's forms:
``mean(dequantize(x))`` and ``softmax(dequantize(x))`` (``softmax(beta * x)`` where beta is
not 1: ``frontend.converters._convert_softmax``) under the quantize.
"""

from __future__ import annotations

from ..intrinsics import names
from .graph import Graph, NotInteger, shape_of
from .operands import elementwise_record, int8_output, no_activation, quantized_var
from .records import KernelCall, OpFamily, Options

# TFLite fixes an int8 SOFTMAX's output quantization
SOFTMAX_OUTPUT = (1.0 / 256, -128)


def _lower(graph: Graph, root, core, _opts: Options) -> KernelCall:
    from tvm_armq.schedules import int8_ops as ops

    out_q, out_shape, act, act_range = int8_output(graph, root.quantize, root.clip)
    op = root.op
    no_activation(op, act, act_range)
    if op == "mean":
        x, x_q = quantized_var(graph, core.args[0], "the mean input")
        axes = [int(v) for v in core.attrs.axis]
        func = ops.mean_func(shape_of(x), axes, bool(core.attrs.keepdims), x_q, out_q)
        return KernelCall(func, op, [x], [], out_shape,
                          elementwise_record(op, root.label, x, out_shape,
                                             names.elementwise_name("mean")))
    arg, beta = core.args[0], 1.0
    scaled = graph.call(arg, "relax.multiply")  # softmax(beta * x): frontend/converters.py
    if scaled is not None and graph.const(scaled.args[1]) is not None:
        arg, beta = scaled.args[0], float(graph.const(scaled.args[1]))
    x, x_q = quantized_var(graph, arg, "the softmax input")
    if int(core.attrs.axis) not in (-1, len(shape_of(x)) - 1):
        raise NotInteger("softmax over an axis other than the last")
    if out_q != SOFTMAX_OUTPUT:
        raise NotInteger(f"softmax output quantization {out_q} (TFLite's is 1/256, -128)")
    from tvm_armq.schedules.softmax import softmax_func

    func, table = softmax_func(shape_of(x), x_q, beta)
    return KernelCall(func, op, [x], [table], out_shape,
                      elementwise_record(op, root.label, x, out_shape,
                                         names.elementwise_name("softmax")))


FAMILY = OpFamily("reduce", ("relax.quantize",),
                  lambda graph, root: root.core if root.op in ("mean", "softmax") else None,
                  _lower)
