"""QDQ to integer: the Relax pass that makes quantized TFLite layers run tvm_armq kernels.

Read this first. TVM 0.27's TFLite frontend imports every quantized layer as float
compute between a ``dequantize`` and a ``quantize``; a CONV_2D with a fused ReLU6 is

    x_f  = dequantize(x, s_in, zp_in)                    x: int8 activations
    w_f  = dequantize(W, s_w[c], 0, axis=3)              W: int8 constant (HWIO)
    b_f  = dequantize(B, s_in * s_w[c], 0)               B: int32 constant
    y    = quantize(conv2d(x_f, w_f) + b_f, s_out, zp_out)
    out  = clip(y, lo, hi)                               the fused activation

The pass (``quantized_to_integer``; TVM names it ``tvm_armq.QuantizedToInteger``) finds that
chain, reads the int8/int32 constants and the scales back out of it, and replaces it with
one ``call_tir`` of a tvm_armq kernel:

    out  = call_tir(conv2d_gemm, [x, W_packed, bias_folded, multiplier, shift])

whose operands are compile-time constants re-laid for the micro-kernel
(``schedules.gemm_layout.pack_weights``: the alter-op step, run here once, in NumPy).
The requantization parameters are computed exactly as TFLite's Prepare computes them
(multiplier of in_scale * w_scale[c] / out_scale in double), and the clamp of the fused
activation as TFLite's ``CalculateActivationRangeQuantized`` does, so the integer result
is TFLite's to the bit. The float ops the chain leaves unused are removed afterwards.

What becomes integer (each a ``Lowered`` record in the pass's report), by what precedes
the ``quantize`` (or, for the average pool, the frontend's own int32 form):

    conv2d, groups = 1 or in_c / groups > 1   -> conv2d_gemm   GEMM micro-kernel of the target
    conv2d, groups = in_c (depthwise)          -> depthwise     NEON widening MACs
    conv2d_transpose (TRANSPOSE_CONV)          -> conv2d_gemm   one stride-1 conv per output
                                                 + transpose_conv  phase, a pixel shuffle
    matmul with a constant int8 weight (FC,    -> conv2d_gemm   as a 1x1 conv, the leading
    on [..., K] inputs too)                                     axes as rows
    matmul of two int8 tensors (BATCH_MATMUL)  -> batch_matmul  both operands as they lie
    add, subtract, multiply (int8 tensors or   -> int8_ops      TFLite's 8-bit ADD / SUB / MUL
    a constant operand)
    where(d >= 0, d, d * alpha) (PRELU)        -> int8_ops      TFLite's two rescalings
    resize2d (bilinear of a dequantized int8   -> resize        TFLite's 10-bit interpolation
    tensor; nearest of the int8 tensor itself)                 / its float32 positions
    maximum, minimum                           -> int8_ops      raw 8-bit comparisons
    sigmoid, tanh, exp, rsqrt, leakyrelu, relu, -> lut           a 256-entry table of TFLite's
    gelu, x * relu6(x + 3) / 6 on one input,                    LOGISTIC, TANH, GELU,
    negative (a float island)                                   HARD_SWISH, ...
    add, subtract, multiply of x and a table   -> lut           one table of x (swish:
    op of x (or of x and x)                                     x * LOGISTIC(x))
    mean, softmax, dequantize (= QUANTIZE)     -> int8_ops      MEAN / SOFTMAX / requantize
    concat                                     -> int8_ops      a copy per input (requantizing
                                                                inputs whose scale differs;
                                                                a constant input as it is)
    astype(avg_pool2d(astype(x, int32)))       -> int8_ops      TFLite's rounded average

conv2d and dense also take TFLite's legacy uint8 scheme (uint8 weights with a zero point):
the u8 GEMM kernel of the target, plus a row-sums kernel for the weight zero point's term
(``schedules.conv2d_u8``).

The fused activation is either a ``clip`` after the quantize (conv, dense) or a float
``relu`` / ``clip(0, 6)`` before it (ADD, MUL); both become the clamp TFLite computes.
PAD, MAX_POOL_2D and reshapes are already integer in the frontend's output. Anything else
is left as the frontend made it (float between dequantize and quantize), still correct,
and the report says why (``Fallback`` records). ``hooks.py`` puts this pass in front of
``tvm.compile``'s default pipeline for aarch64 targets.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from .graph import (Graph, NotInteger, clip_range, dequantize_of, dequantized_const, dtype_of,
                    fused_activation, is_const, op_type, qparams, rewrite_functions, shape_of)
from .intrinsics import names
from .report import Fallback, Lowered
from .tflite_layers import (ACT_NONE, ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1,
                            activation_range)


# ------------------------------------------------------------------ matched layers
@dataclasses.dataclass
class _Layer:
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


def _int_bias(graph: Graph, expr) -> np.ndarray:
    """A layer's bias: ``dequantize`` of an int32 constant with zero point 0."""
    value, q = dequantized_const(graph, expr, "the bias")
    if value.dtype != np.int32 or q.zp.any():
        raise NotInteger("the bias is not int32 with zero point 0")
    return value.reshape(-1)


