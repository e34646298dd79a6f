"""The CONCATENATION family: inputs already in the output's quantization are copied as
they are, the others requantized first (what TFLite's converter puts in front of them), a
constant input (a ViT's class token) is one more part, requantized here if needed; then
one copy kernel (``schedules.int8_ops.concat_func``)."""

from __future__ import annotations

import numpy as np

from ..intrinsics import names
from ..report import Lowered
from .graph import Graph, shape_of
from .operands import int8_output, no_activation, operand_shape, quantized_operand
from .records import ConcatCall, KernelCall, OpFamily, Options


def _lower(graph: Graph, root, core, _opts: Options) -> ConcatCall:
    from tvm_armq.schedules import int8_ops as ops

    out_q, out_shape, act, act_range = int8_output(graph, root.quantize, root.clip)
    no_activation("concat", act, act_range)
    parts = []
    for i, e in enumerate(core.args[0].fields if hasattr(core.args[0], "fields")
                          else graph.defs[core.args[0]].fields):
        x, x_q = quantized_operand(graph, e, f"concat input {i}")
        if isinstance(x, np.ndarray):
            if x_q != out_q:
                from tvm_armq.schedules.reference import requantize_tensor

                p = ops.requantize_params(x_q, out_q)
                x = requantize_tensor(x, in_zp=p.in_zp, out_zp=p.out_zp,
                                      multiplier=p.multiplier, shift=p.shift)
            parts.append(KernelCall(None, "constant", [x], [], x.shape, None))
            continue
        func = None if x_q == out_q else ops.requantize_func(shape_of(x), x_q, out_q)
        parts.append(KernelCall(func, "requantize", [x], [], shape_of(x), None))
    kernel = names.elementwise_name("concat") + (
        "" if all(p.func is None for p in parts) else "+" + names.elementwise_name("requantize"))
    return ConcatCall(parts, int(core.attrs.axis),
                      Lowered("concat", root.label, operand_shape(parts[0].inputs[0]),
                              out_shape, kernel))


FAMILY = OpFamily("concat", ("relax.quantize",),
                  lambda graph, root: root.core if root.op == "concat" else None, _lower)
