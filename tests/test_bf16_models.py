"""Float TFLite models with the opt-in bf16 precision (``passes.bf16.float_to_bf16``).

On the i8mm device (the only ISA level with +bf16):

* the single float CONV_2D and FULLY_CONNECTED of the zoo are bit-exact against the NumPy
  model of the hardware (``reference.conv2d_bf16_nhwc``: operands rounded to bf16, bfmmla's
  round-to-odd sums, fp32 bias and clamp), with the weights, bias, geometry and fused
  activation read from the .tflite file itself, not from TVM's import of it; that model is
  in turn within the bf16 rounding bound of TFLite's own fp32 output;
* the float MobileNet v1 0.25 is close to TFLite's fp32 output (a bound derived from the
  net's measured sensitivity to bf16 rounding), and much closer to a NumPy emulation of
  the bf16 build; every CONV_2D / FULLY_CONNECTED of it is reported as a bf16 GEMM, every
  depthwise as fp32.

On neon and dotprod (no +bf16) asking for the pass is a ``MissingTargetFeature`` that names
the bfmmla kernel and the target.
"""

from __future__ import annotations

import numpy as np
import pytest

from tvm_armq import build, export, targets, zoo
from tvm_armq.frontend import importer
from tvm_armq.intrinsics import kernels
from tvm_armq.schedules import conv2d_bf16 as cb
from tvm_armq.schedules import reference as ref
from tvm_armq.schedules.window import same_padding
from tvm_armq.frontend.model import TFLiteModel
from tvm_armq.report import Fallback, Lowered

pytestmark = pytest.mark.device

LEVEL = "i8mm"  # the only ISA level whose target has +bf16
SINGLE = ("conv2d_3x3_f32", "fully_connected_f32")
NET = "mobilenet_v1_0.25_f32"
SEEDS = (0, 1)
# Single-layer inputs ~ N(0, INPUT_STD): wide enough that the outputs reach both sides of
# the fused ReLU / ReLU6 (the test checks that the clamps are really exercised).
INPUT_STD = 3.0
# bf16 keeps 8 significant bits: rounding an fp32 operand to it changes it by at most
# 2**-9 relatively (round to nearest), so a product of two rounded operands is off by at
# most 2**-8 + 2**-18 of |x * w|.
BF16_PRODUCT_REL = 2.0 ** -8 + 2.0 ** -18
FP32_EPS = 2.0 ** -23  # bfmmla's fp32 sums (round to odd): at most one ulp per addition
EMULATION_CLOSER = 3  # the net: how much closer to its bf16 emulation than to fp32 (test)


# ----------------------------------------------------------------------- helpers
def compile_bf16(model, level: str, report: list | None = None):
    """The Relax VM executable of a float model with every matched conv/dense in bf16."""
    return build.compile_tflite(model, level, precision="bf16", report=report)


