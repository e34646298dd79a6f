"""The GEMM family: CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED (on [..., K] inputs too).

The frontend imports each as float compute between a ``dequantize`` and a ``quantize``:

    x_f  = dequantize(x, s_in, zp_in)                    x: int8 activations
    w_f  = dequantize(W, s_w[c], 0, axis=3)              W: int8 constant (HWIO)
    b_f  = dequantize(B, s_in * s_w[c], 0)               B: int32 constant
    y    = quantize(conv2d(x_f, w_f) + b_f, s_out, zp_out)
    out  = clip(y, lo, hi)                               the fused activation

``match_layer`` reads the int8/int32 constants and the scales back out of that chain (a
``Layer``); a convolution or dense layer becomes the level's GEMM (``gemm_kernel``:
``schedules.conv2d_gemm``, its weights packed here, at compile time, for the
micro-kernel), a depthwise one ``schedules.depthwise`` (``depthwise_kernel``). The
requantization parameters are computed as TFLite's Prepare computes them (multiplier of
in_scale * w_scale[c] / out_scale in double), the clamp as TFLite's
``CalculateActivationRangeQuantized``. TFLite's legacy uint8 scheme (uint8 weights with a
zero point) runs the level's u8 GEMM plus a row-sums kernel for the weight zero point's
term (``schedules.conv2d_u8``). A portable build carries each layer's kernel per level
behind a dispatcher (``portable.py``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..intrinsics import names
from ..report import Lowered
from .graph import (Graph, NotInteger, clip_range, dequantized_const, dtype_of, qparams,
                    shape_of)
from .records import KernelCall, OpFamily, Options


@dataclasses.dataclass
class Layer:
    """A quantized conv/dense chain, read back out of the graph."""

    op: str                   # "conv2d" | "depthwise_conv2d" | "dense" | "transpose_conv"
    x: object                 # the int8 (or uint8) input variable
    x_q: tuple[float, int]
    weight: np.ndarray        # conv2d: HWIO; depthwise: [1, kh, kw, C*M]; dense: [K, N];
                              # transpose_conv: TFLite's [out_c, kh, kw, in_c]
    w_scales: np.ndarray      # float64 per output channel
    bias: np.ndarray          # int32 per output channel
    out_q: tuple[float, int]
    out_dtype: str
    act_range: tuple[int, int]
    conv_attrs: object = None
    out_shape: tuple = ()
    w_zp: int = 0             # nonzero only for uint8 weights (legacy asymmetric models)

    def real_scales(self) -> np.ndarray:
        """in_scale * w_scale / out_scale per channel, in double, as TFLite's Prepare."""
        return np.float64(self.x_q[0]) * self.w_scales / np.float64(self.out_q[0])


def int_bias(graph: Graph, expr) -> np.ndarray:
    """A layer's bias: ``dequantize`` of an int32 constant with zero point 0."""
    value, q = dequantized_const(graph, expr, "the bias")
    if value.dtype != np.int32 or q.zp.any():
        raise NotInteger("the bias is not int32 with zero point 0")
    return value.reshape(-1)


