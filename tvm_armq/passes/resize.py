"""The resize family: RESIZE_BILINEAR (the frontend: ``quantize(resize2d(dequantize(x)))``)
and RESIZE_NEAREST_NEIGHBOR (the frontend resizes the int8 tensor itself), at TFLite's
positions and with its 10-bit interpolation of the raw 8-bit values
(``schedules.resize``)."""

from __future__ import annotations

from ..intrinsics import names
from ..report import Lowered
from .graph import Graph, NotInteger, dtype_of, shape_of
from .operands import int8_output, no_activation, quantized_var
from .records import KernelCall, OpFamily, Options


# TFLite's (align_corners, half_pixel_centers) by the frontend's coordinate transformation
_RESIZE_MODES = {"asymmetric": (False, False), "align_corners": (True, False),
                 "half_pixel": (False, True)}


def resize_call(graph: Graph, call, x, label: str) -> KernelCall:
    """RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR of the int8 tensor ``x`` as
    ``schedules.resize``: TFLite interpolates the raw 8-bit values (no rescaling)."""
    from tvm_armq.schedules import resize

    a = call.attrs
    method, mode = str(a.method), str(a.coordinate_transformation_mode)
    if str(a.layout) != "NHWC" or method not in ("linear", "nearest_neighbor") or \
            mode not in _RESIZE_MODES:
        raise NotInteger(f"resize2d {method} {mode} {a.layout} (TFLite's NHWC resizes only)")
    if dtype_of(x) != "int8":
        raise NotInteger(f"resize of a {dtype_of(x)} tensor (int8 only)")
    align, half = _RESIZE_MODES[mode]
    if method == "nearest_neighbor" and half and str(a.rounding_method) == "":
        align = True  # the frontend leaves the rounding unset for both flags together
    in_shape, out_shape = shape_of(x), shape_of(call)
    linear = method == "linear"
    make = resize.bilinear_table if linear else resize.nearest_table
    try:
        tables = [make(i, o, align, half) for i, o in zip(in_shape[1:3], out_shape[1:3])]
    except ValueError as e:
        raise NotInteger(str(e)) from None
    func = (resize.resize_bilinear_func if linear else resize.resize_nearest_func)(
        in_shape, out_shape[1:3])
    op = "resize_bilinear" if linear else "resize_nearest"
    return KernelCall(func, op, [x], tables, out_shape,
                       Lowered(op, label, in_shape, out_shape, names.elementwise_name(op)))


def _bilinear(graph: Graph, root, core, _opts: Options) -> KernelCall:
    _, _, act, act_range = int8_output(graph, root.quantize, root.clip)
    no_activation("image.resize2d", act, act_range)
    x, _ = quantized_var(graph, core.args[0], "the resize input")
    return resize_call(graph, core, x, root.label)


def _nearest(graph: Graph, root, call, _opts: Options) -> KernelCall:
    return resize_call(graph, call, call.args[0], root.label)


FAMILY = OpFamily("resize", ("relax.quantize",),
                  lambda graph, root: root.core if root.op == "image.resize2d" else None,
                  _bilinear)
# RESIZE_NEAREST_NEIGHBOR: a resize2d of the int8 tensor itself, no quantize around it
NEAREST = OpFamily("resize_nearest", ("relax.image.resize2d",),
                   lambda graph, root: root.call if dtype_of(root.call.args[0]) == "int8"
                   else None, _nearest, lambda root, match: "resize_nearest")