class _TFLiteGraph:
    """A float .tflite model's operators, with their weights and options, read from the
    file with TFLite's own interpreter (not through TVM's import of it)."""

    def __init__(self, path):
        import tflite
        from ai_edge_litert.interpreter import Interpreter, OpResolverType

        data = path.read_bytes()
        self.it = Interpreter(model_content=data,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
        self.it.allocate_tensors()
        self.ops = self.it._get_ops_details()  # in execution order
        self.shapes = {d["index"]: tuple(d["shape"]) for d in self.it.get_tensor_details()}
        self.fb = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)

    def options(self, op, cls):
        import tflite

        opts = getattr(tflite, cls)()
        table = self.fb.Operators(int(op["index"])).BuiltinOptions()
        opts.Init(table.Bytes, table.Pos)
        return opts

    def window(self, op, opts, kernel_hw) -> dict:
        """strides, dilation and padding (top, left, bottom, right) of a CONV_2D /
        DEPTHWISE_CONV_2D, as TFLite computes them."""
        import tflite

        strides = (opts.StrideH(), opts.StrideW())
        dilation = (opts.DilationHFactor(), opts.DilationWFactor())
        in_hw = self.shapes[int(op["inputs"][0])][1:3]
        padding = (same_padding(in_hw, kernel_hw, strides, dilation)
                   if opts.Padding() == tflite.Padding.SAME else (0, 0, 0, 0))
        return dict(strides=strides, dilation=dilation, padding=padding)

    def gemm_layer(self, op) -> dict:
        """A CONV_2D / FULLY_CONNECTED for the NumPy model: HWIO weights, bias, geometry
        and the fused activation's range."""
        ins = [int(i) for i in op["inputs"]]
        weight = self.it.get_tensor(ins[1])  # CONV_2D: OHWI, FULLY_CONNECTED: [N, K]
        bias = (self.it.get_tensor(ins[2]) if len(ins) > 2 and ins[2] >= 0
                else np.zeros(weight.shape[0], np.float32))
        if op["op_name"] == "FULLY_CONNECTED":  # a 1x1 convolution of a 1x1 image
            opts = self.options(op, "FullyConnectedOptions")
            return dict(weight=np.ascontiguousarray(weight.T[None, None]), bias=bias,
                        act_range=_act_range(opts), dense=True)
        opts = self.options(op, "Conv2DOptions")
        return dict(weight=np.ascontiguousarray(weight.transpose(1, 2, 3, 0)), bias=bias,
                    act_range=_act_range(opts), dense=False,
                    **self.window(op, opts, weight.shape[1:3]))

    def only_gemm_layer(self) -> dict:
        (op,) = [o for o in self.ops if o["op_name"] in ("CONV_2D", "FULLY_CONNECTED")]
        return self.gemm_layer(op)

    def op_counts(self, *names) -> int:
        return sum(o["op_name"] in names for o in self.ops)


def _act_range(opts):
    import tflite

    act = tflite.ActivationFunctionType
    return {act.NONE: None, act.RELU: (0.0, None), act.RELU_N1_TO_1: (-1.0, 1.0),
            act.RELU6: (0.0, 6.0)}[opts.FusedActivationFunction()]




def _depthwise_fp32(g: _TFLiteGraph, op, x) -> np.ndarray:
    """A float DEPTHWISE_CONV_2D, summed in float64 and rounded once to fp32."""
    opts = g.options(op, "DepthwiseConv2DOptions")
    w, b = (g.it.get_tensor(int(i)) for i in op["inputs"][1:3])  # [1, kh, kw, C * M], [C * M]
    win = g.window(op, opts, w.shape[1:3])
    cols = ref.im2col_nhwc(x.astype(np.float64), *w.shape[1:3], **win)
    cols = np.repeat(cols, opts.DepthMultiplier(), axis=-1)  # output channel c * M + m
    y = (cols * w[0].astype(np.float64)).sum(axis=(3, 4)) + b
    return ref.clamp_f32(y.astype(np.float32), _act_range(opts))


def emulate_bf16_net(g: _TFLiteGraph, x: np.ndarray) -> np.ndarray:
    """The float net as the bf16 build computes it, in NumPy: every CONV_2D /
    FULLY_CONNECTED by the bit-exact bfmmla model, the other ops (which stay fp32) exactly
    rounded. Only the ops of the zoo's float MobileNet are known."""
    values = {int(g.it.get_input_details()[0]["index"]): x}
    for op in g.ops:
        a = values[int(op["inputs"][0])]
        name = op["op_name"]
        if name in ("CONV_2D", "FULLY_CONNECTED"):
            y = bf16_model(a, g.gemm_layer(op))
        elif name == "DEPTHWISE_CONV_2D":
            y = _depthwise_fp32(g, op, a)
        elif name == "MEAN":
            axes = tuple(int(v) for v in g.it.get_tensor(int(op["inputs"][1])))
            keep = g.options(op, "ReducerOptions").KeepDims()
            y = a.astype(np.float64).mean(axis=axes, keepdims=keep).astype(np.float32)
        elif name == "RESHAPE":
            y = a.reshape(g.shapes[int(op["outputs"][0])])
        else:
            raise NotImplementedError(f"emulate_bf16_net: no NumPy model of {name}")
        values[int(op["outputs"][0])] = y
    return values[int(g.it.get_output_details()[0]["index"])]


def _as_image(x, layer):
    return x.reshape(x.shape[0], 1, 1, -1) if layer["dense"] else x


def _geometry(layer) -> dict:
    return {k: layer[k] for k in ("strides", "dilation", "padding") if k in layer}