def match_layer(graph: Graph, quantize, clip) -> Layer:
    """Read the conv/dense chain that ends in ``quantize`` (and its fused ``clip``)."""
    out_scale, out_zp = qparams(graph, quantize).scalar("the output")
    out_dtype = str(quantize.attrs.out_dtype)
    if out_dtype not in ("int8", "uint8"):
        raise NotInteger(f"output dtype {out_dtype} (int8 or uint8 only)")
    y = quantize.args[0]
    bias = None
    add = graph.call(y, "relax.add")
    if add is not None:
        y, bias_expr = add.args
        if graph.call(y, "relax.nn.conv2d", "relax.matmul") is None:
            y, bias_expr = bias_expr, y
        bias = int_bias(graph, bias_expr)
    core = graph.call(y, "relax.nn.conv2d", "relax.matmul")
    if core is None:
        raise NotInteger("no conv2d or matmul before the quantize")
    x_deq = graph.call(core.args[0], "relax.dequantize")
    if x_deq is None:
        raise NotInteger("the input is not dequantized int8")
    x = x_deq.args[0]
    x_q = qparams(graph, x_deq).scalar("the input")
    weight, w_q = dequantized_const(graph, core.args[1], "the weight")
    # TFLite's two schemes: int8 with symmetric weights, and the legacy uint8 one, whose
    # weights have a zero point (one per tensor).
    if (dtype_of(x), str(weight.dtype)) != (out_dtype, out_dtype):
        raise NotInteger(f"input {dtype_of(x)}, weight {weight.dtype}, output {out_dtype} "
                         "(all int8 or all uint8 only)")
    w_zp = 0
    if out_dtype == "int8" and w_q.zp.any():
        raise NotInteger("int8 weights with a nonzero zero point")
    if out_dtype == "uint8":
        w_zp = w_q.scalar("the uint8 weight")[1]
    act = clip_range(clip, (out_scale, out_zp), out_dtype)

    if core.op.name == "relax.matmul":
        # FULLY_CONNECTED, on a [..., K] input (keep_num_dims: the leading axes are rows)
        if len(shape_of(x)) < 2 or weight.ndim != 2:
            raise NotInteger("matmul that is not [..., K] x [K, N]")
        op, n_out = "dense", weight.shape[1]
        attrs = None
    else:
        attrs = core.attrs
        if (str(attrs.data_layout), str(attrs.out_layout)) != ("NHWC", "NHWC"):
            raise NotInteger(f"layout {attrs.data_layout} (NHWC only)")
        in_c, groups = shape_of(x)[3], int(attrs.groups)
        if groups > 1 and groups == in_c and str(attrs.kernel_layout) == "HWOI":
            op = "depthwise_conv2d"
            # The frontend makes TFLite's [1, kh, kw, C*M] HWOI [kh, kw, C*M, 1]: a
            # per-channel weight by a reshape after the dequantize (the constant under it
            # is TFLite's layout), a per-tensor one by reshaping the constant itself. Both
            # keep the bytes in order, so TFLite's layout, which the kernel packs from,
            # is a reshape away.
            kh, kw, n_out, one = shape_of(core.args[1])
            if weight.shape not in ((1, kh, kw, n_out), (kh, kw, n_out, one)) or one != 1:
                raise NotInteger(f"depthwise weight of shape {weight.shape}")
            weight = weight.reshape(1, kh, kw, n_out)
        elif str(attrs.kernel_layout) == "HWIO":
            # a depthwise layer of one input channel is this conv; its per-channel weight
            # is TFLite's [1, kh, kw, M] under the frontend's reshape to [kh, kw, 1, M],
            # the same bytes in the same order (found by scripts/fuzz.py)
            hwio = tuple(shape_of(core.args[1]))
            if weight.shape != hwio:
                if weight.shape != (1, hwio[0], hwio[1], hwio[3]) or hwio[2] != 1:
                    raise NotInteger(f"conv2d weight of shape {weight.shape}, not {hwio}")
                weight = weight.reshape(hwio)
            op, n_out = "conv2d", weight.shape[3]
        else:
            raise NotInteger(f"kernel layout {attrs.kernel_layout}")
    w_scales = w_q.per_channel(n_out)
    if bias is None:
        bias = np.zeros(n_out, np.int32)
    if op == "depthwise_conv2d" and out_dtype != "int8":
        raise NotInteger("uint8 depthwise (the depthwise kernel is int8)")
    return Layer(op, x, x_q, weight, w_scales, bias, (out_scale, out_zp), out_dtype, act,
                  attrs, shape_of(quantize), w_zp)


def layer_requant(layer: Layer):
    from tvm_armq.intrinsics import requant

    mult, shift = requant.quantize_multipliers(layer.real_scales())
    return mult.astype(np.int32), shift.astype(np.int32)


def conv_window(a) -> dict:
    """Strides, dilation and padding of a Relax conv2d's ``attrs``, as Conv2DShape takes
    them."""
    return dict(strides=tuple(int(v) for v in a.strides),
                dilation=tuple(int(v) for v in a.dilation),
                padding=tuple(int(v) for v in a.padding))


