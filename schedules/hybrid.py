"""Dynamic-range ("hybrid") conv2d / dense / depthwise: float32 activations and int8
weights, run on the level's integer GEMM (a depthwise layer: ``depthwise.py``'s taps) as
TFLite's hybrid kernels compute them.

Read ``gemm_compute.py`` first: the GEMM here is that one (same plan, same packed weights,
same micro-kernels), over an int8 input made from the float32 one on every call, with a
float32 epilogue instead of the requantization:

    q_extrema[b]        min and max of each quantization group b of the input (one pass):
                        a batch index of the NHWC data (a dense layer's rows are its batch)
    q_params[b]         the group's scale, its inverse and its zero point, as TFLite's
                        ``SymmetricQuantizeFloats`` / ``AsymmetricQuantizeFloats`` compute
                        them (``reference.hybrid_quantize`` says how, step by step)
    data_q              the int8 input: round(x * inverse) + zp, clamped (``quantize_te``)
    A_packed, gemm      the GEMM of ``gemm_compute.gemm_parts_te`` (im2col pads with zp: a
                        padded pixel is a real zero)
    output              float32, per element (b the row's group, c its channel):

        ROW_SCALE        bias[c] + acc' * (q_scale[b] * w_scale[c])     FULLY_CONNECTED,
                                                                        BATCH_MATMUL,
                                                                        DEPTHWISE_CONV_2D;
                                                                        CONV_2D, one scale
        CHANNEL_FIRST    acc' * w_scale[c] * q_scale[b] + bias[c]       CONV_2D per channel

    with acc' = acc - q_zp[b] * colsum[c] (sum_k q * w less the zero point's term; colsum:
    each output channel's sum of weights, a constant), the fused activation's clamp, and,
    where a residual ADD follows the layer, + residual[...] and the ADD's clamp.

Every float operation is one IEEE operation in TFLite's order: LLVM would fuse a multiply
and the add after it into one FMLA (one rounding instead of two, a different result), so
each product goes through ``llvm.arithmetic.fence``, which keeps it a product of its own
and costs nothing. C's ``round`` (half away from zero) then the conversion is one FCVTAS.
``reference.hybrid_quantize`` and ``reference.hybrid_scale`` are the NumPy model, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .gemm_compute import gemm_parts_te
from .gemm_layout import BORDERED, ceil_div, pack_weights
from .gemm_plan import GemmPlan
from .reference import HYBRID_ASYMMETRIC_RANGE, HYBRID_SYMMETRIC_MAX
from .tir_util import fence, flatten_written

OP = "gemm_hybrid"
ROW_SCALE, CHANNEL_FIRST = "row_scale", "channel_first"
SYMMETRIC, ASYMMETRIC = "sym", "asym"
QUANTIZE_STAGE, PARAMS_STAGE, ROUNDED_STAGE = "data_q", "q_params", "q_rounded"
SCALE, INVERSE, ZERO_POINT = range(3)  # the columns of q_params
PARAMS = 3
FLOAT = "float32"
QUANTIZE_LANES = 16  # int8 lanes of one NEON register: data_q is stored a register at a time
FLOAT_LANES = 4  # float32 lanes of one NEON register
REDUCE_LANES = 16  # float32 partial minima / maxima per group: four NEON registers
FOLDED_LANES = 4  # the lanes left once the partial results are folded in halves


@dataclasses.dataclass(frozen=True)
class HybridScheme:
    """What TFLite's kernel does with one hybrid layer: how it quantizes the input
    (``inputs``: SYMMETRIC or ASYMMETRIC) and in which order it scales the sums
    (``epilogue``: ROW_SCALE or CHANNEL_FIRST)."""

    inputs: str
    epilogue: str

    @property
    def asymmetric(self) -> bool:
        return self.inputs == ASYMMETRIC


def _round(value):
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(str(value.ty), "llvm.round", value)


def params_te(data, scheme: HybridScheme, nonnegative: bool = False):
    """``q_params`` float32 [B, PARAMS] of float32 ``data`` [B, L] (each group's elements in
    a row), one row per quantization group: the group's scale, the inverse the quantization
    multiplies by and the zero point (an integer in [-128, 127], exact in float32).

    The min and the max are reduced together, in one pass over the input, REDUCE_LANES at
    a time into a row of partial results each (``q_extrema_part``: lane j takes elements
    j, j + REDUCE_LANES, ...; FMINNM and FMAXNM, a NEON vector instruction each per
    step), those rows folded in halves down to FOLDED_LANES (``q_extrema_fold8_v0`` the
    minima, ``_v1`` the maxima, ``q_extrema_fold4_v*``), then across those
    (``q_extrema``). FMINNM / FMAXNM (LLVM's minnum / maxnum) differ from a
    compare-and-select only in which zero of -0 and +0 they keep, which no parameter below
    can see (the scheme's range takes 0 in, or the absolute value).

    ``nonnegative``: every element is known to be >= 0 (the input is a ReLU's output), so
    the minimum is not reduced (the stages are the maxima's alone, without the ``_v*``
    suffixes): both schemes' parameters read the minimum only through min(0, min) or
    max(|min|, |max|), which are then 0 and the max."""
    from tvm import te, tirx

    B, L = (int(d) for d in data.shape)
    steps = ceil_div(L, REDUCE_LANES)
    big = tirx.max_value(FLOAT)
    # (combine, identity, the value a lane past the end takes) per reduced extreme
    kinds = ((_maxnum, tirx.min_value, -big),) if nonnegative else (
        (_minnum, tirx.max_value, big), (_maxnum, tirx.min_value, -big))
    extrema = te.comm_reducer(
        lambda x, y: tuple(f(a, b) for (f, _, _), a, b in zip(kinds, x, y)),
        lambda *t: tuple(ident(v) for (_, ident, _), v in zip(kinds, t)), name="extrema")
    o = te.reduce_axis((0, steps), "q_o")

    def lane(b, j):
        i = o * REDUCE_LANES + j
        if L % REDUCE_LANES == 0:
            value = tuple(data[b, i] for _ in kinds)
        else:
            inside = data[b, tirx.min(i, L - 1)]
            value = tuple(tirx.Select(i < L, inside, past) for _, _, past in kinds)
        return extrema(value, axis=o)

    def listed(out):  # te.compute returns a tensor per value, one tensor bare
        return list(out) if isinstance(out, (list, tuple)) else [out]

    parts = listed(te.compute((B, REDUCE_LANES), lane, name="q_extrema_part"))

    # across the lanes: halves folded onto each other (a vector instruction each) down to
    # FOLDED_LANES, then those one by one (min and max: the same in any order)
    def folded(ps, w):
        return listed(te.compute((B, w), lambda b, i: tuple(
            f(p[b, i], p[b, i + w]) for (f, _, _), p in zip(kinds, ps)),
            name=f"q_extrema_fold{w}"))

    for width in _fold_widths():
        parts = folded(parts, width)
    j = te.reduce_axis((0, FOLDED_LANES), "q_j")
    parts = listed(te.compute((B,), lambda b: extrema(tuple(p[b, j] for p in parts), axis=j),
                              name="q_extrema"))
    mn, mx = (None, parts[0]) if nonnegative else parts
    f32, f64 = (lambda v: tirx.const(v, FLOAT)), (lambda v: tirx.const(v, "float64"))
    if not scheme.asymmetric:
        top = f32(HYBRID_SYMMETRIC_MAX)

        def param(b, i):
            r = mx[b] if nonnegative else tirx.max(tirx.abs(mn[b]), tirx.abs(mx[b]))
            values = (r / top, top / r, f32(0))
            flat = (f32(1), f32(0), f32(0))  # an all-zero group: scale 1, every q 0
            return tirx.Select(r == f32(0), _pick(i, flat), _pick(i, values))

        return te.compute((B, PARAMS), param, name=PARAMS_STAGE)
    lo, hi = HYBRID_ASYMMETRIC_RANGE

    def param(b, i):
        rmin = f32(0) if nonnegative else tirx.min(f32(0), mn[b])
        rmax = tirx.max(f32(0), mx[b])
        s = (rmax - rmin).astype("float64") / f64(hi - lo)  # the difference in float32
        dmin, dmax = rmin.astype("float64"), rmax.astype("float64")
        from_min, from_max = f64(lo) - dmin / s, f64(hi) - dmax / s
        err_min = f64(abs(lo)) + tirx.abs(dmin / s)
        err_max = f64(abs(hi)) + tirx.abs(dmax / s)
        z = tirx.Select(err_min < err_max, from_min, from_max)
        z = tirx.Select(z <= f64(lo), f64(lo), tirx.Select(z >= f64(hi), f64(hi), _round(z)))
        scale = s.astype(FLOAT)
        values = (scale, f32(1) / scale, z.astype(FLOAT))
        flat = (f32(1), f32(1), f32(0))  # all zero: scale 1, zero point 0
        return tirx.Select(rmin == rmax, _pick(i, flat), _pick(i, values))

    return te.compute((B, PARAMS), param, name=PARAMS_STAGE)


def _minnum(a, b):
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(FLOAT, "llvm.minnum", a, b)


def _maxnum(a, b):
    from tvm import tirx

    return tirx.call_llvm_pure_intrin(FLOAT, "llvm.maxnum", a, b)


def _pick(i, values):
    """values[i] for the TIR index ``i`` (a params column)."""
    from tvm import tirx

    out = values[-1]
    for j in range(len(values) - 2, -1, -1):
        out = tirx.Select(i == j, values[j], out)
    return out


def quantize_te(data, params, scheme: HybridScheme):
    """``data_q`` int8: round(x * inverse) + zp of each element with its group's
    parameters, clamped (zp 0 and +-127 for a symmetric scheme).

    Two stages: ``q_rounded`` int32, the product rounded half away from zero and converted
    in one FCVTAS (C's ``round`` then the cast: the same integer), then ``data_q``, which
    adds the zero point and clamps in int16, where the clamp to [-128, 127] is the
    saturation of the narrowing to int8 (SQXTN). int16 holds every value here: |x *
    inverse| is at most 255 (the group's range over its scale), |zp| at most 128."""
    from tvm import te, tirx

    lo, hi = ((-HYBRID_SYMMETRIC_MAX, HYBRID_SYMMETRIC_MAX) if not scheme.asymmetric
              else HYBRID_ASYMMETRIC_RANGE)
    rounded = te.compute(
        data.shape, lambda b, *at: tirx.call_llvm_pure_intrin(
            "int32", "llvm.aarch64.neon.fcvtas", data[(b, *at)] * params[b, INVERSE]),
        name=ROUNDED_STAGE)

    def quantized(b, *at):
        r = rounded[(b, *at)].astype("int16")
        if scheme.asymmetric:  # added after the rounding, as an integer
            r = r + params[b, ZERO_POINT].astype("int32").astype("int16")
        return tirx.max(tirx.min(r, tirx.const(hi, "int16")),
                        tirx.const(lo, "int16")).astype("int8")

    return te.compute(data.shape, quantized, name=QUANTIZE_STAGE)


def _fold_widths():
    """The widths of the partial results' folds, REDUCE_LANES / 2 down to FOLDED_LANES."""
    width, widths = REDUCE_LANES // 2, []
    while width >= FOLDED_LANES:
        widths.append(width)
        width //= 2
    return widths


def params_func(groups: int, length: int, scheme: HybridScheme, *,
                nonnegative: bool = False, schedule=True):
    """The quantization parameters of ``groups`` float32 groups of ``length`` elements
    each as a PrimFunc (data [groups, length], q_params): the min and the max (the max
    alone for a ``nonnegative`` input, ``params_te``) a NEON vector of partial results at
    a time (one pass over the input), then a few scalars per group; the groups in
    parallel."""
    from tvm import s_tir, te

    data = te.placeholder((groups, length), FLOAT, "data")
    func = te.create_prim_func([data, params_te(data, scheme, nonnegative)])
    if not schedule:
        return func
    sch = s_tir.Schedule(func)
    # each group's partial results computed and folded inside the group's loop: one
    # group's worth of them at a time, in registers (all groups' would be a buffer)
    group = sch.get_loops(sch.get_sblock("q_extrema"))[0]
    # a fold's min (v0) and max (v1); the max's alone is one stage, without a suffix
    suffixes = ("",) if nonnegative else ("_v0", "_v1")
    stages = ["q_extrema_part"] + [f"q_extrema_fold{w}{v}" for w in _fold_widths()
                                   for v in suffixes]
    for stage in reversed(stages):
        sch.compute_at(sch.get_sblock(stage), group)
    if groups > 1:  # the groups in parallel, then their parameters (a loop LLVM vectorizes:
        # inside the groups' loop they cost bert_encoder_dynamic 27% more at one thread)
        sch.parallel(group)
        sch.parallel(sch.get_loops(sch.get_sblock(PARAMS_STAGE))[0])
    lane, *step = sch.get_loops(sch.get_sblock(stages[0]))[1:]  # (a step: no loop)
    if step:
        sch.reorder(step[0], lane)  # the steps outside: each one a vector of the lanes
    sch.vectorize(lane)
    for stage in stages[1:]:
        sch.vectorize(sch.get_loops(sch.get_sblock(stage))[-1])
    return sch.mod["main"]


def quantize_func(groups: int, length: int, scheme: HybridScheme, *, parallel: bool = True,
                  schedule=True):
    """The int8 input of ``groups`` float32 groups of ``length`` elements as a PrimFunc
    (data [groups, length], q_params, data_q [groups, length]), scheduled a NEON register
    of int8 results at a time, in parallel over them."""
    from tvm import s_tir, te

    data = te.placeholder((groups, length), FLOAT, "data")
    params = te.placeholder((groups, PARAMS), FLOAT, "q_params")
    func = te.create_prim_func([data, params, quantize_te(data, params, scheme)])
    if not schedule:
        return func
    sch = s_tir.Schedule(func)
    group, element = sch.get_loops(sch.get_sblock(QUANTIZE_STAGE))
    # a power of two of lanes (a whole register, or a part of one: LLVM widens those,
    # not a vector of 3 or 15 FCVTAS lanes), within a group: every lane of a vector reads
    # the same parameters (a vector across two groups' gathered them, and LLVM took two
    # minutes over one such kernel)
    lanes = math.gcd(length, QUANTIZE_LANES)
    steps, inner = sch.split(element, [None, lanes])
    sch.vectorize(inner)
    outer = sch.fuse(group, steps)
    # the rounded values of one register of results, a float32 register at a time (LLVM
    # cannot split FCVTAS over more than four lanes)
    rounded = sch.get_sblock(ROUNDED_STAGE)
    if lanes == 1:  # one value at a time: the rounding inside the loop
        sch.compute_inline(rounded)
    else:
        sch.compute_at(rounded, outer)
        steps, floats = sch.split(sch.get_loops(rounded)[-1],
                                  [None, math.gcd(lanes, FLOAT_LANES)])
        sch.vectorize(floats)
        sch.unroll(steps)
    if parallel:
        sch.parallel(outer)
    return sch.mod["main"]


def scaled(acc, q_scale, w_scale, bias, scheme: HybridScheme, act_range=None):
    """The float32 output of one int32 sum ``acc`` (the zero point's term already taken
    away), in the order ``scheme.epilogue`` names (module docstring), then the fused
    activation's clamp: ``act_range`` = (lo, hi) in float, either side None; None: none."""
    from tvm import tirx

    x = acc.astype(FLOAT)
    if scheme.epilogue == CHANNEL_FIRST:
        y = fence(fence(x * w_scale) * q_scale) + bias
    else:
        y = bias + fence(x * (q_scale * w_scale))
    return _clamp(y, act_range)


def _clamp(y, act_range):
    """``y`` clamped to ``act_range`` = (lo, hi) in float, either side None; None: ``y``."""
    from tvm import tirx

    lo, hi = act_range if act_range is not None else (None, None)
    if hi is not None:
        y = tirx.min(y, tirx.const(float(hi), FLOAT))
    if lo is not None:
        y = tirx.max(y, tirx.const(float(lo), FLOAT))
    return y


def hybrid_gemm_te(plan: GemmPlan, scheme: HybridScheme, *, act_range=None,
                   residual: bool = False, residual_act=None):
    """TE tensors of the hybrid layer's GEMM of ``plan`` (``gemm_plan.plan`` with an int8
    kernel): (data_q, q_params, B_packed, w_scale, colsum, bias, outputs...).

    Inputs: data_q int8 NHWC and q_params (``quantize_func``, ``params_func``), B_packed int8
    (``constants``), w_scale float32 [out_c] (the weight's scale per output channel,
    repeated for one scale), colsum int32 [out_c] (zeros unless ``scheme`` is asymmetric),
    bias float32 [out_c] (zeros for a layer without one). Outputs: float32, as
    ``gemm_compute.conv2d_gemm_te``'s (a row tail: two). ``act_range`` = (lo, hi) in float,
    either side None; None: no clamp. With ``residual``, a float32 input laid out as the
    output (after q_params) that each output adds after its activation, then clamps to
    ``residual_act``: a residual ADD and its fused activation, one IEEE addition as
    TFLite's."""
    from tvm import te, tirx

    s, G = plan.shape, plan.shape.groups
    _, nr, kr = plan.main.tile
    kb, nb = s.packed_k(kr, "int8") // kr, ceil_div(s.gemm_n, nr)
    data_q = te.placeholder((s.batch, s.in_h, s.in_w, s.in_c), "int8", QUANTIZE_STAGE)
    params = te.placeholder((s.batch, PARAMS), FLOAT, PARAMS_STAGE)
    b_packed = te.placeholder((G, nb, kb, nr, kr), "int8", "B_packed")
    w_scale = te.placeholder((s.out_c,), FLOAT, "w_scale")
    colsum = te.placeholder((s.out_c,), "int32", "colsum")
    bias = te.placeholder((s.out_c,), FLOAT, "bias")
    # a padded pixel holds the zero point: one per image, so one pad value for batch 1
    pad = tirx.const(0, "int8")
    if scheme.asymmetric and any(s.padding):
        if s.batch != 1:
            raise ValueError(f"{OP}: {s}: a padded asymmetric layer takes one image")
        pad = params[0, ZERO_POINT].astype("int8")
    pixels = s.out_h * s.out_w  # GEMM rows per quantization group

    added = (te.placeholder((s.gemm_m, G, s.gemm_n), FLOAT, "residual") if residual
             else None)

    def out_element(acc, m, g, c):
        b = m // pixels
        if scheme.asymmetric:
            acc = acc - params[b, ZERO_POINT].astype("int32") * colsum[c]
        y = scaled(acc, params[b, SCALE], w_scale[c], bias[c], scheme, act_range)
        if added is not None:
            y = _clamp(y + added[m, g, c % s.gemm_n], residual_act)  # c: g's n-th
        return y

    outputs = gemm_parts_te(plan, data_q, b_packed, pad, out_element)
    inputs = (data_q, params) if added is None else (data_q, params, added)
    return (*inputs, b_packed, w_scale, colsum, bias, *outputs)


def hybrid_gemm_func(plan: GemmPlan, scheme: HybridScheme, *, act_range=None,
                     residual: bool = False, residual_act=None):
    """The hybrid layer's GEMM as one TIR PrimFunc, unscheduled (``hybrid_gemm_te``)."""
    from tvm import te

    func = te.create_prim_func(list(hybrid_gemm_te(plan, scheme, act_range=act_range,
                                                   residual=residual,
                                                   residual_act=residual_act)))
    if plan.input_copy == BORDERED:  # read by flat offset, as conv2d_gemm_func does
        func = flatten_written(func, BORDERED)
    return func


def schedule_hybrid_gemm(func, plan: GemmPlan, target=None):
    """Schedule ``hybrid_gemm_func(plan, ...)`` as ``schedule_conv2d_gemm`` does: macro
    tiles, the epilogue where a tile is computed, the micro-kernel tensorized; the
    bordered copy's border is the zero point, a run-time value."""
    from .gemm_schedule import schedule_conv2d_gemm

    return schedule_conv2d_gemm(func, plan, target, border_at_run_time=True)


def constants(plan: GemmPlan, weight_hwio: np.ndarray, w_scale, bias, scheme: HybridScheme):
    """The layer's compile-time operands after the input, in the func's order: the weights
    packed for the plan's kernel, the weight scale per output channel, the weights' sums
    per output channel (zeros for a symmetric input: no zero point to cancel), the bias."""
    n = plan.shape.out_c
    colsum = (weight_hwio.astype(np.int64).reshape(-1, weight_hwio.shape[-1]).sum(axis=0)
              if scheme.asymmetric else np.zeros(n, np.int64))
    return [pack_weights(weight_hwio, plan.main.tile, plan.shape.groups),
            np.broadcast_to(np.asarray(w_scale, np.float32).reshape(-1), (n,)).copy(),
            colsum.astype(np.int32),
            np.zeros(n, np.float32) if bias is None else np.asarray(bias, np.float32)]


# ------------------------------------------------------------------ depthwise
# A depthwise layer (TFLite's DEPTHWISE_CONV_2D, or a CONV_2D of one input channel per
# group) has no K to reduce: it runs on ``depthwise.py``'s kernel, channels in the lanes,
# over the same int8 input (``params_func`` / ``quantize_func``, a group per image). Its
# accumulator starts at -zp[b] * w_sum[c] (w_sum: the channel's sum of taps) instead of the
# folded bias, a padded pixel holds zp[b] (TFLite leaves such taps out: the same sum),
# and ``scaled`` is the epilogue.
DEPTHWISE_OP = "depthwise_hybrid"


def depthwise_te(shape, scheme: HybridScheme, *, act_range=None, channel_block=None,
                 int16_pairs: bool = True, lane_dots: bool = False):
    """TE tensors of the hybrid depthwise layer of ``shape`` (``depthwise.DepthwiseShape``):
    (data_q, q_params, weight_packed, w_sum, w_scale, bias, output). data_q int8 NHWC and
    q_params as ``hybrid_gemm_te``'s (a group per image); weight_packed as
    ``depthwise.pack_weights`` lays it; w_sum int32, w_scale and bias float32 over the
    padded channels (``depthwise_constants``). Output float32 NHWC."""
    from tvm import te

    from . import depthwise as dw

    s = shape
    cb = channel_block or dw.default_channel_block(s)
    channels = dw.padded_channels(s, cb) * s.multiplier
    data_q = te.placeholder((s.batch, s.in_h, s.in_w, s.channels), "int8", QUANTIZE_STAGE)
    params = te.placeholder((s.batch, PARAMS), FLOAT, PARAMS_STAGE)
    weight = te.placeholder((s.kh, s.kw, s.multiplier, channels // s.multiplier), "int8",
                            "weight_packed")
    w_sum = te.placeholder((channels,), "int32", "w_sum")
    w_scale = te.placeholder((channels,), FLOAT, "w_scale")
    bias = te.placeholder((channels,), FLOAT, "bias")

    def zero_point(n):
        return params[n, ZERO_POINT]

    acc = dw.accumulate_te(s, data_q, weight,
                           lambda n, oc: -(zero_point(n).astype("int32") * w_sum[oc]),
                           lambda n: zero_point(n).astype("int8"), channel_block=cb,
                           int16_pairs=int16_pairs, lane_dots=lane_dots)
    mlt = s.multiplier

    def element(n, oh, ow, oc):
        total = acc[n, oh, ow, oc % mlt, oc // mlt]
        return scaled(total, params[n, SCALE], w_scale[oc], bias[oc], scheme, act_range)

    out = dw.output_te(s, cb, element)
    return data_q, params, weight, w_sum, w_scale, bias, out


def depthwise_func(shape, scheme: HybridScheme, **kwargs):
    """The hybrid depthwise layer as one TIR PrimFunc, unscheduled (``depthwise_te``);
    ``depthwise.schedule_depthwise`` schedules it."""
    from tvm import te

    return te.create_prim_func(list(depthwise_te(shape, scheme, **kwargs)))


def depthwise_constants(shape, weight, w_scale, bias, *, channel_block=None,
                        int16_pairs: bool = True):
    """The compile-time operands of ``depthwise_func`` after the input, in its order:
    the packed weights, each output channel's sum of taps, its weight scale and its bias
    (zeros without one), the last three padded to the kernel's channels with zeros.
    ``weight``: [kh, kw, 1, C * M] (HWIO of one input channel per group) or TFLite's
    [1, kh, kw, C * M]."""
    from . import depthwise as dw

    s = shape
    cb = channel_block or dw.default_channel_block(s)
    channels = dw.padded_channels(s, cb) * s.multiplier
    taps = np.asarray(weight).reshape(s.kh * s.kw, s.out_c)

    def padded(values, dtype):
        out = np.zeros(channels, dtype)
        out[:s.out_c] = np.broadcast_to(np.asarray(values, dtype).reshape(-1), (s.out_c,))
        return out

    return [dw.pack_weights(taps.reshape(s.kh, s.kw, s.out_c), s, cb, int16_pairs),
            padded(taps.astype(np.int64).sum(axis=0), np.int32),
            padded(w_scale, np.float32),
            padded(np.zeros(s.out_c) if bias is None else bias, np.float32)]


def kernel_name(kernel, scheme: HybridScheme) -> str:
    """The hybrid layer's name in the naming grammar: ``gemm_hybrid``, float32 in, int8
    weights, float32 out, the micro-kernel's block and isa, the input scheme
    (``gemm_hybrid_f32s8f32_8x12x4_dotprod_asym``)."""
    from tvm_armq.intrinsics import names

    parsed = names.NAME_RE.match(kernel.name)
    shape = tuple(int(v) for v in parsed["shape"].split("x")) if parsed["shape"] else ()
    return names.kernel_name(OP, (FLOAT, "int8", FLOAT), parsed["isa"], shape, scheme.inputs)