def bf16_model(x, layer) -> np.ndarray:
    """What the bfmmla kernel computes for the layer, bit for bit (NumPy)."""
    out = ref.conv2d_bf16_nhwc(_as_image(x, layer), layer["weight"], layer["bias"],
                               act_range=layer["act_range"], **_geometry(layer))
    return out.reshape(x.shape[0], -1) if layer["dense"] else out


def bf16_error_bound(x, layer) -> np.ndarray:
    """Per output: how far the bf16 layer can be from TFLite's fp32 one. With
    S = sum_k |x_k w_k|: the operands' rounding to bf16 moves the sum by at most
    BF16_PRODUCT_REL * S; bfmmla's and TFLite's fp32 sums each round at most K times, by
    at most FP32_EPS * S each time; each side's bias add rounds once more."""
    img, w = _as_image(x, layer), layer["weight"]
    cols = ref.im2col_nhwc(np.abs(img.astype(np.float64)), *w.shape[:2], **_geometry(layer))
    k = int(np.prod(w.shape[:3]))
    mags = (cols.reshape(-1, k) @ np.abs(w.astype(np.float64)).reshape(k, -1)).reshape(
        cols.shape[:3] + (w.shape[3],))
    bound = mags * (BF16_PRODUCT_REL + 2 * k * FP32_EPS) + \
        2 * FP32_EPS * (mags + np.abs(layer["bias"].astype(np.float64)))
    return bound.reshape(x.shape[0], -1) if layer["dense"] else bound


# ----------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def runs(devices, tmp_path_factory):
    """name -> (model, report, [(inputs, device outputs, TFLite outputs) per seed]): the
    two single layers and the net compiled once, loaded in one i8mm session."""
    tmp = tmp_path_factory.mktemp("bf16-models")
    built = {}
    for name in SINGLE + (NET,):
        model, report = TFLiteModel.load(zoo.build(name)), []
        ex = compile_bf16(model, LEVEL, report)
        if name == NET:
            asm = "".join(m.inspect_source("asm") for m in ex.mod.imports)  # the VM's kernels
            assert "\tbfmmla\t" in asm, "no bfmmla in the net's code"
        built[name] = (model, report, export.export_aarch64(ex, tmp / f"{name}.so"))
    session = devices.session(LEVEL)
    out = {}
    for name, (model, report, lib) in built.items():
        run = build.DeviceModel(session, lib)
        results = []
        for seed in SEEDS:
            if name == NET:
                x = model.random_inputs(seed=seed)
            else:
                (spec,), _ = model.signature()
                rng = np.random.default_rng(seed)
                x = [(rng.standard_normal(spec.shape) * INPUT_STD).astype(np.float32)]
            results.append((x, run(x), model.reference_outputs(x)))
        out[name] = (model, report, results)
    return out


# ----------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", SINGLE)
def test_single_layer_is_bit_exact(runs, name, report):
    """Device output == the NumPy bfmmla model, to the bit; and that model is within the
    bf16 rounding bound of TFLite's fp32 result (so the layer read from the file and the
    semantics are TFLite's)."""
    model, records, results = runs[name]
    assert [type(r) for r in records] == [Lowered]
    assert records[0].kernel == kernels.GEMM_BF16BF16F32_2X2X4_BF16
    layer = _TFLiteGraph(model.path).only_gemm_layer()
    for seed, ((x,), (got,), (tfl,)) in zip(SEEDS, results):
        expected = bf16_model(x, layer)
        assert got.shape == tfl.shape == expected.shape and got.dtype == np.float32
        np.testing.assert_array_equal(got, expected, err_msg=f"{name}, seed {seed}")
        lo, hi = layer["act_range"]
        assert (expected == lo).any() and (expected > lo).any(), "the ReLU is not exercised"
        if hi is not None:
            assert (expected == hi).any(), "the ReLU6 clamp is not exercised"
        err = np.abs(expected.astype(np.float64) - tfl)
        assert (err <= bf16_error_bound(x, layer)).all(), f"{name}: off TFLite's fp32 result"
        # ... and really bf16: where no clamp hides it, the fp32 result mostly differs.
        open_ = (tfl > lo) & (tfl < (hi if hi is not None else np.inf))
        assert (err[open_] > 0).mean() > 0.5
        report(f"bf16       {name:22s} {LEVEL:8s} seed {seed} bit-exact vs the bfmmla "
               f"model; max|diff| vs TFLite fp32 {err.max():.2e}")