def requant_rounding(layer: Layer) -> str:
    """How TFLite's reference kernel rounds the layer's requantization: its int8
    FULLY_CONNECTED rounds once (``(acc * m + 2**(30 - s)) >> (31 - s)``), its CONV_2D
    (and uint8 layers) twice, gemmlowp's way. Measured on TFLite's BUILTIN_REF, which
    gives the two ops different results for the same accumulator (tests/test_integrate.py)."""
    return "single" if layer.op == "dense" and layer.out_dtype == "int8" else "double"


def gemm_kernel(layer: Layer, label: str, opts: Options):
    """conv2d / dense as ``schedules.conv2d_gemm``: one plan, its func, scheduled by
    ``opts.tuned_schedule`` where that has a schedule, else by the plan; uint8 with a weight
    zero point also runs ``schedules.conv2d_u8``'s row sums first."""
    from tvm_armq.schedules.gemm_layout import Conv2DShape

    in_shape = shape_of(layer.x)
    if layer.op == "dense":
        rows, k = int(np.prod(in_shape[:-1])), in_shape[-1]
        shape = Conv2DShape.dense(rows, k, layer.weight.shape[1])
        w_hwio = layer.weight[None, None]
    else:
        b, h, w, c = in_shape
        kh, kw, _, n = layer.weight.shape
        shape = Conv2DShape(b, h, w, c, n, kh, kw, groups=int(layer.conv_attrs.groups),
                            **conv_window(layer.conv_attrs))
        w_hwio = layer.weight
    data = [(layer.x, (shape.batch, shape.in_h, shape.in_w, shape.in_c))]
    out_shape = (shape.gemm_m, shape.groups, shape.gemm_n)
    if opts.variants is not None and opts.schedule and not layer.w_zp:
        return _portable_gemm(layer, label, shape, w_hwio, data, in_shape, out_shape, opts)
    scheduled, plan, kernel, consts, tuned = _gemm_variant(layer, shape, w_hwio, opts.target,
                                                           opts)
    after, dtype = [], layer.out_dtype
    if layer.w_zp:  # the weight zero point needs each output pixel's sum of inputs
        from tvm_armq.schedules import conv2d_u8 as cu

        f = cu.row_sums_func(shape, in_zp=layer.x_q[1], in_dtype=dtype)
        after.append(KernelCall(cu.schedule_row_sums(f) if opts.schedule else f, "row_sums", data,
                                 [], (shape.gemm_m, shape.groups), None, "int32"))
    tail = plan.tail.kernel.name if plan.tail is not None else None
    record = Lowered(layer.op, label, in_shape, layer.out_shape, kernel.name, tuned, tail,
                     _portable_kernels(layer, shape, opts.target))
    return KernelCall(scheduled, layer.op, data, consts, out_shape, record, dtype, after)


def _portable_kernels(layer: Layer, shape, target) -> tuple:
    """What a portable build would run per level (for ``inspect``, which builds nothing);
    () for a single-level target."""
    from tvm_armq.intrinsics import kernels

    from ..targets import portable_levels, resolve

    levels = portable_levels(target)
    if levels is None or layer.w_zp:
        return ()
    dtype = layer.out_dtype
    return tuple(kernels.select(resolve(lvl), dtype, dtype, rows=shape.gemm_m,
                                depth=shape.gemm_k).name for lvl in levels)


