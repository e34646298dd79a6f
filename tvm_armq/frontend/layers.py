"""The quantization parameters of a TFLite convolution or dense layer, read from the file.

``read_layer(model)`` returns one ``QuantLayer`` for the single quantized CONV_2D,
DEPTHWISE_CONV_2D or FULLY_CONNECTED of a model: weights and int32 bias as stored,
scales and zero points, geometry, and the clamp range of the fused activation,
computed as TFLite computes it. Kernels are checked against TFLite by building them
from exactly these values.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..schedules.window import same_padding
from .model import TFLiteModel

# tflite.ActivationFunctionType and tflite.Padding values
ACT_NONE, ACT_RELU, ACT_RELU_N1_TO_1, ACT_RELU6 = 0, 1, 2, 3
_PADDING_SAME = 0
_OPTIONS = {"CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
            "FULLY_CONNECTED": "FullyConnectedOptions"}


@dataclasses.dataclass(frozen=True)
class QuantLayer:
    """One quantized layer. ``weight`` is in TFLite's layout: CONV_2D OHWI (I = in_c / groups),
    DEPTHWISE_CONV_2D [1, kh, kw, in_c * multiplier], FULLY_CONNECTED [N, K]."""

    op: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    weight: np.ndarray
    bias: np.ndarray  # int32, one per output channel (zeros if the model has none)
    in_scale: float
    in_zp: int
    w_scales: np.ndarray  # per output channel (per-tensor models: repeated)
    out_scale: float
    out_zp: int
    strides: tuple[int, int] = (1, 1)
    dilation: tuple[int, int] = (1, 1)
    padding: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right
    act_range: tuple[int, int] = (-128, 127)

    @property
    def groups(self) -> int:
        return self.input_shape[-1] // self.weight.shape[-1] if self.op == "CONV_2D" else 1

    def weight_hwio(self) -> np.ndarray:
        """CONV_2D weights as HWIO (``schedules.conv2d_gemm`` packs from this)."""
        if self.op == "FULLY_CONNECTED":
            return self.weight.T[None, None]
        if self.op != "CONV_2D":
            raise ValueError(f"{self.op} weights have no HWIO form")
        return np.ascontiguousarray(self.weight.transpose(1, 2, 3, 0))

    def real_scales(self) -> np.ndarray:
        """in_scale * w_scale / out_scale per output channel, as TFLite computes it (double)."""
        return self.in_scale * self.w_scales.astype(np.float64) / self.out_scale


def activation_range(act: int, out_scale: float, out_zp: int, dtype: str = "int8"):
    """TFLite's CalculateActivationRangeQuantized for a fused activation."""
    info = np.iinfo(dtype)

    def quantize(v: float) -> int:  # TfLiteRound: half away from zero, of a float32 quotient
        q = np.float32(v) / np.float32(out_scale)
        # + 0.5 in float64, exact: in float32 it rounds a quotient just below a half up
        return out_zp + int(np.sign(q) * np.floor(np.abs(np.float64(q)) + 0.5))

    lo, hi = int(info.min), int(info.max)
    if act == ACT_RELU:
        return max(lo, quantize(0.0)), hi
    if act == ACT_RELU6:
        return max(lo, quantize(0.0)), min(hi, quantize(6.0))
    if act == ACT_RELU_N1_TO_1:
        return max(lo, quantize(-1.0)), min(hi, quantize(1.0))
    if act == ACT_NONE:
        return lo, hi
    raise NotImplementedError(f"fused activation {act} has no quantized range in TFLite")


def read_layer(model) -> QuantLayer:
    """The one CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED of a single-op int8 model."""
    import tflite
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    m = TFLiteModel.load(model)
    it = Interpreter(model_content=m.data,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    ops = it._get_ops_details()
    layers = [o for o in ops if o["op_name"] in _OPTIONS]
    if len(layers) != 1:
        raise ValueError(f"{m.label}: expected one conv/dense layer, found "
                         f"{[o['op_name'] for o in ops]}")
    op = layers[0]
    name = op["op_name"]
    ins = [int(i) for i in op["inputs"]]
    i_in, i_w = ins[:2]
    i_b = ins[2] if len(ins) > 2 and ins[2] >= 0 else None
    i_out = int(op["outputs"][0])
    details = {d["index"]: d for d in it.get_tensor_details()}
    q = {i: details[i]["quantization_parameters"] for i in (i_in, i_w, i_out)}
    if q[i_w]["zero_points"].any():
        raise NotImplementedError(f"{m.label}: asymmetric weights are not supported")
    weight = it.get_tensor(i_w)
    n_out = weight.shape[0] if name != "DEPTHWISE_CONV_2D" else weight.shape[-1]
    w_scales = np.broadcast_to(q[i_w]["scales"].astype(np.float64), (n_out,)).copy()
    bias = it.get_tensor(i_b) if i_b is not None else np.zeros(n_out, np.int32)

    fb_op = m.flatbuffer().Subgraphs(0).Operators(int(op["index"]))
    opts = getattr(tflite, _OPTIONS[name])()
    opts.Init(fb_op.BuiltinOptions().Bytes, fb_op.BuiltinOptions().Pos)
    out_scale, out_zp = float(q[i_out]["scales"][0]), int(q[i_out]["zero_points"][0])
    geometry = {}
    if name != "FULLY_CONNECTED":
        strides = (opts.StrideH(), opts.StrideW())
        dilation = (opts.DilationHFactor(), opts.DilationWFactor())
        in_hw, k_hw = details[i_in]["shape"][1:3], weight.shape[1:3]
        pad = (same_padding(in_hw, k_hw, strides, dilation)
               if opts.Padding() == _PADDING_SAME else (0, 0, 0, 0))
        geometry = dict(strides=strides, dilation=dilation, padding=pad)
    return QuantLayer(
        name, tuple(int(s) for s in details[i_in]["shape"]),
        tuple(int(s) for s in details[i_out]["shape"]), weight, bias.astype(np.int32),
        float(q[i_in]["scales"][0]), int(q[i_in]["zero_points"][0]), w_scales, out_scale,
        out_zp, act_range=activation_range(opts.FusedActivationFunction(), out_scale, out_zp),
        **geometry)
