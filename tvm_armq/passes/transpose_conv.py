"""The TRANSPOSE_CONV family: a GEMM convolution of the level per output phase (the taps
that land on that phase of the output, a stride-1 convolution), then the pixel shuffle that
puts their pixels in place (``schedules.transpose_conv``). The frontend's form of the layer
(``frontend.converters._convert_transpose_conv``): dequantize -> NCHW conv2d_transpose between two
permute_dims -> (+ bias) -> quantize, the activation a clip after the quantize.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from ..intrinsics import names
from ..report import Lowered
from .gemm import Layer, gemm_kernel, int_bias, layer_requant
from .graph import Graph, NotInteger, clip_range, dequantized_const, dtype_of, qparams, shape_of
from .records import KernelCall, OpFamily, Options


def transpose_conv_of(graph: Graph, y):
    """(conv2d_transpose call, bias expression or None) if ``y`` is the frontend's
    quantized TRANSPOSE_CONV (``frontend.converters._convert_transpose_conv``): the NCHW
    conv2d_transpose between two permute_dims, plus the bias; else None."""
    def nhwc_conv(e):
        perm = graph.call(e, "relax.permute_dims")
        return graph.call(perm.args[0], "relax.nn.conv2d_transpose") if perm is not None \
            else None

    add = graph.call(y, "relax.add")
    if add is None:
        conv = nhwc_conv(y)
        return (conv, None) if conv is not None else None
    for out, bias in (add.args, add.args[::-1]):
        conv = nhwc_conv(out)
        if conv is not None:
            return conv, bias
    return None


def match_transpose_conv(graph: Graph, quantize, clip, conv, bias_expr):
    """A quantized TRANSPOSE_CONV (``schedules.transpose_conv``): (its geometry, the layer
    as one Layer, and per output phase (the phase, the Layer of its stride-1
    convolution or None where no tap lands))."""
    from tvm_armq.schedules import transpose_conv as tc

    out_q = qparams(graph, quantize).scalar("the output")
    if str(quantize.attrs.out_dtype) != "int8":
        raise NotInteger(f"output dtype {quantize.attrs.out_dtype} (int8 only)")
    a = conv.attrs
    if (str(a.data_layout), str(a.kernel_layout)) != ("NCHW", "IOHW") or int(a.groups) != 1 \
            or any(int(d) != 1 for d in a.dilation):
        raise NotInteger("a conv2d_transpose other than the frontend's TRANSPOSE_CONV")
    perm = graph.call(conv.args[0], "relax.permute_dims")
    x_deq = graph.call(perm.args[0], "relax.dequantize") if perm is not None else None
    if x_deq is None or dtype_of(x_deq.args[0]) != "int8":
        raise NotInteger("the input is not dequantized int8")
    x, x_q = x_deq.args[0], qparams(graph, x_deq).scalar("the input")
    w_iohw, w_q = dequantized_const(graph, conv.args[1], "the weight")
    if w_iohw.dtype != np.int8 or w_q.zp.any():
        raise NotInteger("weights that are not symmetric int8")
    w_ohwi = w_iohw.transpose(1, 2, 3, 0)
    n_out, kh, kw, _ = w_ohwi.shape
    out_shape = shape_of(quantize)
    geom = tc.TransposeConvGeometry(*shape_of(x)[1:3], *out_shape[1:3], kh, kw,
                                    tuple(int(v) for v in a.strides), int(a.padding[0]),
                                    int(a.padding[1]))
    w_scales = w_q.per_channel(n_out)
    bias = int_bias(graph, bias_expr) if bias_expr is not None else np.zeros(n_out, np.int32)
    layer = Layer("transpose_conv", x, x_q, w_ohwi, w_scales, bias, out_q, "int8",
                   clip_range(clip, out_q, "int8"), None, out_shape)
    phases = []
    for ph in geom.phases():
        if not ph.has_taps:
            phases.append((ph, None))
            continue
        window = types.SimpleNamespace(strides=(1, 1), dilation=(1, 1), padding=ph.padding,
                                       groups=1)
        phases.append((ph, dataclasses.replace(layer, op="conv2d",
                                               weight=ph.weights_hwio(w_ohwi),
                                               conv_attrs=window,
                                               out_shape=(out_shape[0], *ph.conv_hw, n_out))))
    return geom, layer, phases


def _match(graph: Graph, root):
    return transpose_conv_of(graph, root.quantize.args[0])


def _lower(graph: Graph, root, found, opts: Options) -> KernelCall:
    """A GEMM convolution of the target per output phase, then the pixel shuffle; a
    stride-1 layer is its one convolution."""
    from tvm_armq.schedules import transpose_conv as tc

    label = root.label
    geom, layer, phases = match_transpose_conv(graph, root.quantize, root.clip, *found)
    calls = []
    for _, c in phases:
        if c is not None:
            kc = gemm_kernel(c, label, opts)
            kc.record = dataclasses.replace(kc.record, op="transpose_conv")
            calls.append((kc, c.out_shape))
    batch, out_h, out_w, n_out = layer.out_shape
    if len(phases) == 1 and calls and phases[0][0].conv_hw == (out_h, out_w):
        kc = calls[0][0]
        kc.record = dataclasses.replace(kc.record, in_shape=shape_of(layer.x),
                                        out_shape=layer.out_shape)
        return kc
    mult, shift = layer_requant(layer)
    fills = [tc.bias_only(layer.bias, mult, shift, layer.out_q[1], layer.act_range)
             for _, c in phases if c is None]
    shuffle = names.elementwise_name("pixel_shuffle")
    first = calls[0][0].record if calls else None
    gemms = list(dict.fromkeys(kc.record.kernel for kc, _ in calls))
    record = Lowered("transpose_conv", label, shape_of(layer.x), layer.out_shape,
                     "+".join([*gemms, shuffle]),
                     any(kc.record.tuned for kc, _ in calls),
                     next((kc.record.tail for kc, _ in calls if kc.record.tail), None),
                     tuple(f"{v}+{shuffle}" for v in first.variants) if first else ())
    func = tc.pixel_shuffle_func(batch, [ph for ph, _ in phases], (out_h, out_w), n_out,
                                 geom.strides)
    return KernelCall(func, "pixel_shuffle", calls, fills, layer.out_shape, record)


FAMILY = OpFamily("transpose_conv", ("relax.quantize",), _match, _lower,
                  lambda root, match: "transpose_conv")
