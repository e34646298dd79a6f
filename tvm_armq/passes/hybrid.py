"""The hybrid family: dynamic-range FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D and
BATCH_MATMUL with a constant operand (float32 activations, int8 weights) on the level's
integer kernels, as TFLite's hybrid kernels compute them.

Our converters (``frontend/converters.py``) import such a layer as its float meaning,

    w_f = dequantize(W, s_w[c], 0, axis)        bound to ``hybrid_<inputs>_<epilogue>``
    y   = matmul(x, w_f) | conv2d(x, w_f)       x: float32 (a depthwise layer: a conv2d
                                                of one input channel per group)
    y   = add(y, b)                             b: float32 constant (if the op has one)
    out = relu(y) | clip(y, lo, hi)             the fused activation (if any)
    out = reshape(out, ...)                     the operator's output shape (if needed)

the weight's variable naming how TFLite quantizes the input and scales the sums (decided
there, where the op's options are read). ``match`` recognizes the chain at its end (the
variable named for the TFLite operator, or one of its ``part_name`` variables: a
BATCH_MATMUL of several weight matrices is a layer per matrix), ``lower`` makes it three
kernel calls of ``schedules.hybrid``: the input's quantization parameters, the int8
input, and the GEMM (a depthwise layer: the depthwise kernel) with its float epilogue (in
a portable build one such kernel per level behind a dispatcher, as ``gemm.py``'s). Without
the pass the chain still computes the layer in float (the weights dequantized), and the
report says why it stayed so (``report_unlowered``: also where no family recognized it).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..frontend.converters import HYBRID_OPS, hybrid_scheme, layer_of, operator_of
from ..report import Lowered
from .gemm import conv_window
from .graph import Graph, NotInteger, dequantized_const, dtype_of, shape_of
from .records import KernelCall, OpFamily, Options

_ACTIVATIONS = ("relax.nn.relu", "relax.clip")
_CORES = ("relax.matmul", "relax.nn.conv2d")


@dataclasses.dataclass
class HybridLayer:
    """A hybrid chain, read back out of the graph."""

    op: str                 # "dense" | "conv2d"
    x: object               # the float32 input
    weight: np.ndarray      # int8: dense [K, N], conv2d HWIO
    w_scales: np.ndarray    # float32 per output channel (a per-tensor scale repeated)
    bias: np.ndarray | None  # float32 per output channel
    act_range: tuple | None  # float (lo, hi), either side None; None: no activation
    scheme: tuple           # (inputs, epilogue): schedules.hybrid's names
    core: object            # the matmul / conv2d call
    residual: object = None  # a float32 tensor the epilogue adds (a residual ADD's other
                             # operand), then clamps to ``residual_act``; None: no ADD
    residual_act: tuple | None = None


@dataclasses.dataclass(frozen=True)
class Found:
    """What ``_match`` found: the layer's core call, its bias and activation calls (None
    where it has none), TFLite's scheme; for a residual ADD after the layer, the ADD's
    other operand, its activation call and the layer's own root variable (``inner``)."""

    core: object
    bias: object
    act: object
    scheme: tuple
    residual: object = None
    residual_act: object = None
    inner: object = None


def _match_layer(graph: Graph, call, label: str) -> Found | None:
    """The hybrid chain ending at ``call`` (bound to the variable ``label`` of a hybrid
    TFLite operator), or None."""
    named = layer_of(label)
    if named is None or named[1] not in HYBRID_OPS:
        return None
    y, act = call, None
    if y.op.name == "relax.reshape":
        y = graph.call(y.args[0], *_ACTIVATIONS, "relax.add", *_CORES)
    if y is not None and y.op.name in _ACTIVATIONS:
        y, act = graph.call(y.args[0], "relax.add", *_CORES), y
    bias = None
    if y is not None and y.op.name == "relax.add":
        bias = y.args[1]
        y = graph.call(y.args[0], *_CORES)
    if y is None or not isinstance(getattr(y.args[1], "name", None), str):
        return None
    scheme = hybrid_scheme(y.args[1].name)
    return None if scheme is None else Found(y, bias, act, scheme)