def _match_layer(graph: Graph, quantize, clip) -> _Layer:
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
        bias = _int_bias(graph, bias_expr)
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
    return _Layer(op, x, x_q, weight, w_scales, bias, (out_scale, out_zp), out_dtype, act,
                  attrs, shape_of(quantize), w_zp)


def _transpose_conv_of(graph: Graph, y):
    """(conv2d_transpose call, bias expression or None) if ``y`` is the frontend's
    quantized TRANSPOSE_CONV (``frontend._convert_transpose_conv``): the NCHW
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


def _match_transpose_conv(graph: Graph, quantize, clip, conv, bias_expr):
    """A quantized TRANSPOSE_CONV (``schedules.transpose_conv``): (its geometry, the layer
    as one _Layer, and per output phase (the phase, the _Layer of its stride-1
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
    bias = _int_bias(graph, bias_expr) if bias_expr is not None else np.zeros(n_out, np.int32)
    layer = _Layer("transpose_conv", x, x_q, w_ohwi, w_scales, bias, out_q, "int8",
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


# ------------------------------------------------------------------ integer kernels
@dataclasses.dataclass
class _KernelCall:
    """One ``call_tir`` for the pass to emit."""

    func: object
    name: str
    inputs: list            # in order: graph variables, or (variable, shape the func takes),
                            # or (_KernelCall, shape its output takes) whose output it is
    consts: list            # NumPy arrays after the inputs
    out_shape: tuple
    record: Lowered
    out_dtype: str = "int8"
    after: list = dataclasses.field(default_factory=list)  # _KernelCalls after the consts


@dataclasses.dataclass
class _Concat:
    """A concatenation: each input as it is (``func`` None) or requantized, then a copy."""

    parts: list             # _KernelCalls, one per input
    axis: int
    record: Lowered


def _requant(layer: _Layer):
    from tvm_armq.intrinsics import requant

    mult, shift = requant.quantize_multipliers(layer.real_scales())
    return mult.astype(np.int32), shift.astype(np.int32)


def _conv_window(layer: _Layer) -> dict:
    a = layer.conv_attrs
    return dict(strides=tuple(int(v) for v in a.strides),
                dilation=tuple(int(v) for v in a.dilation),
                padding=tuple(int(v) for v in a.padding))


def requant_rounding(layer: _Layer) -> str:
    """How TFLite's reference kernel rounds the layer's requantization: its int8
    FULLY_CONNECTED rounds once (``(acc * m + 2**(30 - s)) >> (31 - s)``), its CONV_2D
    (and uint8 layers) twice, gemmlowp's way. Measured on TFLite's BUILTIN_REF, which
    gives the two ops different results for the same accumulator (tests/test_integrate.py)."""
    return "single" if layer.op == "dense" and layer.out_dtype == "int8" else "double"


@dataclasses.dataclass(frozen=True)
class _Options:
    """How the pass builds kernels: for ``target``; a GEMM layer's func scheduled by
    ``tuned_schedule(func, plan)`` where that gives one (a tuned schedule), else as its
    plan says; ``schedule`` False leaves every kernel unscheduled (``quantized_to_integer``)."""

    target: object
    tuned_schedule: object = None
    schedule: bool = True
    variants: object = None  # portable.Variants of a portable build: per-level GEMMs


def _gemm_kernel(layer: _Layer, label: str, opts: _Options):
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
                            **_conv_window(layer))
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
        after.append(_KernelCall(cu.schedule_row_sums(f) if opts.schedule else f, "row_sums", data,
                                 [], (shape.gemm_m, shape.groups), None, "int32"))
    tail = plan.tail.kernel.name if plan.tail is not None else None
    record = Lowered(layer.op, label, in_shape, layer.out_shape, kernel.name, tuned, tail,
                     _portable_kernels(layer, shape, opts.target))
    return _KernelCall(scheduled, layer.op, data, consts, out_shape, record, dtype, after)


def _portable_kernels(layer: _Layer, shape, target) -> tuple:
    """What a portable build would run per level (for ``inspect``, which builds nothing);
    () for a single-level target."""
    from tvm_armq.intrinsics import kernels

    from .targets import portable_levels, resolve

    levels = portable_levels(target)
    if levels is None or layer.w_zp:
        return ()
    dtype = layer.out_dtype
    return tuple(kernels.select(resolve(lvl), dtype, dtype, rows=shape.gemm_m,
                                depth=shape.gemm_k).name for lvl in levels)


def _gemm_variant(layer: _Layer, shape, w_hwio, target, opts: _Options, tune: bool = True):
    """The layer's GEMM for ``target``: (scheduled func, plan, kernel, constants, tuned).
    One lookup in the selection table (a GEMM of one row takes a one-row kernel, one whose
    K is 1-8 past a multiple of 16 neon's 8-byte kernel), then one plan."""
    from tvm_armq.intrinsics import kernels
    from tvm_armq.schedules import conv2d_gemm as cg
    from tvm_armq.schedules import gemm_compute, gemm_plan, gemm_schedule, tir_util

    dtype = layer.out_dtype
    kernel = kernels.select(target, dtype, dtype, rows=shape.gemm_m, depth=shape.gemm_k)
    plan = gemm_plan.plan(shape, kernel)
    mult, shift = _requant(layer)
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


def _portable_gemm(layer: _Layer, label: str, shape, w_hwio, data, in_shape, out_shape,
                   opts):
    """A portable build's GEMM layer (``portable.py``): the layer's GEMM for every level
    of the build, each compiled apart, and the dispatcher that calls the CPU's level."""
    from . import portable
    from .targets import resolve

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
    return _KernelCall(func, layer.op, data, arrays, out_shape, record, dtype)


def _depthwise_kernel(layer: _Layer, label: str, opts: _Options):
    """Depthwise conv2d as ``schedules.depthwise``: taps in fours through sdot where the
    target has +dotprod, else NEON widening multiply-accumulates; a portable build carries
    the layer's kernel for each of its levels and a dispatcher, as its GEMMs do."""
    from tvm_armq.schedules import depthwise as dw

    from . import portable

    b, h, w, c = shape_of(layer.x)
    _, kh, kw, n = layer.weight.shape
    shape = dw.DepthwiseShape(b, h, w, c, n // c, kh, kw, **_conv_window(layer))
    in_shape, out_shape = (b, h, w, c), (b, shape.out_h, shape.out_w, n)
    if opts.variants is None or not opts.schedule:
        func, name, consts = _depthwise_variant(layer, shape, opts.target, opts.schedule)
        record = Lowered(layer.op, label, in_shape, layer.out_shape, name)
        return _KernelCall(func, layer.op, [layer.x], consts, out_shape, record)
    from .targets import resolve

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
    return _KernelCall(func, layer.op, [layer.x], arrays, out_shape, record)


def _depthwise_variant(layer: _Layer, shape, target, schedule: bool = True):
    """The layer's depthwise kernel for ``target``: (func, kernel name, constants). Taps go
    through sdot in fours (``lane_dot``) where the target has +dotprod."""
    from tvm_armq.intrinsics import kernels
    from tvm_armq.intrinsics.lane_dot import TAPS
    from tvm_armq.schedules import depthwise as dw

    from .targets import portable_levels

    mult, shift = _requant(layer)
    # int16 pair sums are exact unless a weight is -128 (see schedules/depthwise.py);
    # the requantization is built for the layer's largest shift (as in _gemm_kernel).
    options = dict(int16_pairs=bool(layer.weight.min() > -128), max_shift=int(shift.max()),
                   min_shift=int(shift.min()))
    lane_dots = (TAPS <= shape.taps <= dw.DOT_MAX_TAPS and portable_levels(target) is None
                 and kernels.target_has(target, "has_dotprod"))
    func = dw.depthwise_func(shape, in_zp=layer.x_q[1], out_zp=layer.out_q[1],
                             act_range=layer.act_range, lane_dots=lane_dots, **options)
    if schedule:
        func = dw.schedule_depthwise(func, shape)
    consts = dw.pack_params(layer.weight, layer.bias, mult, shift, shape, in_zp=layer.x_q[1],
                            **options)
    _, kh, kw, _ = layer.weight.shape
    types = ("int8", "int8", "int32")
    if lane_dots:
        name = names.kernel_name("depthwise", types, "dotprod", (kh, kw))
    else:
        name = names.kernel_name("depthwise", types, "neon", (kh, kw),
                                 "pairs16" if options["int16_pairs"] else None)
    return func, name, consts


# ------------------------------------------------------------------ other int8 ops
# The float activation the frontend puts between an ADD/MUL and its quantize.
_FLOAT_ACTIVATIONS = {(0.0, 6.0): ACT_RELU6, (-1.0, 1.0): ACT_RELU_N1_TO_1}


def _act_before(graph: Graph, y):
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


def _quantized_operand(graph: Graph, expr, what: str):
    """(int8 variable or constant array, (scale, zp)) of a dequantized per-tensor operand:
    ADD, SUB, MUL, MAXIMUM and MINIMUM take a constant operand (a batch-norm left as a
    per-channel MUL and ADD) exactly as they take a tensor."""
    deq = dequantize_of(graph, expr)
    value = graph.const(deq.args[0]) if deq is not None else None
    if value is None:
        return _quantized_var(graph, expr, what)
    if value.dtype != np.int8:
        raise NotInteger(f"{what} is a {value.dtype} constant (int8 only)")
    q = qparams(graph, deq).scalar(what)
    return value.reshape(shape_of(expr)), q


def _binary_operands(graph: Graph, core, op: str, symmetric: bool):
    """((a, a_q), (b, b_q), swapped) of a two-input op, a constant operand (if any)
    second: for an op ``symmetric`` in its inputs the swap changes nothing; for SUB and
    SQUARED_DIFFERENCE ``swapped`` says the kernel must take its operands in the other
    order (``int8_ops.add_func``'s ``b_first``)."""
    (a, a_q), (b, b_q) = (_quantized_operand(graph, e, f"{op} input {i}")
                          for i, e in enumerate(core.args))
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        raise NotInteger(f"{op} of two constants")
    swapped = isinstance(a, np.ndarray)
    if swapped:
        (a, a_q), (b, b_q) = (b, b_q), (a, a_q)
    return (a, a_q), (b, b_q), swapped and not symmetric


def _squared_difference(graph: Graph, core):
    """The ``subtract`` call of the frontend's SQUARED_DIFFERENCE (``d * d`` with
    ``d = dequantize(a) - dequantize(b)``), or None."""
    if core.op.name != "relax.multiply" or not core.args[0].same_as(core.args[1]):
        return None
    return graph.call(core.args[0], "relax.subtract")


# the op names of int8_ops.add_func for the pass's two-input ops of ADD's recipe
_COMMON_SCALE_OPS = {"add": "ADD", "subtract": "SUB", "squared_difference": "SQUARED_DIFFERENCE"}


def _operand_shape(x) -> tuple[int, ...]:
    """The shape of a graph operand or of a constant operand."""
    return tuple(x.shape) if isinstance(x, np.ndarray) else shape_of(x)


def _binary_call(func, op: str, a, b, out_shape, record) -> "_KernelCall":
    """The call of a two-input kernel: ``b`` a graph input, or a constant operand."""
    if isinstance(b, np.ndarray):
        return _KernelCall(func, op, [a], [b], out_shape, record)
    return _KernelCall(func, op, [a, b], [], out_shape, record)


def _quantized_var(graph: Graph, expr, what: str):
    """(int8 variable, (scale, zp)) of ``dequantize(var)`` with per-tensor parameters."""
    deq = graph.call(expr, "relax.dequantize")
    if deq is None or is_const(deq.args[0]) or graph.const(deq.args[0]) is not None:
        raise NotInteger(f"{what} is not a dequantized int8 tensor")
    x = deq.args[0]
    if dtype_of(x) != "int8":
        raise NotInteger(f"{what} has dtype {dtype_of(x)} (int8 only)")
    return x, qparams(graph, deq).scalar(what)


def _out_range(clip, act, out_q) -> tuple[int, int]:
    """The output clamp: the float activation before the quantize and/or the frontend's
    clip after it, both recomputed TFLite's way, intersected."""
    lo, hi = activation_range(act, out_q[0], out_q[1], "int8")
    if clip is not None:
        clo, chi = fused_activation(*(float(v.value) for v in clip.args[1:3]), *out_q, "int8")
        lo, hi = max(lo, clo), min(hi, chi)
    return lo, hi


def _int8_op(graph: Graph, quantize, clip, label: str) -> _KernelCall | _Concat:
    """The non-GEMM int8 ops (``schedules.int8_ops``), TFLite's reference arithmetic."""
    from tvm_armq.schedules import int8_ops as ops

    out_q = qparams(graph, quantize).scalar("the output")
    if str(quantize.attrs.out_dtype) != "int8":
        raise NotInteger(f"output dtype {quantize.attrs.out_dtype} (int8 only)")
    out_shape = shape_of(quantize)
    y, act = _act_before(graph, quantize.args[0])
    core = graph.call(y, "relax.add", "relax.subtract", "relax.multiply", "relax.maximum",
                      "relax.minimum", "relax.mean", "relax.concat", "relax.nn.softmax",
                      "relax.dequantize", "relax.where", "relax.image.resize2d")
    if core is None:
        raise NotInteger("no integer kernel for this op")
    op = core.op.name.replace("relax.", "").replace("nn.", "")
    act_range = _out_range(clip, act, out_q)

    def record(kernel, inputs):
        return Lowered(op, label, shape_of(inputs[0]), out_shape, kernel)

    square = _squared_difference(graph, core)
    if square is not None:  # SQUARED_DIFFERENCE: the frontend's d * d of d = a - b
        core, op = square, "squared_difference"
    if op in ("add", "subtract", "multiply", "squared_difference"):
        # a: a tensor; b: a tensor or a constant (passed last); swapped: b is the op's first
        (a, a_q), (b, b_q), swapped = _binary_operands(graph, core, op,
                                                       symmetric=op in ("add", "multiply"))
        try:
            folded = _one_input_table(graph, op, a, a_q, b, b_q, out_q, act_range)
            if folded is not None:
                from tvm_armq.schedules import lut

                x, table = folded
                return _KernelCall(lut.lut_func(out_shape), "lut", [x], [table], out_shape,
                                   record(names.elementwise_name("lut"), [x]))
            if op == "multiply":
                func = ops.mul_func(shape_of(a), _operand_shape(b), out_shape, a_q, b_q, out_q,
                                    act_range)
            else:
                (x, x_q), (y, y_q) = ((b, b_q), (a, a_q)) if swapped else ((a, a_q), (b, b_q))
                constant = b if isinstance(b, np.ndarray) else None
                func = ops.add_func(_operand_shape(x), _operand_shape(y), out_shape, x_q, y_q,
                                    out_q, act_range, op=_COMMON_SCALE_OPS[op], b_first=swapped,
                                    constant=constant)
                if constant is not None:  # the kernel takes the constant already rescaled
                    func, b = func
        except ValueError as e:  # TFLite's Prepare refuses these scales too
            raise NotInteger(f"{op}: {e}") from None
        return _binary_call(func, op, a, b, out_shape, record(names.elementwise_name(op), [a]))
    if act != ACT_NONE or act_range != (-128, 127):
        raise NotInteger(f"{op} followed by an activation")
    if op == "image.resize2d":  # RESIZE_BILINEAR: quantize(resize2d(dequantize(x)))
        x, _ = _quantized_var(graph, core.args[0], "the resize input")
        return _resize(graph, core, x, label)
    if op == "where":  # PRELU: where(d >= 0, d, d * dequantize(alpha)), d = dequantize(x)
        x, x_q = _quantized_var(graph, core.args[1], "the PRELU input")
        negative = graph.call(core.args[2], "relax.multiply")
        if negative is None or not negative.args[0].same_as(core.args[1]) or \
                graph.call(core.args[0], "relax.greater_equal") is None:
            raise NotInteger("a select that is not the frontend's PRELU")
        alpha, alpha_q = _quantized_operand(graph, negative.args[1], "the PRELU alpha")
        try:
            func = ops.prelu_func(shape_of(x), _operand_shape(alpha), x_q, alpha_q, out_q)
        except ValueError as e:  # TFLite's Prepare refuses these scales too
            raise NotInteger(str(e)) from None
        return _binary_call(func, "prelu", x, alpha, out_shape,
                            Lowered("prelu", label, shape_of(x), out_shape,
                                    names.elementwise_name("prelu")))
    if op in ("maximum", "minimum"):  # raw 8-bit comparisons (TFLite rescales nothing)
        (a, _), (b, _), _ = _binary_operands(graph, core, op, symmetric=True)
        func = ops.min_max_func(op, shape_of(a), _operand_shape(b), out_shape)
        return _binary_call(func, op, a, b, out_shape, record(names.elementwise_name(op), [a]))
    if op == "mean":
        x, x_q = _quantized_var(graph, core.args[0], "the mean input")
        axes = [int(v) for v in core.attrs.axis]
        func = ops.mean_func(shape_of(x), axes, bool(core.attrs.keepdims), x_q, out_q)
        return _KernelCall(func, op, [x], [], out_shape,
                           record(names.elementwise_name("mean"), [x]))
    if op == "softmax":
        arg, beta = core.args[0], 1.0
        scaled = graph.call(arg, "relax.multiply")  # softmax(beta * x): frontend.py
        if scaled is not None and graph.const(scaled.args[1]) is not None:
            arg, beta = scaled.args[0], float(graph.const(scaled.args[1]))
        x, x_q = _quantized_var(graph, arg, "the softmax input")
        if int(core.attrs.axis) not in (-1, len(shape_of(x)) - 1):
            raise NotInteger("softmax over an axis other than the last")
        if out_q != (1.0 / 256, -128):
            raise NotInteger(f"softmax output quantization {out_q} (TFLite's is 1/256, -128)")
        func, table = ops.softmax_func(shape_of(x), x_q, beta)
        return _KernelCall(func, op, [x], [table], out_shape,
                           record(names.elementwise_name("softmax"), [x]))
    if op == "dequantize":  # quantize(dequantize(x)): TFLite's QUANTIZE, a requantization
        x, x_q = _quantized_var(graph, core, "the input")
        func = ops.requantize_func(shape_of(x), x_q, out_q)
        return _KernelCall(func, "requantize", [x], [], out_shape,
                           Lowered("quantize", label, shape_of(x), out_shape,
                                   names.elementwise_name("requantize")))
    # concat: inputs already in the output's quantization are copied as they are; the
    # others are requantized first (what TFLite's converter puts in front of them).
    # A constant input (a ViT's class token) is one more part, requantized here if needed.
    parts = []
    for i, e in enumerate(core.args[0].fields if hasattr(core.args[0], "fields")
                          else graph.defs[core.args[0]].fields):
        x, x_q = _quantized_operand(graph, e, f"concat input {i}")
        if isinstance(x, np.ndarray):
            if x_q != out_q:
                from tvm_armq.schedules.reference import requantize_tensor

                p = ops.requantize_params(x_q, out_q)
                x = requantize_tensor(x, in_zp=p.in_zp, out_zp=p.out_zp,
                                      multiplier=p.multiplier, shift=p.shift)
            parts.append(_KernelCall(None, "constant", [x], [], x.shape, None))
            continue
        func = None if x_q == out_q else ops.requantize_func(shape_of(x), x_q, out_q)
        parts.append(_KernelCall(func, "requantize", [x], [], shape_of(x), None))
    kernel = names.elementwise_name("concat") + (
        "" if all(p.func is None for p in parts) else "+" + names.elementwise_name("requantize"))
    return _Concat(parts, int(core.attrs.axis),
                   Lowered("concat", label, _operand_shape(parts[0].inputs[0]), out_shape,
                           kernel))


def _float_const(graph: Graph, expr) -> float | None:
    value = graph.const(expr)
    return float(value.reshape(())) if value is not None and value.size == 1 else None


def _unary_of(graph: Graph, y):
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
    if product is None or _float_const(graph, call.args[1]) != 6.0:
        return None
    x, relu6 = product.args
    relu6 = graph.call(relu6, "relax.clip")
    shifted = graph.call(relu6.args[0], "relax.add") if relu6 is not None else None
    deq = graph.call(x, "relax.dequantize")
    if shifted is None or deq is None or \
            tuple(float(v.value) for v in relu6.args[1:3]) != (0.0, 6.0) or \
            not shifted.args[0].same_as(x) or _float_const(graph, shifted.args[1]) != 3.0:
        return None
    return "HARD_SWISH", deq, {}


_RELU_ACTIVATIONS = {"RELU": ACT_RELU, "RELU6": ACT_RELU6, "RELU_N1_TO_1": ACT_RELU_N1_TO_1}


def _lut_table(graph: Graph, quantize, unary):
    """(input variable, dtype, 256-entry table) of the unary op ``unary`` (``_unary_of``)
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
    for x = -128 + k: ``v`` = a table op (``_unary_of``) of ``x``, or ``v`` itself (the
    identity table)."""
    q = graph.call(v, "relax.quantize")
    unary = _unary_of(graph, q.args[0]) if q is not None else None
    if unary is not None:
        try:
            x, dtype, table = _lut_table(graph, q, unary)
            if dtype == "int8":
                return x, table
        except NotInteger:
            pass
    info = np.iinfo(np.int8)
    return v, np.arange(info.min, info.max + 1).astype(np.int8)


def _one_input_table(graph: Graph, op: str, a, a_q, b, b_q, out_q, act_range):
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
    p = ops.add_params(a_q, b_q, out_q, act_range, op=_COMMON_SCALE_OPS[op])
    return x, ref.broadcast_add(ta, tb, **dataclasses.asdict(p))


def _lut(graph: Graph, quantize, clip, unary, label: str) -> _KernelCall:
    """An 8-bit unary op as a 256-entry table of TFLite's arithmetic (``schedules.lut``)."""
    from tvm_armq.schedules import lut

    op = unary[0]
    if clip is not None:
        raise NotInteger(f"{op} followed by a clip")
    x, dtype, table = _lut_table(graph, quantize, unary)
    shape = shape_of(quantize)
    record = Lowered(op.lower(), label, shape_of(x), shape, names.elementwise_name("lut", dtype))
    return _KernelCall(lut.lut_func(shape, dtype), "lut", [x], [table], shape, record, dtype)


def _matmul_operand(graph: Graph, expr, what: str):
    """(int8 variable or constant, (scale, zp), adjoint) of a BATCH_MATMUL operand as the
    frontend writes it: ``dequantize(x)``, or ``permute_dims`` of that swapping the last two
    axes (``adj_x`` / ``adj_y``)."""
    adjoint = False
    perm = graph.call(expr, "relax.permute_dims")
    if perm is not None:
        rank = len(shape_of(perm.args[0]))
        if [int(a) for a in perm.attrs.axes] != [*range(rank - 2), rank - 1, rank - 2]:
            raise NotInteger(f"{what} is permuted other than by a swap of its last two axes")
        expr, adjoint = perm.args[0], True
    x, q = _quantized_operand(graph, expr, what)
    return x, q, adjoint


def _is_constant_weight(graph: Graph, matmul) -> bool:
    """A matmul whose right operand is a dequantized constant (a dense layer's weight)."""
    deq = dequantize_of(graph, matmul.args[1])
    return deq is not None and graph.const(deq.args[0]) is not None


def _batch_matmul(graph: Graph, quantize, clip, matmul, label: str, opts) -> _KernelCall:
    """BATCH_MATMUL of two int8 tensors (or of a tensor and a constant), TFLite's
    arithmetic (``schedules.batch_matmul``)."""
    from tvm_armq.schedules import batch_matmul as bm

    if str(quantize.attrs.out_dtype) != "int8":
        raise NotInteger(f"output dtype {quantize.attrs.out_dtype} (int8 only)")
    out_q = qparams(graph, quantize).scalar("the output")
    (a, a_q, adj_x), (b, b_q, adj_y) = (_matmul_operand(graph, e, f"operand {i}")
                                        for i, e in enumerate(matmul.args))
    if isinstance(a, np.ndarray):
        raise NotInteger("a constant left operand")
    try:
        shape = bm.BatchMatmulShape(_operand_shape(a), _operand_shape(b), adj_x, adj_y)
        p = bm.batch_matmul_params(a_q, b_q, out_q, _out_range(clip, ACT_NONE, out_q))
    except ValueError as e:
        raise NotInteger(str(e)) from None
    if shape.out != shape_of(quantize):
        raise NotInteger(f"output shape {shape_of(quantize)} is not {shape.out}")
    record = Lowered("batch_matmul", label, shape.lhs, shape.out,
                     bm.kernel_name(shape, opts.target))
    func = bm.batch_matmul_func(shape, p, target=opts.target, schedule=opts.schedule)
    return _binary_call(func, "batch_matmul", a, b, shape.out, record)


# TFLite's (align_corners, half_pixel_centers) by the frontend's coordinate transformation
_RESIZE_MODES = {"asymmetric": (False, False), "align_corners": (True, False),
                 "half_pixel": (False, True)}


def _resize(graph: Graph, call, x, label: str) -> _KernelCall:
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
    return _KernelCall(func, op, [x], tables, out_shape,
                       Lowered(op, label, in_shape, out_shape, names.elementwise_name(op)))


def _avg_pool(graph: Graph, cast, label: str) -> _KernelCall:
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
    return _KernelCall(func, "avg_pool2d", [x], [], shape_of(cast),
                       Lowered("avg_pool2d", label, shape_of(x), shape_of(cast),
                               names.elementwise_name("avg_pool")))


# ------------------------------------------------------------------ the pass
def _lowering_rewriter():
    from tvm import relax

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        """Replaces each matched quantize (or clip-of-quantize) by the integer kernel call."""

        def __init__(self, mod, func, opts: _Options):
            super().__init__(mod)
            self.opts = opts
            self.graph = Graph(func)
            self.report: list = []
            self.var_of = {value: var for var, value in self.graph.defs.items()}
            # quantize results whose only use is a clip: the clip is the layer's end
            self.fused = set()
            for value in self.graph.defs.values():  # a value may be a variable (an alias)
                clip = self.graph.call(value, "relax.clip")
                q = self.graph.call(clip.args[0], "relax.quantize") if clip is not None else None
                if q is not None and self.graph.uses.get(clip.args[0], 0) == 1:
                    self.fused.add(clip.args[0])

        def visit_call_(self, call):
            var = self.var_of.get(call)
            label = var.name if var is not None else "?"
            name = getattr(call.op, "name", "")
            lowered = None
            if name == "relax.clip":
                q = self.graph.call(call.args[0], "relax.quantize")
                if q is not None and call.args[0] in self.fused:
                    lowered = self._lower(label, q, call)
            elif name == "relax.quantize" and var not in self.fused:
                lowered = self._lower(label, call, None)
            elif name == "relax.image.resize2d" and dtype_of(call.args[0]) == "int8":
                # RESIZE_NEAREST_NEIGHBOR: the frontend resizes the int8 tensor itself
                lowered = self._try(label, "resize_nearest",
                                    lambda: _resize(self.graph, call, call.args[0], label))
            elif name == "relax.astype" and \
                    self.graph.call(call.args[0], "relax.nn.avg_pool2d") is not None:
                lowered = self._try(label, "avg_pool2d", lambda: _avg_pool(self.graph, call,
                                                                           label))
            return lowered if lowered is not None else super().visit_call_(call)

        def _try(self, label, op, make):
            try:
                return self._emit(make())
            except NotInteger as e:
                self.report.append(Fallback(op, label, str(e)))
                return None

        def _lower(self, label, quantize, clip):
            before, _ = _act_before(self.graph, quantize.args[0])
            core = self.graph.call(before, *_op_names(self.graph.defs.get(before)))
            op = core.op.name.replace("relax.", "").replace("nn.", "") if core is not None \
                else "quantize"
            if op == "matmul" and (not _is_constant_weight(self.graph, core)
                                   or _tflite_code(label) == "BATCH_MATMUL"):
                return self._try(label, "batch_matmul", lambda: _batch_matmul(
                    self.graph, quantize, clip, core, label, self.opts))
            if op in ("conv2d", "matmul") or (op == "add" and self._is_bias_add(core)):
                return self._try(label, op, lambda: self._gemm(label, quantize, clip))
            found = _transpose_conv_of(self.graph, quantize.args[0])
            if found is not None:
                return self._try(label, "transpose_conv",
                                 lambda: self._transpose_conv(label, quantize, clip, *found))
            unary = _unary_of(self.graph, quantize.args[0])
            if unary is not None:
                return self._try(label, unary[0].lower(),
                                 lambda: _lut(self.graph, quantize, clip, unary, label))
            return self._try(label, op, lambda: _int8_op(self.graph, quantize, clip, label))

        def _is_bias_add(self, add):
            """An add whose other arm is a conv2d / matmul: a layer's bias, not an ADD."""
            return any(self.graph.call(a, "relax.nn.conv2d", "relax.matmul") is not None
                       for a in add.args)

        def _gemm(self, label, quantize, clip) -> _KernelCall:
            layer = _match_layer(self.graph, quantize, clip)
            make = _depthwise_kernel if layer.op == "depthwise_conv2d" else _gemm_kernel
            return make(layer, label, self.opts)

        def _transpose_conv(self, label, quantize, clip, conv, bias) -> _KernelCall:
            """TRANSPOSE_CONV: a GEMM convolution of the target per output phase, then the
            pixel shuffle that puts their pixels in place (``schedules.transpose_conv``)."""
            from tvm_armq.schedules import transpose_conv as tc

            geom, layer, phases = _match_transpose_conv(self.graph, quantize, clip, conv,
                                                        bias)
            calls = []
            for _, c in phases:
                if c is not None:
                    kc = _gemm_kernel(c, label, self.opts)
                    kc.record = dataclasses.replace(kc.record, op="transpose_conv")
                    calls.append((kc, c.out_shape))
            batch, out_h, out_w, n_out = layer.out_shape
            if len(phases) == 1 and calls and phases[0][0].conv_hw == (out_h, out_w):
                # stride 1: the one convolution is the layer
                kc = calls[0][0]
                kc.record = dataclasses.replace(kc.record, in_shape=shape_of(layer.x),
                                                out_shape=layer.out_shape)
                return kc
            mult, shift = _requant(layer)
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
            func = tc.pixel_shuffle_func(batch, [ph for ph, _ in phases], (out_h, out_w),
                                         n_out, geom.strides)
            return _KernelCall(func, "pixel_shuffle", calls, fills, layer.out_shape, record)

        def _call_tir(self, kc: _KernelCall, out_shape=None):
            """Emit ``kc``; returns the output expression (not yet bound). ``out_shape``:
            the shape the call's output takes instead of ``kc.out_shape`` (the same
            elements, row-major). An input of another shape than the kernel's parameter,
            and such an output, are views inside the kernel (``tir_util.view_params``),
            not reshapes between calls."""
            from tvm_armq.schedules.tir_util import view_params

            args, views = [], {}
            for i, item in enumerate(kc.inputs):
                x, shape = item if isinstance(item, tuple) else (item, None)
                if isinstance(x, _KernelCall):  # a kernel's output is this one's input
                    args.append(self.builder_.emit(self._call_tir(x, shape)))
                    continue
                shape = shape_of(x) if shape is None else shape
                args.append(self.visit_expr(x))
                if shape_of(x) != tuple(shape):
                    views[i] = shape_of(x)
            out_shape = tuple(kc.out_shape) if out_shape is None else tuple(out_shape)
            if out_shape != tuple(kc.out_shape):  # the output is the last parameter
                last = len(kc.func.params) - 1
                assert tuple(int(d) for d in kc.func.params[last].shape) == tuple(kc.out_shape)
                views[last] = out_shape
            # te.create_prim_func names every func "main"; the module names them instead
            func = view_params(kc.func, views).without_attr("global_symbol")
            # a GEMM names itself; a kernel of the layer's (row sums, a concatenation's
            # requantized part) has no record of its own
            if kc.record is not None and "tvm_armq.kernel" not in (func.attrs or {}):
                func = func.with_attrs({"tvm_armq.kernel": kc.record.kernel,
                                        "tvm_armq.layer_op": kc.record.op})
            gv = self.builder_.add_func(func, f"tvm_armq_{kc.name}")
            args += [relax.const(c) for c in kc.consts]
            args += [self.builder_.emit(self._call_tir(c)) for c in kc.after]
            return relax.op.call_tir(gv, args, relax.TensorType(out_shape, kc.out_dtype))

        def _emit(self, made):
            if isinstance(made, _Concat):
                from tvm_armq.schedules import int8_ops as ops

                parts = [self.builder_.emit(self._call_tir(p)) if p.func is not None
                         else relax.const(p.inputs[0]) if isinstance(p.inputs[0], np.ndarray)
                         else self.visit_expr(p.inputs[0]) for p in made.parts]
                self.report.append(made.record)
                dtype = dtype_of(parts[0])
                func = ops.concat_func([p.out_shape for p in made.parts], made.axis,
                                              dtype)
                gv = self.builder_.add_func(func.without_attr("global_symbol"),
                                            "tvm_armq_concat")
                return relax.op.call_tir(gv, parts,
                                         relax.TensorType(made.record.out_shape, dtype))
            out = self._call_tir(made, made.record.out_shape)
            self.report.append(made.record)
            return out

    return Rewriter


def _tflite_code(label: str) -> str | None:
    """The TFLite op code of a layer's variable (``frontend.operator_name``), if named so."""
    from .frontend import operator_of

    found = operator_of(label)
    return found[1] if found else None


def _op_names(value) -> tuple[str, ...]:
    """The op name of a Call to an op (for ``Graph.call``), else nothing."""
    op = getattr(value, "op", None)
    return (op.name,) if isinstance(op, op_type()) else ()



def quantized_to_integer(target, *, tuned_schedule=None, report: list | None = None,
                         schedule: bool = True, variants=None):
    """The pass: every matched quantized layer of every Relax function becomes a tvm_armq
    kernel for ``target``. ``report`` (if given) receives one ``Lowered`` or ``Fallback``
    record per quantized layer.

    A GEMM layer (conv2d / dense) is one unscheduled func and its plan
    (``schedules.gemm_plan``); ``tuned_schedule(func, plan)``, if given, returns a tuned
    schedule of it or None, and the plan's default schedule runs where it gives none (the
    tuner's ``tuning.database_schedule`` replays a database; its task extraction records
    the layers). ``schedule=False`` leaves the kernels unscheduled: for ``inspect`` and
    task extraction, never for a build. A portable target (``targets.portable``) builds
    every GEMM layer once per level into ``variants`` (a ``portable.Variants``, linked
    into the library after the build: ``build.compile_tflite`` does it) behind a
    dispatcher; without ``variants`` (``inspect``) its layers are planned for the
    baseline level.
    """
    import tvm

    opts = _Options(target, tuned_schedule, schedule, variants)

    @tvm.transform.module_pass(opt_level=0, name="tvm_armq.QuantizedToInteger")
    def run(mod, _ctx):
        rewriter_cls = _lowering_rewriter()
        return rewrite_functions(mod, lambda m, f: rewriter_cls(m, f, opts), report)

    return run
