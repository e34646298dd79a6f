"""Dynamic-range ("hybrid") FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D and BATCH_MATMUL
with a constant operand (``schedules/hybrid.py``, ``passes/hybrid.py``): float32
activations and int8 weights, the input quantized at run time and multiplied on the
level's integer GEMM (a depthwise layer: the level's depthwise kernel).

1. Host: the NumPy model (``reference.hybrid_quantize`` / ``hybrid_scale``) equals TFLite's
   BUILTIN_REF on every single-op model below (both input schemes, one weight scale and
   one per channel, 2-D, 3-D and 4-D inputs, SAME / VALID / strided convolutions, depth
   multipliers, BATCH_MATMUL's adjoints and broadcast batch axes, fused activations, with
   and without a bias), on inputs with offsets (asymmetric zero points away from 0), wide
   and narrow ranges and an all-zero quantization group.
2. Device: each model compiled with its layers on hybrid kernels (``inspect``'s name
   ``gemm_hybrid_f32s8f32_..._<scheme>``, ``depthwise_hybrid_f32s8f32_...``), every output
   bit-exact with BUILTIN_REF and
   alive: each case at one level in turn in the fast tier, at every level in the
   exhaustive one.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from armq_checks import assert_exact, one_level_in_turn, tier
from tvm_armq.schedules import reference as ref

from tvm_armq.targets import LEVELS

pytestmark = pytest.mark.device

SEEDS = (0, 1)
ACT = {"none": (0, None), "relu": (1, (0.0, None)), "relu6": (3, (0.0, 6.0))}


@dataclasses.dataclass(frozen=True)
class Case:
    """One single-op hybrid model: FULLY_CONNECTED of ``in_shape`` (rows of its last axis);
    CONV_2D or DEPTHWISE_CONV_2D of an NHWC ``in_shape`` with a ``kernel`` x ``kernel``
    filter; BATCH_MATMUL of ``in_shape`` ([..., M, K] as the product reads it) by a constant
    of batch axes ``w_batch`` and ``out_c`` columns."""

    name: str
    op: str                  # "fc" | "conv" | "dw" | "bmm"
    in_shape: tuple
    out_c: int               # a depthwise layer's: channels x multiplier
    per_channel: bool        # a depthwise layer's scales are always per channel
    asymmetric: bool = True  # FULLY_CONNECTED's and BATCH_MATMUL's option; CONV_2D decides
                             # by its scales; DEPTHWISE_CONV_2D is always asymmetric
    act: str = "none"
    bias: bool = True
    keep_num_dims: bool = False
    kernel: int = 3
    stride: int = 1
    same: bool = True
    w_batch: tuple = ()      # BATCH_MATMUL: the constant's batch axes
    adjoint: bool = False    # BATCH_MATMUL: adj_x and adj_y (both operands stored swapped)
    act_in: str = "none"     # a float RELU / RELU6 op before the layer: its input is then
                             # known >= 0, and its quantization reduces the max alone


CASES = (
    Case("fc_asym_channel_relu", "fc", (4, 40), 24, True, act="relu"),
    Case("fc_sym_tensor_3d", "fc", (1, 16, 64), 32, False, asymmetric=False, bias=False,
         keep_num_dims=True),
    Case("fc_asym_tensor_relu6", "fc", (8, 33), 17, False, act="relu6"),
    Case("fc_sym_channel", "fc", (3, 64), 48, True, asymmetric=False),
    Case("fc_asym_odd_length", "fc", (3, 37), 9, True),  # 111 values: no vector of them
    Case("conv_3x3_same_channel_relu6", "conv", (1, 9, 9, 8), 16, True, act="relu6"),
    Case("conv_3x3_s2_valid_tensor", "conv", (1, 10, 10, 8), 12, False, stride=2,
         same=False),
    Case("conv_1x1_channel", "conv", (1, 6, 6, 16), 24, True, kernel=1),
    Case("conv_3x3_same_channel_relu_in", "conv", (1, 9, 9, 8), 16, True, act_in="relu"),
    Case("fc_sym_tensor_relu6_in", "fc", (3, 40), 16, False, asymmetric=False,
         act_in="relu6"),
    Case("dw_3x3_same_relu6", "dw", (1, 9, 9, 24), 24, True, act="relu6"),
    Case("dw_3x3_s2_valid_m2", "dw", (1, 10, 10, 12), 24, True, stride=2, same=False),
    Case("dw_5x5_same", "dw", (1, 8, 8, 16), 16, True, kernel=5),
    Case("bmm_asym_batched_broadcast", "bmm", (2, 1, 5, 40), 24, False, bias=False,
         w_batch=(3,)),
    Case("bmm_sym_channel_adjoint", "bmm", (2, 6, 40), 20, True, asymmetric=False, bias=False,
         adjoint=True),
)


def _weights(case: Case, rng):
    """(int8 weight as the product reads it, float32 scales per output channel, bias or
    None). The layout: FULLY_CONNECTED [N, K], CONV_2D OHWI, DEPTHWISE_CONV_2D
    [1, kh, kw, C * M], BATCH_MATMUL [*w_batch, K, N]."""
    n = case.out_c
    shape = {"fc": (n, case.in_shape[-1]),
             "conv": (n, case.kernel, case.kernel, case.in_shape[-1]),
             "dw": (1, case.kernel, case.kernel, n),
             "bmm": (*case.w_batch, case.in_shape[-1], n)}[case.op]
    w = rng.integers(-127, 127, shape, endpoint=True).astype(np.int8)
    scales = (rng.uniform(0.002, 0.02, n) if case.per_channel
              else np.full(n, 0.004)).astype(np.float32)
    bias = rng.normal(0, 0.5, n).astype(np.float32) if case.bias else None
    return w, scales, bias


def model_bytes(case: Case) -> bytes:
    import tflite

    from tvm_armq.frontend.writer import Operator, graph_model, options

    w, scales, bias = _weights(case, np.random.default_rng(len(case.name)))
    # per-channel scales run along the output channel's axis of the weight as stored
    axis = {"fc": 0, "conv": 0, "dw": 3,
            "bmm": len(case.w_batch) + (0 if case.adjoint else 1)}[case.op]
    q = ((scales, np.zeros(case.out_c, np.int64), axis) if case.per_channel
         else (float(scales[0]), 0))
    act_code = ACT[case.act][0]
    in_shape = case.in_shape
    if case.op == "bmm":
        code = tflite.BuiltinOperator.BATCH_MATMUL
        opts = options("BatchMatMulOptions", AdjX=case.adjoint, AdjY=case.adjoint,
                       AsymmetricQuantizeInputs=case.asymmetric)
        batch = np.broadcast_shapes(case.in_shape[:-2], case.w_batch)
        out_shape = (*batch, case.in_shape[-2], case.out_c)
        if case.adjoint:  # both operands stored with their last two axes swapped
            in_shape = (*in_shape[:-2], in_shape[-1], in_shape[-2])
            w = np.swapaxes(w, -1, -2)
    elif case.op == "fc":
        rows = int(np.prod(case.in_shape[:-1]))
        out_shape = ((*case.in_shape[:-1], case.out_c) if case.keep_num_dims
                     else (rows, case.out_c))
        code = tflite.BuiltinOperator.FULLY_CONNECTED
        opts = options("FullyConnectedOptions", FusedActivationFunction=act_code,
                       KeepNumDims=case.keep_num_dims,
                       AsymmetricQuantizeInputs=case.asymmetric)
    else:  # a convolution's window
        b, h, wd, c = case.in_shape
        size = [(-(-d // case.stride) if case.same else (d - case.kernel) // case.stride + 1)
                for d in (h, wd)]
        out_shape = (b, *size, case.out_c)
        window = dict(Padding=0 if case.same else 1, StrideW=case.stride,
                      StrideH=case.stride, FusedActivationFunction=act_code,
                      DilationWFactor=1, DilationHFactor=1)
        if case.op == "dw":
            code = tflite.BuiltinOperator.DEPTHWISE_CONV_2D
            opts = options("DepthwiseConv2DOptions", DepthMultiplier=case.out_c // c,
                           **window)
        else:
            code = tflite.BuiltinOperator.CONV_2D
            opts = options("Conv2DOptions", **window)
    tensors = [dict(shape=in_shape, dtype="float32"),
               dict(shape=w.shape, dtype="int8", q=q, data=np.ascontiguousarray(w)),
               dict(shape=out_shape, dtype="float32")]
    inputs = [0, 1] if case.op == "bmm" else [0, 1, -1]  # BATCH_MATMUL has no bias slot
    if bias is not None:
        tensors.append(dict(shape=(case.out_c,), dtype="float32", data=bias))
        inputs[2] = 3
    ops = []
    if case.act_in != "none":  # model input -> RELU / RELU6 -> the layer
        tensors.append(dict(shape=in_shape, dtype="float32"))
        inputs[0] = len(tensors) - 1
        act_op = {"relu": tflite.BuiltinOperator.RELU, "relu6": tflite.BuiltinOperator.RELU6}
        ops.append(Operator(act_op[case.act_in], (0,), (inputs[0],), None))
    ops.append(Operator(code, tuple(inputs), (2,), opts, version=3))
    return graph_model(tensors, ops, [0], [2])


def case_inputs(case: Case, seed: int) -> list[np.ndarray]:
    """A float32 input per quantization group with its own offset and spread (asymmetric
    zero points far from 0, narrow and wide ranges); a FULLY_CONNECTED's second row all
    zero (TFLite's scale-1 path), where it has more than one row."""
    rng = np.random.default_rng(100 + seed)
    x = rng.normal(0, 1, case.in_shape).astype(np.float32)
    rows = case.op in ("fc", "bmm")
    groups = x.reshape(-1, case.in_shape[-1]) if rows else x.reshape(x.shape[0], -1)
    for g in range(groups.shape[0]):
        groups[g] = groups[g] * rng.uniform(0.05, 8) + rng.uniform(-3, 3)
    if rows and groups.shape[0] > 1:
        groups[1] = 0
    if case.op == "bmm" and case.adjoint:  # as the model stores it
        x = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    return [x]


def reference_outputs(case: Case, x: np.ndarray) -> np.ndarray:
    """The layer by ``reference.hybrid_*``: quantize each group, accumulate (q - zp) * w in
    int32 (a padded pixel holds zp), scale in TFLite's order."""
    w, scales, bias = _weights(case, np.random.default_rng(len(case.name)))
    act = ACT[case.act][1]
    if case.act_in != "none":
        x = np.clip(x, 0, ACT[case.act_in][1][1])
    zero_bias = np.zeros(case.out_c, np.float32)
    if case.op == "bmm":  # each row of x on its own; the product per broadcast batch index
        if case.adjoint:
            x = np.swapaxes(x, -1, -2)
        k = case.in_shape[-1]
        q, s, zp = ref.hybrid_quantize(x.reshape(-1, k), symmetric=not case.asymmetric)
        q = (q.astype(np.int64) - zp[:, None]).reshape(x.shape)
        acc = np.matmul(q, w.astype(np.int64))  # broadcasts the batch axes as TFLite does
        s = np.broadcast_to(s.reshape(x.shape[:-1]), acc.shape[:-1]).reshape(-1)
        out = ref.hybrid_scale(acc.reshape(-1, 1, case.out_c), s, scales, zero_bias,
                               channel_first=False, act_range=act)
        return out.reshape(acc.shape)
    if case.op == "dw":  # the image quantized asymmetrically, padding left out
        b = x.shape[0]
        q, s, zp = ref.hybrid_quantize(x.reshape(b, -1), symmetric=False)
        pads = _same_pads(case, x) if case.same else (0, 0, 0, 0)
        acc = np.stack([ref.depthwise_conv2d_nhwc(
            q.reshape(x.shape)[i:i + 1], w, np.zeros(case.out_c, np.int32), in_zp=int(zp[i]),
            multiplier=case.out_c // x.shape[-1], strides=(case.stride,) * 2, padding=pads)
            for i in range(b)])
        out = ref.hybrid_scale(acc.reshape(b, -1, case.out_c), s, scales,
                               zero_bias if bias is None else bias, channel_first=False,
                               act_range=act)
        return out.reshape(b, *acc.shape[2:4], case.out_c)
    if case.op == "fc":
        k = case.in_shape[-1]
        q, s, zp = ref.hybrid_quantize(x.reshape(-1, k), symmetric=not case.asymmetric)
        acc = (q.astype(np.int64) - zp[:, None]) @ w.T.astype(np.int64)
        out = ref.hybrid_scale(acc[:, None, :], s, scales, zero_bias if bias is None else bias,
                               channel_first=False, act_range=act)
        return out.reshape(-1, case.out_c)
    b = x.shape[0]
    per_channel = case.per_channel
    q, s, zp = ref.hybrid_quantize(x.reshape(b, -1), symmetric=not per_channel)
    q = q.reshape(x.shape)
    pads = _same_pads(case, x) if case.same else (0, 0, 0, 0)
    accs = [ref.conv2d_nhwc(q[i:i + 1], w.transpose(1, 2, 3, 0),
                            np.zeros(case.out_c, np.int32), in_zp=int(zp[i]),
                            strides=(case.stride, case.stride), padding=pads)
            for i in range(b)]
    acc = np.stack([a.reshape(-1, case.out_c) for a in accs])
    out = ref.hybrid_scale(acc, s, scales, zero_bias if bias is None else bias,
                           channel_first=per_channel, act_range=act)
    return out.reshape(b, *accs[0].shape[1:3], case.out_c)


def _same_pads(case: Case, x) -> tuple:
    """(top, left, bottom, right) of TFLite's SAME padding of the case's window."""
    from tvm_armq.frontend.converters import same_padding

    (pt, pb), (pl, pr) = (same_padding(d, case.kernel, case.stride, 1) for d in x.shape[1:3])
    return pt, pl, pb, pr


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> TFLiteModel of each case."""
    from tvm_armq.frontend.model import TFLiteModel

    folder = tmp_path_factory.mktemp("hybrid")
    out = {}
    for case in CASES:
        path = folder / f"{case.name}.tflite"
        path.write_bytes(model_bytes(case))
        out[case.name] = TFLiteModel.load(path)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_reference_is_tflites(case, models):
    """The NumPy model equals TFLite's reference kernels, float for float."""
    model = models[case.name]
    for seed in SEEDS:
        x = case_inputs(case, seed)
        expected = model.reference_outputs(x)
        got = reference_outputs(case, x[0]).reshape(expected[0].shape)
        assert_exact([got], expected, f"{case.name} seed {seed}: reference")


@pytest.mark.parametrize("name,nonnegative", [("conv_3x3_same_channel_relu_in", True),
                                              ("fc_sym_tensor_relu6_in", True),
                                              ("conv_3x3_same_channel_relu6", False),
                                              ("fc_sym_channel", False)])
def test_a_relu_output_is_quantized_from_its_max(name, nonnegative, models):
    """An input that is a RELU's or RELU6's output (>= 0) is quantized with its max alone
    (the ``hybrid_params_max`` kernel: its min is 0 for either scheme's parameters); any
    other input (here the model's own, before a layer that has a fused RELU6 of its
    output and before one without) with its min and max. The device tests run both kinds
    bit-exact."""
    from tvm_armq import build, targets
    from tvm_armq.frontend import importer

    mod = build.lower(importer.import_tflite(models[name]), targets.resolve("neon"))
    params = sorted(gv.name_hint for gv, _ in mod.functions_items()
                    if gv.name_hint.startswith("tvm_armq_hybrid_params"))
    assert params == ["tvm_armq_hybrid_params_max" if nonnegative else
                      "tvm_armq_hybrid_params"], params


def test_batch_matmul_tflite_does_not_multiply_is_refused(tmp_path):
    """A hybrid BATCH_MATMUL whose input has two batch axes above 1: TFLite's kernel reads
    the row scales at the sum of the batch indices, so its output is not the rows' product
    (checked: should TFLite change, this test says so), and the importer refuses the model
    naming the operator and what to do, before TVM's frontend."""
    from tvm_armq.frontend.importer import UnsupportedModel, import_tflite
    from tvm_armq.frontend.model import TFLiteModel

    case = Case("bmm_two_batch_axes", "bmm", (2, 3, 5, 40), 24, False, bias=False)
    path = tmp_path / "bmm.tflite"
    path.write_bytes(model_bytes(case))
    model = TFLiteModel.load(path)
    x = case_inputs(case, 0)
    assert not np.array_equal(model.reference_outputs(x)[0], reference_outputs(case, x[0]))
    with pytest.raises(UnsupportedModel, match=r"operator 0 \(BATCH_MATMUL\).*two batch axes"):
        import_tflite(model)


def _device_params():
    params = []
    for i, case in enumerate(CASES):
        for level in LEVELS:
            params.append(tier(case, level, id=f"{case.name}-{level}",
                               fast=level == one_level_in_turn(i)))
    return params


# Compiled for one thread, each kernel's loops are serial and nothing but a call separates
# the quantize kernel's writes from the GEMM's reads (call_sequence.on_cpu says why that call
# must stay): one case of each kernel family that runs a quantize kernel first, per level.
SERIAL_CASES = ("fc_sym_channel", "conv_3x3_s2_valid_tensor")


@pytest.mark.device
@pytest.mark.parametrize("level", LEVELS)
def test_hybrid_layers_compiled_for_one_thread(level, models, compiled_models, tmp_path):
    """``compile_tflite(..., threads=1)`` (serial loops, as ``--threads 1`` and the C library
    build them): bit-exact with TFLite. LLVM once dropped the int8 input's stores here."""
    from tvm_armq import build, export

    for name in SERIAL_CASES:
        case = next(c for c in CASES if c.name == name)
        lib = export.export_aarch64(build.compile_tflite(models[name], level, threads=1),
                                    tmp_path / f"{name}.so")
        run = build.DeviceModel(compiled_models.session(level), lib)
        for seed in SEEDS:
            x = case_inputs(case, seed)
            assert_exact(run(x), models[name].reference_outputs(x),
                         f"{name} at {level} on one thread, seed {seed}")


@pytest.mark.parametrize("case,level", _device_params())
def test_hybrid_layer_on_device(case, level, models, compiled_models):
    """Compiled with the layer on a hybrid kernel of the level, bit-exact with TFLite."""
    from tvm_armq.schedules import hybrid

    from tvm_armq.report import Lowered

    model = models[case.name]
    report, runs = compiled_models(level, case.name, model, SEEDS,
                                   make_inputs=lambda seed: case_inputs(case, seed))
    layers = int(np.prod(np.broadcast_shapes(case.in_shape[:-2], case.w_batch))) \
        if case.w_batch else 1  # a BATCH_MATMUL: a layer per weight matrix it applies
    assert len(report) == layers and all(isinstance(r, Lowered) for r in report), report
    for record in report:
        if case.op == "dw":
            assert record.kernel.startswith("depthwise_hybrid_f32s8f32_"), record.kernel
            continue
        asymmetric = case.asymmetric if case.op in ("fc", "bmm") else case.per_channel
        scheme = hybrid.ASYMMETRIC if asymmetric else hybrid.SYMMETRIC
        assert record.kernel.startswith("gemm_hybrid_f32s8f32_") and \
            record.kernel.endswith(f"_{scheme}"), record.kernel
    assert len(runs) == len(SEEDS)
    for seed, (got, expected) in zip(SEEDS, runs):
        assert_exact(got, expected, f"{case.name} at {level}, seed {seed}")


# ------------------------------------------------------------------ ties
# Identity weights (scale 1): the output is (q - zp) per input element, so TFLite's rounding
# of each tie shows. Asymmetric rows of range 255 have scale 1 (x / scale = x) and zero
# point -28 (rmin -100) or -128 (no negative value); symmetric rows of max 127 too.
TIE_ROWS = {True: [[-100, 155, -2.5, 2.5, -3.5, 0.5], [255, 214.5, 41.5, 0.5, 1.5, 128.5]],
            False: [[127, 86.5, -86.5, 0.5, 1.5, -2.5], [-127, 3.5, -0.5, 126.5, -1.5, 0]]}


def _tie_model(asymmetric: bool) -> bytes:
    import tflite

    from tvm_armq.frontend.writer import Operator, graph_model, options

    n = len(TIE_ROWS[asymmetric][0])
    tensors = [dict(shape=(2, n), dtype="float32"),
               dict(shape=(n, n), dtype="int8", q=(1.0, 0), data=np.eye(n, dtype=np.int8)),
               dict(shape=(2, n), dtype="float32")]
    opts = options("FullyConnectedOptions", AsymmetricQuantizeInputs=asymmetric)
    return graph_model(tensors, [Operator(tflite.BuiltinOperator.FULLY_CONNECTED, (0, 1, -1),
                                          (2,), opts, 9)], [0], [2])


@pytest.mark.parametrize("asymmetric", [tier(True, id="asym", fast=True),
                                        tier(False, id="sym", fast=False)])
def test_ties_round_as_tflite(asymmetric, compiled_models, tmp_path):
    """x / scale on a tie (.5): the symmetric scheme rounds it half away from zero, the
    asymmetric one too but before adding the zero point (-2.5 with zp -28: -31, not -30),
    on the host model and on the device (one level per scheme: the quantization is the
    same code at every level)."""
    from tvm_armq.frontend.model import TFLiteModel

    path = tmp_path / "ties.tflite"
    path.write_bytes(_tie_model(asymmetric))
    model = TFLiteModel.load(path)
    x = np.array(TIE_ROWS[asymmetric], np.float32)
    expected = model.reference_outputs([x])
    q, scale, zp = ref.hybrid_quantize(x, symmetric=not asymmetric)
    assert (scale == 1).all()
    assert_exact([(q - zp[:, None]).astype(np.float32)], expected, "host model on ties")
    level = "neon" if asymmetric else "dotprod"
    _, runs = compiled_models(level, f"ties_{asymmetric}", model, (0,),
                              make_inputs=lambda _: [x])
    assert_exact(runs[0][0], expected, f"{level} on ties")


# ------------------------------------------------------------------ residual ADD
def _residual_model(same: bool) -> bytes:
    """x -> hybrid CONV_2D 3x3 (per-channel scales, bias, no activation) -> ADD(conv, r)
    with a fused RELU: a residual block's end; r is the model's second input."""
    import tflite

    from tvm_armq.frontend.writer import Operator, graph_model, options

    rng = np.random.default_rng(7)
    c = 16
    w = rng.integers(-127, 127, (c, 3, 3, c), endpoint=True).astype(np.int8)
    scales = rng.uniform(0.002, 0.02, c).astype(np.float32)
    tensors = [dict(shape=(1, 8, 8, c), dtype="float32"),
               dict(shape=w.shape, dtype="int8", q=(scales, np.zeros(c, np.int64), 0), data=w),
               dict(shape=(c,), dtype="float32", data=rng.normal(0, 0.5, c).astype(np.float32)),
               dict(shape=(1, 8, 8, c), dtype="float32"),
               dict(shape=(1, 8, 8, c) if same else (1, 1, 1, c), dtype="float32"),
               dict(shape=(1, 8, 8, c), dtype="float32")]
    conv = Operator(tflite.BuiltinOperator.CONV_2D, (0, 1, 2), (3,), options(
        "Conv2DOptions", Padding=0, StrideW=1, StrideH=1, DilationWFactor=1,
        DilationHFactor=1), version=3)
    add = Operator(tflite.BuiltinOperator.ADD, (3, 4), (5,),
                   options("AddOptions", FusedActivationFunction=1))
    return graph_model(tensors, [conv, add], [0, 4], [5])


@pytest.mark.parametrize("level", [tier(lvl, id=lvl, fast=lvl == "neon") for lvl in LEVELS])
def test_residual_add_runs_in_the_hybrid_epilogue(level, compiled_models, tmp_path):
    """A float ADD (and its RELU) of a hybrid layer's output and a tensor of its shape is
    the layer's epilogue (no float add left after the pass; a broadcast one stays an
    elementwise kernel), and the result is TFLite's to the bit (one IEEE addition as its
    ADD, the RELU after it)."""
    import tvm

    from tvm_armq import build, targets
    from tvm_armq.frontend import importer
    from tvm_armq.frontend.model import TFLiteModel

    def float_adds(model_bytes_):
        path = tmp_path / "m.tflite"
        path.write_bytes(model_bytes_)
        mod = build.lower(importer.import_tflite(TFLiteModel.load(path)),
                          targets.resolve(level))
        found = []
        tvm.relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if (
            isinstance(e, tvm.relax.Call) and getattr(e.op, "name", "") == "relax.add")
            else None)
        calls = [gv.name_hint for gv, _ in mod.functions_items()]
        return found, calls

    adds, calls = float_adds(_residual_model(same=True))
    assert not adds and not any(c.startswith("tvm_armq_float_elementwise") for c in calls), \
        calls
    _, calls = float_adds(_residual_model(same=False))  # broadcast: not the layer's
    assert any(c.startswith("tvm_armq_float_elementwise") for c in calls), calls

    def inputs(seed):
        rng = np.random.default_rng(seed)
        return [(rng.normal(0, 2, (1, 8, 8, 16)) + 1).astype(np.float32),
                rng.normal(0, 1, (1, 8, 8, 16)).astype(np.float32)]

    report, runs = compiled_models(level, "residual", _residual_model(same=True), SEEDS,
                                   make_inputs=inputs)
    assert [r.op for r in report] == ["conv2d_hybrid"], report
    for seed, (got, expected) in zip(SEEDS, runs):
        assert_exact(got, expected, f"residual at {level}, seed {seed}")


# ------------------------------------------------------------------ dynamic-range nets
def _net_params():
    from tvm_armq import zoo

    return [tier(name, level, id=f"{name}-{level}", fast=level == one_level_in_turn(i))
            for i, name in enumerate(zoo.dynamic_names()) for level in LEVELS]


@pytest.mark.parametrize("name,level", _net_params())
def test_dynamic_range_net(name, level, compiled_models):
    """A zoo net converted with dynamic-range quantization: every hybrid layer on a hybrid
    kernel (none left float), every output alive and within the stated float tolerance of
    TFLite's (``report.FLOAT_RELATIVE_TOLERANCE`` of its largest magnitude: the float layers
    between the hybrid ones are TVM's code; the hybrid layers alone are exact, above)."""
    from armq_checks import assert_within_float_tolerance

    from tvm_armq import zoo
    from tvm_armq.report import Lowered

    report, runs = compiled_models(level, name, zoo.build(name), (0,))
    assert report and all(isinstance(r, Lowered) and r.kernel.startswith("gemm_hybrid_")
                          for r in report), [str(r) for r in report]
    (got, expected), = runs
    assert_within_float_tolerance(got, expected, f"{name} at {level}")


@pytest.mark.parametrize("level", [tier(lvl, id=lvl, fast=lvl == "dotprod") for lvl in LEVELS])
def test_portable_library_runs_each_levels_hybrid_kernels(level, compiled_models, tmp_path):
    """One portable library of a dynamic-range net: every hybrid layer carries a kernel per
    level, and on each level's device it chooses that level and computes the model within
    the stated tolerance (its hybrid layers: the same kernels as a single-level build)."""
    from armq_checks import assert_within_float_tolerance

    from tvm_armq import build, export, targets, zoo
    from tvm_armq.frontend.model import TFLiteModel
    from tvm_armq.report import Lowered

    model, report = TFLiteModel.load(zoo.build("resnet_block_dynamic")), []
    lib = export.export_aarch64(build.compile_tflite(model, targets.PORTABLE, report=report),
                                tmp_path / "portable.so")
    assert report and all(isinstance(r, Lowered) and len(r.variants) == len(LEVELS)
                          for r in report), [str(r) for r in report]
    dm = build.DeviceModel(compiled_models.session(level), lib)  # the module's session
    assert dm.selected_level() == level
    inputs = model.random_inputs(2)
    assert_within_float_tolerance(dm(inputs), model.reference_outputs(inputs),
                                  f"portable on {level}")
