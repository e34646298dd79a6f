"""The requantization family: TFLite's QUANTIZE of an 8-bit tensor, which the frontend
imports as ``quantize(dequantize(x))`` (``schedules.int8_ops.requantize_func``)."""

from __future__ import annotations

from ..intrinsics import names
from ..report import Lowered
from .graph import Graph, shape_of
from .operands import int8_output, no_activation, quantized_var
from .records import KernelCall, OpFamily, Options


def _lower(graph: Graph, root, core, _opts: Options) -> KernelCall:
    from tvm_armq.schedules import int8_ops as ops

    out_q, out_shape, act, act_range = int8_output(graph, root.quantize, root.clip)
    no_activation("dequantize", act, act_range)
    x, x_q = quantized_var(graph, core, "the input")
    func = ops.requantize_func(shape_of(x), x_q, out_q)
    return KernelCall(func, "requantize", [x], [], out_shape,
                      Lowered("quantize", root.label, shape_of(x), out_shape,
                              names.elementwise_name("requantize")))


FAMILY = OpFamily("requantize", ("relax.quantize",),
                  lambda graph, root: root.core if root.op == "dequantize" else None, _lower)
