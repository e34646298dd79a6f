"""The AVERAGE_POOL_2D family: the frontend's integer form,
``astype(avg_pool2d(astype(x, int32)), int8)``, with TFLite's rounding of the average (the
frontend's division truncates; ``schedules.int8_ops.avg_pool_func``)."""

from __future__ import annotations

from ..intrinsics import names
from ..report import Lowered
from .graph import Graph, NotInteger, dtype_of, shape_of
from .records import KernelCall, OpFamily


def _avg_pool(graph: Graph, cast, label: str) -> KernelCall:
    """astype(avg_pool2d(astype(x, int32)), int8), the frontend's integer AVERAGE_POOL_2D,
    with TFLite's rounding of the average (the frontend's division truncates)."""
    from tvm_armq.schedules import int8_ops as ops

    pool = graph.call(cast.args[0], "relax.nn.avg_pool2d")
    widen = graph.call(pool.args[0], "relax.astype") if pool is not None else None
    if widen is None or dtype_of(widen.args[0]) != "int8" or str(cast.attrs.dtype) != "int8":
        raise NotInteger("not an int8 average pool")
    a = pool.attrs
    if str(a.layout) != "NHWC" or bool(a.ceil_mode) or bool(a.count_include_pad) or \
            any(int(d) != 1 for d in a.dilation):
        raise NotInteger("average pool other than TFLite's (NHWC, no ceil, pads not counted)")
    x = widen.args[0]
    func = ops.avg_pool_func(shape_of(x), tuple(int(v) for v in a.pool_size),
                             tuple(int(v) for v in a.strides),
                             tuple(int(v) for v in a.padding))
    return KernelCall(func, "avg_pool2d", [x], [], shape_of(cast),
                       Lowered("avg_pool2d", label, shape_of(x), shape_of(cast),
                               names.elementwise_name("avg_pool")))


FAMILY = OpFamily("avg_pool", ("relax.astype",),
                  lambda graph, root: root.call if graph.call(
                      root.call.args[0], "relax.nn.avg_pool2d") is not None else None,
                  lambda graph, root, cast, _opts: _avg_pool(graph, cast, root.label),
                  lambda root, match: "avg_pool2d")