def _rel(a, b) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def test_mobilenet_matches_the_bf16_model_and_tflite(runs, report):
    """MobileNet v1 0.25 in bf16 on the device, against TFLite's fp32 output and against the
    NumPy emulation of the bf16 build (``emulate_bf16_net``).

    TFLite fp32: relative L2 error of the logits at most sqrt(2 L) * s. s is measured: how
    far TFLite's own logits move when only the input image is rounded to bf16 (a 2**-9
    relative perturbation; this random-weight net amplifies it some 20-fold). The bf16
    build makes each of its L = 15 GEMM layers round two operands (input and weights),
    perturbations of that same relative size; the effects of independent random-sign
    roundings add in quadrature, and the first layer's, with the most layers after it, is
    amplified the most, so together they stay within sqrt(2 L) s.

    The emulation: the device must be at least EMULATION_CLOSER times closer to it than to
    TFLite. It cannot be bit-exact: the fp32 depthwise and mean layers add in TVM's order,
    the emulation exactly, and each one-ulp difference can tip the bf16 rounding of the
    next layer's input, which the net then amplifies (one-ulp noise on the depthwise
    outputs alone moves the emulated logits by ~1%). But a layer computing anything else
    than the bf16 model (a wrong window, weight or bias) moves the logits as far from the
    emulation as from TFLite.
    """
    model, _, results = runs[NET]
    g = _TFLiteGraph(model.path)
    layers = g.op_counts("CONV_2D", "FULLY_CONNECTED")
    for seed, ((x,), (got,), (tfl,)) in zip(SEEDS, results):
        emulated = emulate_bf16_net(g, x)
        to_emulation = _rel(got, emulated)
        (tfl_rounded_input,) = model.reference_outputs([cb.to_bf16(x).astype(np.float32)])
        s = _rel(tfl_rounded_input, tfl)
        to_tflite, bound = _rel(got, tfl), np.sqrt(2 * layers) * s
        report(f"bf16       {NET:22s} {LEVEL:8s} seed {seed} rel. L2 error vs the bf16 "
               f"model {to_emulation:.1e}, vs TFLite fp32 {to_tflite:.2e} (bound {bound:.2e})")
        assert to_emulation * EMULATION_CLOSER <= to_tflite, \
            f"seed {seed}: {to_emulation:.3e} off the bf16 model, {to_tflite:.3e} off TFLite"
        assert 0 < to_tflite <= bound, f"seed {seed}: {to_tflite:.3e} off TFLite fp32"


def test_every_conv_and_dense_of_the_net_is_bf16(runs):
    model, records, _ = runs[NET]
    g = _TFLiteGraph(model.path)
    lowered = [r for r in records if isinstance(r, Lowered)]
    fallbacks = [r for r in records if isinstance(r, Fallback)]
    assert len(lowered) == g.op_counts("CONV_2D", "FULLY_CONNECTED") > 10
    assert all(r.kernel == kernels.GEMM_BF16BF16F32_2X2X4_BF16 for r in lowered)
    assert len(fallbacks) == g.op_counts("DEPTHWISE_CONV_2D") > 10
    assert all(r.op == "depthwise_conv2d" for r in fallbacks)


@pytest.mark.parametrize("level", ["neon", "dotprod"])
def test_bf16_needs_the_bf16_extension(level):
    """No +bf16 below i8mm: compile_tflite refuses before any work, naming the feature, the
    target and the level to use; the pass itself, asked anyway, names the kernel too."""
    from tvm_armq.passes import bf16

    target = targets.resolve(level)
    model = zoo.build("conv2d_3x3_f32")
    with pytest.raises(build.MissingFeature) as err:
        build.compile_tflite(model, level, precision="bf16")
    msg = str(err.value)
    assert "+bf16" in msg and targets.describe(target) in msg and "--isa i8mm" in msg
    with target, pytest.raises(kernels.MissingTargetFeature) as err:
        bf16.float_to_bf16(target, report=[])(importer.import_tflite(model))
    msg = str(err.value)
    assert kernels.GEMM_BF16BF16F32_2X2X4_BF16 in msg and "+bf16" in msg
    assert str(targets.resolve(target)) in msg