def _gemm_variant(layer: Layer, shape, w_hwio, target, opts: Options, tune: bool = True):
    """The layer's GEMM for ``target``: (scheduled func, plan, kernel, constants, tuned).
    One lookup in the selection table (a GEMM of one row takes a one-row kernel, one whose
    K is 1-8 past a multiple of 16 neon's 8-byte kernel), then one plan."""
    from tvm_armq.intrinsics import kernels
    from tvm_armq.schedules import conv2d_gemm as cg
    from tvm_armq.schedules import gemm_compute, gemm_plan, gemm_schedule, tir_util

    dtype = layer.out_dtype
    kernel = kernels.select(target, dtype, dtype, rows=shape.gemm_m, depth=shape.gemm_k)
    plan = gemm_plan.plan(shape, kernel)
    mult, shift = layer_requant(layer)
    # the func may count on the layer's shifts: none above the largest (scales below 1
    # make it <= -1, and the epilogue leaves out the left shift and half the rounding fixup)
    func = gemm_compute.conv2d_gemm_func(plan, in_dtype=dtype, out_dtype=dtype,
                                         in_zp=layer.x_q[1], out_zp=layer.out_q[1],
                                         act_range=layer.act_range, w_zp=layer.w_zp,
                                         max_shift=int(shift.max()),
                                         min_shift=int(shift.min()),
                                         rounding=requant_rounding(layer))
    scheduled = None
    if tune and opts.tuned_schedule is not None:
        scheduled = opts.tuned_schedule(func, plan)
    tuned = scheduled is not None
    if not tuned:
        scheduled = (gemm_schedule.schedule_conv2d_gemm(func, plan, target) if opts.schedule
                     else tir_util.merge_outputs(func))
    consts = [*cg.constants(plan, w_hwio, layer.bias, layer.x_q[1], w_zp=layer.w_zp), mult,
              shift]
    return scheduled, plan, kernel, consts, tuned


def _portable_gemm(layer: Layer, label: str, shape, w_hwio, data, in_shape, out_shape,
                   opts):
    """A portable build's GEMM layer (``portable.py``): the layer's GEMM for every level
    of the build, each compiled apart, and the dispatcher that calls the CPU's level."""
    from .. import portable
    from ..targets import resolve

    built = {level: _gemm_variant(layer, shape, w_hwio, resolve(level), opts, tune=False)
             for level in opts.variants.levels}
    arrays, index = portable.unique_consts({lvl: b[3] for lvl, b in built.items()})
    dtype = layer.out_dtype
    consts = [(f"c{i}", a.shape, a.dtype.name) for i, a in enumerate(arrays)]
    calls = {}
    for level, (func, _plan, kernel, _consts, _tuned) in built.items():
        symbol = opts.variants.add(level, label, func, kernel.name)
        calls[level] = (symbol, ["data", *(f"c{i}" for i in index[level]), "output"])
    kernels_ = tuple(b[2].name for b in built.values())
    func = portable.dispatcher([("data", data[0][1], dtype)], consts,
                               ("output", out_shape, dtype), calls,
                               {"tvm_armq.op": "conv2d_gemm_portable",
                                "tvm_armq.kernel": "+".join(kernels_)})
    record = Lowered(layer.op, label, in_shape, layer.out_shape, kernels_[0],
                     variants=kernels_)
    return KernelCall(func, layer.op, data, arrays, out_shape, record, dtype)