def _match_residual(graph: Graph, call, label: str) -> Found | None:
    """A float ADD (and its fused activation) of a hybrid GEMM layer's output that
    nothing else reads and another float32 tensor of the same shape (a residual block's
    sum), or None: the layer's epilogue adds it, one IEEE addition as TFLite's ADD, and
    the separate pass over both tensors goes."""
    named = operator_of(label)
    if named is None or named[1] != "ADD":
        return None
    add, act = call, None
    if add.op.name in _ACTIVATIONS:
        add, act = graph.call(add.args[0], "relax.add"), add
    if add is None or add.op.name != "relax.add" or shape_of(add.args[0]) != \
            shape_of(add.args[1]) or any(dtype_of(a) != "float32" for a in add.args):
        return None
    for inner, other in ((add.args[0], add.args[1]), (add.args[1], add.args[0])):
        value = graph.defs.get(inner)
        if graph.uses.get(inner) != 1 or getattr(value, "op", None) is None:
            continue
        found = _match_layer(graph, value, getattr(inner, "name", ""))
        grouped = found is not None and found.core.op.name == "relax.nn.conv2d" and \
            int(found.core.attrs.groups) > 1
        if found is not None and not grouped:
            return dataclasses.replace(found, residual=other, residual_act=act, inner=inner)
    return None


def _match(graph: Graph, root) -> Found | None:
    """The hybrid layer ending at ``root``: a hybrid TFLite operator's chain, or a
    residual ADD taking one in (``_match_residual``); else None."""
    return (_match_layer(graph, root.call, root.label)
            or _match_residual(graph, root.call, root.label))


def _act_range(act) -> tuple | None:
    if act is None:
        return None
    if act.op.name == "relax.nn.relu":
        return (0.0, None)
    return tuple(float(v.value) for v in act.args[1:3])


def read_layer(graph: Graph, found) -> HybridLayer:
    """The layer's constants and attributes (``NotInteger`` where TFLite's arithmetic
    cannot be reproduced here)."""
    core, bias_expr, act, scheme = found.core, found.bias, found.act, found.scheme
    weight, w_q = dequantized_const(graph, core.args[1], "the weight")
    if weight.dtype != np.int8 or w_q.zp.any():
        raise NotInteger("the weight is not int8 with zero point 0")
    x = core.args[0]
    if dtype_of(x) != "float32":
        raise NotInteger(f"input {dtype_of(x)} (float32 only)")
    n = weight.shape[-1]
    bias = None
    if bias_expr is not None:
        bias = graph.const(bias_expr)
        if bias is None or bias.dtype != np.float32 or bias.size != n:
            raise NotInteger("the bias is not a float32 constant per output channel")
        bias = bias.reshape(-1)
    op = "dense" if core.op.name == "relax.matmul" else "conv2d"
    if op == "conv2d" and (str(core.attrs.data_layout), str(core.attrs.kernel_layout)) != \
            ("NHWC", "HWIO"):
        raise NotInteger(f"layout {core.attrs.data_layout} / {core.attrs.kernel_layout}")
    scales = w_q.per_channel(n).astype(np.float32)  # float32 as in the model
    return HybridLayer(op, x, weight, scales, bias, _act_range(act), scheme, core,
                       found.residual, _act_range(found.residual_act))


def _shape(layer: HybridLayer):
    from tvm_armq.schedules.gemm_layout import Conv2DShape

    in_shape = shape_of(layer.x)
    if layer.op == "dense":
        k, n = layer.weight.shape
        return Conv2DShape.dense(int(np.prod(in_shape[:-1])), k, n), layer.weight[None, None]
    a = layer.core.attrs
    b, h, w, c = in_shape
    kh, kw, _, n = layer.weight.shape
    return Conv2DShape(b, h, w, c, n, kh, kw, groups=int(a.groups),
                       **conv_window(a)), layer.weight


def _kernel(shape, target):
    """The GEMM micro-kernel the selection table gives the layer at ``target``."""
    from tvm_armq.intrinsics import kernels

    return kernels.select(target, "int8", "int8", rows=shape.gemm_m, depth=shape.gemm_k)


def _gemm_variant(layer: HybridLayer, shape, w_hwio, scheme, target, schedule: bool):
    """The layer's GEMM for ``target``: (func, kernel name, constants after the inputs)."""
    from tvm_armq.schedules import gemm_plan, hybrid, tir_util

    kernel = _kernel(shape, target)
    plan = gemm_plan.plan(shape, kernel)
    func = hybrid.hybrid_gemm_func(plan, scheme, act_range=layer.act_range,
                                   residual=layer.residual is not None,
                                   residual_act=layer.residual_act)
    func = (hybrid.schedule_hybrid_gemm(func, plan, target) if schedule
            else tir_util.merge_outputs(func))
    return (func, hybrid.kernel_name(kernel, scheme),
            hybrid.constants(plan, w_hwio, layer.w_scales, layer.bias, scheme))


def _gemm_name(shape, w_hwio, scheme, target) -> str:
    from tvm_armq.schedules import hybrid

    return hybrid.kernel_name(_kernel(shape, target), scheme)