def depthwise_kernel(layer: Layer, label: str, opts: Options):
    """Depthwise conv2d as ``schedules.depthwise``: taps in fours through sdot where the
    target has +dotprod, else NEON widening multiply-accumulates; a portable build carries
    the layer's kernel for each of its levels and a dispatcher, as its GEMMs do."""
    from tvm_armq.schedules import depthwise as dw

    from .. import portable

    b, h, w, c = shape_of(layer.x)
    _, kh, kw, n = layer.weight.shape
    shape = dw.DepthwiseShape(b, h, w, c, n // c, kh, kw, **conv_window(layer.conv_attrs))
    in_shape, out_shape = (b, h, w, c), (b, shape.out_h, shape.out_w, n)
    if opts.variants is None or not opts.schedule:
        func, name, consts = _depthwise_variant(layer, shape, opts.target, opts.schedule)
        record = Lowered(layer.op, label, in_shape, layer.out_shape, name)
        return KernelCall(func, layer.op, [layer.x], consts, out_shape, record)
    from ..targets import resolve

    built = {level: _depthwise_variant(layer, shape, resolve(level))
             for level in opts.variants.levels}
    arrays, index = portable.unique_consts({lvl: v[2] for lvl, v in built.items()})
    calls = {level: (opts.variants.add(level, label, func, name),
                     ["data", *(f"c{i}" for i in index[level]), "output"])
             for level, (func, name, _) in built.items()}
    kernels_ = tuple(v[1] for v in built.values())
    func = portable.dispatcher([("data", in_shape, "int8")],
                               [(f"c{i}", a.shape, a.dtype.name) for i, a in enumerate(arrays)],
                               ("output", out_shape, "int8"), calls,
                               {"tvm_armq.op": "depthwise_conv2d_portable",
                                "tvm_armq.kernel": "+".join(kernels_)})
    record = Lowered(layer.op, label, in_shape, layer.out_shape, kernels_[0], variants=kernels_)
    return KernelCall(func, layer.op, [layer.x], arrays, out_shape, record)


def depthwise_taps(weight: np.ndarray, shape, target) -> dict:
    """How a depthwise kernel of ``shape`` sums its taps at ``target`` (``depthwise_te``'s
    options): in fours through sdot where the target has +dotprod (a portable build's
    levels each get their own kernel, built for one level), the rest two products in
    int16, which is exact unless a weight is -128 (see schedules/depthwise.py)."""
    from tvm_armq.intrinsics import kernels
    from tvm_armq.intrinsics.lane_dot import TAPS
    from tvm_armq.schedules import depthwise as dw

    from ..targets import portable_levels

    return dict(int16_pairs=bool(weight.min() > -128),
                lane_dots=(TAPS <= shape.taps <= dw.DOT_MAX_TAPS
                           and portable_levels(target) is None
                           and kernels.target_has(target, "has_dotprod")))


def _depthwise_variant(layer: Layer, shape, target, schedule: bool = True):
    """The layer's depthwise kernel for ``target``: (func, kernel name, constants). Taps go
    through sdot in fours (``lane_dot``) where the target has +dotprod."""
    from tvm_armq.schedules import depthwise as dw

    mult, shift = layer_requant(layer)
    taps = depthwise_taps(layer.weight, shape, target)
    # the requantization is built for the layer's largest shift (as in gemm_kernel)
    options = dict(int16_pairs=taps["int16_pairs"], max_shift=int(shift.max()),
                   min_shift=int(shift.min()))
    lane_dots = taps["lane_dots"]
    func = dw.depthwise_func(shape, in_zp=layer.x_q[1], out_zp=layer.out_q[1],
                             act_range=layer.act_range, lane_dots=lane_dots, **options)
    if schedule:
        func = dw.schedule_depthwise(func, shape)
    consts = dw.pack_params(layer.weight, layer.bias, mult, shift, shape, in_zp=layer.x_q[1],
                            **options)
    return func, depthwise_name("depthwise", ("int8", "int8", "int32"), shape, taps), consts


def depthwise_name(op: str, types, shape, taps: dict) -> str:
    """A depthwise kernel's name (``op``: the integer or the hybrid family) from how it
    sums its taps (``depthwise_taps``): ``_dotprod`` through sdot, else ``_neon``, with the
    ``pairs16`` variant where two products are summed in int16."""
    if taps["lane_dots"]:
        return names.kernel_name(op, types, "dotprod", (shape.kh, shape.kw))
    return names.kernel_name(op, types, "neon", (shape.kh, shape.kw),
                             "pairs16" if taps["int16_pairs"] else None)


def _is_bias_add(graph: Graph, add) -> bool:
    """An add whose other arm is a conv2d / matmul: a layer's bias, not an ADD."""
    return any(graph.call(a, "relax.nn.conv2d", "relax.matmul") is not None for a in add.args)


def _match(graph: Graph, root):
    core = root.core
    if root.op in ("conv2d", "matmul") or (root.op == "add" and _is_bias_add(graph, core)):
        return core
    return None


def _lower(graph: Graph, root, _core, opts: Options) -> KernelCall:
    layer = match_layer(graph, root.quantize, root.clip)
    make = depthwise_kernel if layer.op == "depthwise_conv2d" else gemm_kernel
    return make(layer, root.label, opts)


FAMILY = OpFamily("gemm", ("relax.quantize",), _match, _lower)