def _depthwise_variant(layer: HybridLayer, shape, w_hwio, scheme, target, schedule: bool):
    """The depthwise layer's kernel for ``target`` (``schedules.hybrid.depthwise_func``),
    its taps summed as the integer depthwise kernel's are: (func, kernel name, constants)."""
    from tvm_armq.schedules import depthwise as dw
    from tvm_armq.schedules import hybrid

    from .gemm import depthwise_taps

    taps = depthwise_taps(w_hwio, shape, target)
    func = hybrid.depthwise_func(shape, scheme, act_range=layer.act_range, **taps)
    if schedule:
        func = dw.schedule_depthwise(func, shape)
    return (func, _depthwise_name(shape, w_hwio, scheme, target),
            hybrid.depthwise_constants(shape, w_hwio, layer.w_scales, layer.bias,
                                       int16_pairs=taps["int16_pairs"]))


def _depthwise_name(shape, w_hwio, scheme, target) -> str:
    from tvm_armq.schedules import hybrid

    from .gemm import depthwise_name, depthwise_taps

    return depthwise_name(hybrid.DEPTHWISE_OP, (hybrid.FLOAT, "int8", hybrid.FLOAT), shape,
                          depthwise_taps(w_hwio, shape, target))


def _depthwise_shape(layer: HybridLayer, shape):
    """The ``depthwise.DepthwiseShape`` of a conv2d of one input channel per group (a
    DEPTHWISE_CONV_2D), else None: such a layer has no K for a GEMM to reduce."""
    from tvm_armq.schedules.depthwise import DepthwiseShape

    if layer.op != "conv2d" or shape.groups != shape.in_c or layer.weight.shape[2] != 1:
        return None
    return DepthwiseShape(shape.batch, shape.in_h, shape.in_w, shape.in_c,
                          shape.out_c // shape.in_c, shape.kh, shape.kw,
                          **conv_window(layer.core.attrs))


def _quantized_input(graph: Graph, x, groups: tuple, scheme, opts: Options):
    """The kernel calls of ``x``'s quantization parameters and int8 values, in ``groups``
    (rows, elements per row) as ``scheme`` quantizes them: made once per function and
    shared by every hybrid layer that reads ``x`` so (a transformer's Q, K and V
    projections of one LayerNorm output: TFLite quantizes it three times)."""
    from tvm_armq.schedules import hybrid

    key = ("hybrid", x, groups, scheme.inputs)
    if key not in graph.shared:
        nonnegative = _nonnegative(graph, x)
        params = KernelCall(hybrid.params_func(*groups, scheme, nonnegative=nonnegative,
                                               schedule=opts.schedule),
                            "hybrid_params_max" if nonnegative else "hybrid_params",
                            [(x, groups)], [], (groups[0], hybrid.PARAMS), None, hybrid.FLOAT)
        data_q = KernelCall(hybrid.quantize_func(*groups, scheme, schedule=opts.schedule),
                            "hybrid_quantize", [(x, groups), (params, None)], [], groups,
                            None, "int8")
        graph.shared[key] = params, data_q
    return graph.shared[key]


def _nonnegative(graph: Graph, x) -> bool:
    """Whether every element of ``x`` is known to be >= 0: the output of a ReLU, or of a
    clip from 0 or above (RELU6; RELU_N1_TO_1 not). Its quantization then reduces the
    maximum alone (``hybrid.params_te``): every hybrid layer of resnet_block_dynamic reads
    a ReLU's output, and its parameters' pass went from 5.7e4 to 3.5e4 cycles at neon."""
    act = graph.call(x, *_ACTIVATIONS)
    lo = _act_range(act)[0] if act is not None else None
    return lo is not None and lo >= 0


def _lower(graph: Graph, root, found, opts: Options) -> KernelCall:
    """Three kernel calls: the input's quantization parameters, the int8 input (both the
    same code at every level), and the level's GEMM (a depthwise layer: the level's
    depthwise kernel) with the float epilogue; in a portable build one such kernel per
    level behind a dispatcher, as ``gemm.py``'s."""
    from tvm_armq.schedules import hybrid

    from .. import portable
    from ..targets import portable_levels, resolve

    layer = read_layer(graph, found)
    scheme = hybrid.HybridScheme(*layer.scheme)
    shape, w_hwio = _shape(layer)
    depthwise = _depthwise_shape(layer, shape)
    if depthwise is None and scheme.asymmetric and any(shape.padding) and shape.batch != 1:
        raise NotInteger(f"a padded asymmetric hybrid conv2d of batch {shape.batch} (TFLite "
                         "pads each image with its own zero point, the GEMM's im2col one "
                         "value: one image only)")
    data = (shape.batch, shape.in_h, shape.in_w, shape.in_c)
    groups = (shape.batch, shape.in_h * shape.in_w * shape.in_c)  # a group per row
    params_shape = (shape.batch, hybrid.PARAMS)
    params, data_q = _quantized_input(graph, layer.x, groups, scheme, opts)
    if depthwise is not None and layer.residual is not None:
        raise NotInteger("a residual ADD after a depthwise layer")  # _match_residual: never
    if depthwise is not None:
        op, kind = "depthwise_conv2d_hybrid", hybrid.DEPTHWISE_OP
        build, name_of = _depthwise_variant, _depthwise_name
        shape, out_shape = depthwise, (depthwise.batch, depthwise.out_h, depthwise.out_w,
                                       depthwise.out_c)
    else:
        op, kind, build, name_of = f"{layer.op}_hybrid", hybrid.OP, _gemm_variant, _gemm_name
        out_shape = (shape.gemm_m, shape.groups, shape.gemm_n)
    inputs = [(data_q, data), (params, None)]
    label = root.label if found.inner is None else found.inner.name  # the layer's own
    if layer.residual is not None:  # read as the output is laid out
        inputs.append((layer.residual, out_shape))
    if opts.variants is None or not opts.schedule:
        func, name, consts = build(layer, shape, w_hwio, scheme, opts.target, opts.schedule)
        variants = tuple(name_of(shape, w_hwio, scheme, resolve(lvl))
                         for lvl in portable_levels(opts.target) or ())
        record = Lowered(op, label, shape_of(layer.x), shape_of(root.call), name,
                         variants=variants)
        return KernelCall(func, op, inputs, consts, out_shape, record, hybrid.FLOAT)
    built = {level: build(layer, shape, w_hwio, scheme, resolve(level), True)
             for level in opts.variants.levels}
    arrays, index = portable.unique_consts({lvl: b[2] for lvl, b in built.items()})
    names = {level: b[1] for level, b in built.items()}
    operands = [("data_q", data, "int8"), ("q_params", params_shape, hybrid.FLOAT)]
    if layer.residual is not None:
        operands.append(("residual", out_shape, hybrid.FLOAT))
    calls = {level: (opts.variants.add(level, label, func, names[level]),
                     [o[0] for o in operands] + [f"c{i}" for i in index[level]] + ["output"])
             for level, (func, _, _) in built.items()}
    func = portable.dispatcher(
        operands,
        [(f"c{i}", a.shape, a.dtype.name) for i, a in enumerate(arrays)],
        ("output", out_shape, hybrid.FLOAT), calls,
        {"tvm_armq.op": f"{kind}_portable", "tvm_armq.kernel": "+".join(names.values())})
    record = Lowered(op, label, shape_of(layer.x), shape_of(root.call),
                     next(iter(names.values())), variants=tuple(names.values()))
    return KernelCall(func, op, inputs, arrays, out_shape, record, hybrid.FLOAT)


def report_unlowered(mod, report: list) -> None:
    """A ``Fallback`` per hybrid weight the pass left in ``mod`` beyond the layers already
    reported float: a dynamic-range layer whose chain no family recognized would otherwise
    stay float with no record (and ``--strict`` would not see it)."""
    from tvm import relax

    from ..report import Fallback

    left = [b.var.name for func in mod.functions.values() if isinstance(func, relax.Function)
            for block in func.body.blocks for b in block.bindings
            if hybrid_scheme(b.var.name) is not None]
    reported = sum(isinstance(r, Fallback) and r.op.endswith("_hybrid") for r in report)
    for name in left[reported:]:
        report.append(Fallback("hybrid", name, "a dynamic-range layer the pass did not "
                               "recognize (its weight is dequantized to float)"))


def _absorbs(graph: Graph, found: Found) -> list:
    """A residual ADD's layer: its own chain is lowered with the ADD, not apart."""
    return [] if found.inner is None else [found.inner]


def _report_op(root, found) -> str:
    if found.core.op.name == "relax.matmul":
        return "dense_hybrid"
    attrs, weight = found.core.attrs, found.core.args[1]
    depthwise = int(attrs.groups) > 1 and int(shape_of(weight)[2]) == 1
    return "depthwise_conv2d_hybrid" if depthwise else "conv2d_hybrid"


FAMILY = OpFamily("hybrid", ("relax.reshape", *_ACTIVATIONS, "relax.add", *_CORES),
                  _match, _lower, report_op=_report_op, absorbs=_absorbs)
