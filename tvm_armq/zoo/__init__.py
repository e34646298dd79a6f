"""Deterministic zoo of small int8 TFLite models used to exercise the TVM flow.

What models exist
-----------------
Single-op models (one TFLite operator each, full-integer int8, batch 1):

  conv2d_1x1        CONV_2D 1x1, 1x16x16x8 -> 16 ch, bias, fused ReLU
  conv2d_3x3        CONV_2D 3x3 SAME, 1x16x16x8 -> 16 ch, bias, fused ReLU
  conv2d_3x3_s2     CONV_2D 3x3 SAME stride 2, 1x16x16x8 -> 1x8x8x16, bias, no activation
  conv2d_3x3_d2     CONV_2D 3x3 SAME dilation 2, 1x16x16x8 -> 16 ch, bias, fused ReLU6
  conv2d_grouped    CONV_2D 3x3 SAME with groups=2: the filter is 16x3x3x4 while the
                    input has 8 channels (TFLite expresses grouping only through that
                    shape mismatch; there is no "groups" attribute), bias, fused ReLU
  depthwise_3x3     DEPTHWISE_CONV_2D 3x3 SAME, 1x16x16x16, multiplier 1, bias, fused ReLU
  depthwise_3x3_s2  DEPTHWISE_CONV_2D 3x3 SAME stride 2, 1x16x16x16 -> 1x8x8x16, fused ReLU6
  fully_connected   FULLY_CONNECTED 1x256 -> 1x16, bias, fused ReLU
  add               ADD of two 1x16x16x8 inputs calibrated on different ranges (so the
                    two operand scales differ), fused ReLU
  avg_pool          AVERAGE_POOL_2D 3x3 stride 2 SAME (edge windows average fewer pixels)
  max_pool          MAX_POOL_2D 2x2 stride 2 VALID
  concat            CONCATENATION on channels of two 1x16x16x8 inputs; the converter
                    gives both inputs and the output one shared scale/zero point
                    (int8 CONCATENATION requires it), so no requantize op appears
  mean              MEAN over H and W (Keras GlobalAveragePooling2D), 1x16x16x8 -> 1x8
  pad               PAD with asymmetric zero padding ((1,2),(2,1)) on H, W
  mul               MUL of two 1x16x16x8 inputs calibrated on different ranges (three
                    different scales: both operands and the output), no activation
  softmax           SOFTMAX over the 16 channels of a 1x8x8x16 input calibrated on
                    [-4, 4], so that the probabilities spread over many output steps
                    (TFLite fixes the output quantization at 1/256, zero point -128;
                    a wider input range piles more of them on -128)
  concat_requant    CONCATENATION on channels of two 1x16x16x8 inputs calibrated on
                    different ranges, converted by TFLite's older calibration quantizer
                    (``legacy_quantizer``): it gives the output the union of the ranges
                    and puts a standalone int8 -> int8 QUANTIZE (a requantization) in
                    front of the input whose scale differs, where the default converter
                    gives all three tensors one scale (``concat``).  An int8
                    CONCATENATION itself cannot requantize: TFLite's Prepare refuses
                    inputs whose scale differs from the output's.
  logistic          LOGISTIC (sigmoid) on 1x16x16x8, input calibrated on [-4, 4] (an
                    8-bit table of TFLite's arithmetic in tvm_armq)
  sub               SUB of two 1x16x16x8 inputs calibrated on different ranges
  resize_bilinear   RESIZE_BILINEAR (Keras UpSampling2D, bilinear, half-pixel centres)
                    1x8x8x8 -> 1x16x16x8
  log_softmax       LOG_SOFTMAX over the 16 channels of a 1x8x8x16 input calibrated on
                    [-4, 4]: tvm_armq has no integer kernel for it yet, so it tests the
                    float fallback (dequantize -> log_softmax -> quantize)
  batch_matmul      BATCH_MATMUL of two int8 inputs, (1, 2, 16, 24) x (1, 2, 24, 20)
  batch_matmul_adj  BATCH_MATMUL with adj_y, (1, 2, 17, 24) x (1, 1, 20, 24)^T: the
                    right operand's one head broadcast to both
  gelu, gelu_tanh   GELU (erf form; tanh form) on 1x16x16x8 calibrated on [-4, 4]
  fully_connected_3d  FULLY_CONNECTED on a 1x16x32 sequence (keep_num_dims) -> 1x16x24
  (``zoo.transformers`` builds these and the attention-era nets below)

Nets (float Keras graph -> int8 TFLite; no softmax at the end, see below):

  mobilenet_v1_0.25  tf.keras.applications.MobileNet, alpha 0.25, 1x128x128x3
  mobilenet_v1_1.0   tf.keras.applications.MobileNet, alpha 1.0, 1x224x224x3
  mobilenet_v2_1.0   tf.keras.applications.MobileNetV2, alpha 1.0, 1x224x224x3
  mobilenet_v3_small tf.keras.applications.MobileNetV3Small, alpha 0.75, 1x96x96x3
                     (HARD_SWISH, squeeze-excite blocks with SHAPE / STRIDED_SLICE /
                     PACK / RESHAPE and MUL)
  efficientnet_b1    tf.keras.applications.EfficientNetB1, 1x64x64x3 (swish as LOGISTIC
                     and MUL, squeeze-excite blocks, an input Normalization layer)
  densenet121        tf.keras.applications.DenseNet121, 1x64x64x3 (the batch-norm in
                     front of each convolution is a per-channel MUL and ADD)
  resnet_block       small ResNet-style net on 1x32x32x3: conv stem, three residual
                     blocks (one strided with a 1x1 projection), global average pool,
                     dense 10
  inception_block    small Inception-style net on 1x24x24x3: conv stem, one block of
                     four branches (1x1; 1x1 -> 1x7 -> 7x1; 1x1 -> 3x3; average pool ->
                     1x1) joined by CONCATENATION, strided conv, global average pool,
                     dense 10
  ds_cnn             DS-CNN keyword spotter on 1x49x10x1 (49 frames of 10 MFCCs): 10x4
                     stride-2 conv stem of 64 ch, four depthwise-separable blocks (3x3
                     depthwise, 1x1 conv, each with BN and ReLU), global average pool,
                     dense 12
  ssd_head           SSD-style detector on 1x48x48x3: four stride-2 conv stages; on the
                     last three maps (12x12, 6x6, 3x3) a 3x3 box conv (4 per anchor) and
                     a 3x3 class conv (6 classes per anchor), 3 anchors, RESHAPE to
                     (1, cells * anchors, 4 or 6), CONCATENATION across scales, LOGISTIC
                     on the scores; two outputs, scores (1, 567, 6) and boxes (1, 567, 4)
  two_in_two_out     two inputs, a 1x16 vector and a 1x24x24x3 image (TFLite's input
                     order), two outputs, a 1x6x6x8 map and 10 logits: strided convs on
                     the image, a dense layer on the vector, ADD and CONCATENATION of
                     the pooled image and the vector features, a dense layer, a 1x1 conv
  xception           tf.keras.applications.Xception, 1x71x71x3 (the smallest input it
                     takes; separable convs, residual ADDs, max pools)
  densenet169        tf.keras.applications.DenseNet169, 1x64x64x3 (as densenet121, with
                     82 dense layers)
  unet               small U-Net segmenter on 1x32x32x3: conv stages down to 8x8, up by
                     a stride-2 TRANSPOSE_CONV (ReLU) and a bilinear RESIZE_BILINEAR, each
                     CONCATENATEd with the encoder's map of its size, 4 logits per pixel
  inception_v3       tf.keras.applications.InceptionV3, 1x299x299x3 (its full size)
  resnet50           tf.keras.applications.ResNet50, 1x224x224x3 (its full size): 1x1 and
                     3x3 bottlenecks, a 7x7 stride-2 stem, residual ADDs
  layer_norm         one Keras LayerNormalization over a 1x16x32 sequence: the converter
                     writes it as thirteen ops (MEAN, a DEQUANTIZE -> NEG -> QUANTIZE
                     float island, SQUARED_DIFFERENCE, ADD of epsilon, RSQRT, MULs, ADDs)
  dense_4d_shape_chain  Dense layers on a 1x8x8x16 image whose batch the Keras model
                     leaves open: the converter computes each reshape's target in int32
                     ops (SHAPE, GATHER, REDUCE_PROD, CONCATENATION, PACK), which the
                     frontend folds to static shapes
  vit                ViT on 1x32x32x3 in 4x4 patches: class token, position embedding,
                     two pre-norm encoder blocks (width 64, 4 heads, GELU MLP 128), 10
                     logits from the class token
  bert_encoder       BERT-style encoder over 1x32x64 token embeddings: position
                     embedding, two post-norm blocks (4 heads, tanh-GELU MLP 128); two
                     outputs, the sequence and 4 logits of a tanh pooler
  mobilevit          MobileViT-style on 1x32x32x3: conv stem, an inverted residual, a
                     MobileViT block (3x3 and 1x1 convs, unfold into 2x2 patches, an
                     attention block, fold, concat, 3x3 conv), 10 logits
  convnext           ConvNeXt-style on 1x32x32x3: 4x4 stride-4 stem, blocks of 7x7
                     depthwise, LayerNorm, GELU MLP and layer scale, two stages

Float models (fp32 TFLite, not quantized; for the opt-in bf16 precision, listed by
``float_names()``, not by ``names()``, whose models are all int8):

  conv2d_3x3_f32          CONV_2D 3x3 SAME stride 2, 1x16x16x8 -> 1x8x8x16, bias,
                          fused ReLU6
  fully_connected_f32     FULLY_CONNECTED 1x256 -> 1x16, bias, fused ReLU
  mobilenet_v1_0.25_f32   the float graph of mobilenet_v1_0.25 (same weights)

Dynamic-range models (int8 weights, float32 activations: the converter's
``Optimize.DEFAULT`` without a representative dataset; listed by ``dynamic_names()``):

  resnet_block_dynamic    resnet_block's graph: hybrid CONV_2D and FULLY_CONNECTED where
                          a weight has 1024 values or more, the rest float
  bert_encoder_dynamic    bert_encoder's graph: hybrid FULLY_CONNECTED, float attention,
                          LayerNorm, GELU

The nets are built with ``classifier_activation=None``: an int8 SOFTMAX over 1000
classes with random weights puts nearly every output at the zero point (-128), which
makes output comparisons meaningless.

Every model is full-integer quantized by ``tf.lite.TFLiteConverter.from_keras_model``
with ``Optimize.DEFAULT``, a representative dataset, ``TFLITE_BUILTINS_INT8`` only,
and int8 model inputs and outputs (no float QUANTIZE/DEQUANTIZE at the edges); a
spec with ``legacy_quantizer=True`` (``concat_requant``) is quantized by the older
calibration quantizer (``experimental_new_quantizer = False``) instead of the MLIR one.
Weights are per-channel int8 (for FULLY_CONNECTED too: one scale per output
unit), biases int32 with per-channel scales, activations per-tensor int8.
Float models (``precision="float32"``) are converted with no optimization at all:
fp32 weights, inputs and outputs, the Keras graph's own arithmetic.

Where they are cached
---------------------
``cache_dir()`` is ``$TVM_ARMQ_HOME/models`` if that variable is set, otherwise
``~/.cache/tvm_armq/models``.  Files live in a sub-directory named after the
generator version, ``<cache_dir>/v<ZOO_VERSION>/<name>.tflite``, next to a JSON
sidecar ``<name>.json`` (zoo version, TF version, seed, sha256, description).
A cached file is reused only if its sidecar exists, names the current
``ZOO_VERSION`` and matches the file's sha256; bump ``ZOO_VERSION`` whenever a
builder changes so old files are not reused.  Both files are written to a
temporary file in the same directory and then ``os.replace``-d, and the sidecar is
written last, so a concurrent reader sees either no model or a complete one.

How determinism is achieved
---------------------------
* Before each build the Keras session is cleared (so auto-generated layer and
  tensor names restart from the same counters) and ``keras.utils.set_random_seed``
  is called; then every weight is overwritten from a ``numpy.random.RandomState``
  seeded with ``SEED``, so weights do not depend on Keras' initializer RNG.
* Nets use random BN gammas/betas, and their BN moving mean/variance are set to the
  statistics of a seeded random input batch (one training-mode forward pass with
  momentum 0).  Each BN then really normalises its input, so activations stay in a
  sensible range through the whole net instead of exploding or dying.
* The representative dataset is drawn from a fresh seeded ``RandomState``.
* Model inputs get explicit names (``input``, ``input_b``); the single-op layers
  are named too, and the Keras applications name their own layers.

With these, building the same model twice (also in two different processes, and
with 1 or 2 CPU threads) gives byte-identical .tflite files on the same machine
with the same TF version; ``tests/test_zoo.py`` checks it for one model.  The
converter embeds nothing variable (no time stamp or temp path), so nothing needs
stripping.  Bytes can differ across TF versions and, for the nets, across float
kernels: the BN-statistics pass and the calibration run float code, and a
last-bit difference there can flip an int8 rounding.  Observed: setting
``TF_ENABLE_ONEDNN_OPTS=0`` changes the MobileNet bytes (not the single-op
models' bytes).  The sidecar's sha256 lets two machines compare their files.

TensorFlow is imported lazily inside the build functions (with
``TF_CPP_MIN_LOG_LEVEL=2`` unless already set), so importing this module is cheap.
Note that building calls ``keras.backend.clear_session()`` and sets the global
Python/NumPy/TF seeds of the calling process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pathlib
import tempfile
import time
import warnings
from typing import Callable, Iterable

import numpy as np

from . import transformers as _tx
from .keras import fit_batchnorm_stats as _fit_batchnorm_stats
from .keras import named_inputs as _inputs
from .keras import randomize_weights as _randomize_weights
from .keras import single_layer, tensorflow

__all__ = [
    "ZOO_VERSION",
    "SEED",
    "ModelSpec",
    "UnknownModelError",
    "cache_dir",
    "model_dir",
    "names",
    "spec",
    "specs",
    "build",
    "build_all",
    # the model builders' pieces, for scripts that build models of their own
    "tensorflow",
    "single_layer",
    "convert",
    "atomic_write",
]

# Bump whenever any builder, the weight initialisation, the calibration data or the
# converter settings change: it is part of the cache path and of the sidecar.
ZOO_VERSION = 1

# One seed for everything (weights, BN statistics, calibration data).
SEED = 20240601


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Description of one zoo model.

    ``builder(rng)`` returns the *float* Keras model (weights already set from
    ``rng``); quantization is done by ``build``.  ``input_shapes`` has one NHWC (or
    NC for fully_connected) shape per model input, in input order; all models have
    batch 1.  ``input_ranges`` is the float range the representative dataset draws
    each input from (uniform).  ``op`` is the TFLite builtin operator a single-op
    model exists to test, ``None`` for nets.  ``precision`` is "int8" (full-integer
    quantized), "float32" (converted as is; ``float_names()``) or "dynamic_range" (int8
    weights, float32 activations; ``dynamic_names()``).  ``legacy_quantizer``
    converts with TFLite's older calibration quantizer instead of the MLIR one (see
    ``concat_requant``).
    """

    name: str
    builder: Callable[[np.random.RandomState], object]
    input_shapes: tuple[tuple[int, ...], ...]
    description: str
    op: str | None = None
    input_ranges: tuple[tuple[float, float], ...] = ((-1.0, 1.0),)
    calib_samples: int = 64
    precision: str = "int8"
    legacy_quantizer: bool = False

    @property
    def kind(self) -> str:
        """``"op"`` for single-op models, ``"net"`` for nets."""
        return "op" if self.op is not None else "net"

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of the first (for most models the only) input."""
        return self.input_shapes[0]


# --------------------------------------------------------------------------
# Single-op builders.  Each returns a float Keras model with random weights.
# --------------------------------------------------------------------------

_X8 = (1, 16, 16, 8)  # default single-op input: 16x16 spatial, 8 channels
_X16 = (1, 16, 16, 16)  # depthwise input: 16 channels in and out
_FC_IN = (1, 256)
_SOFTMAX_IN = (1, 8, 8, 16)  # 64 pixels of 16 classes each


def _build_conv2d_1x1(rng):
    return single_layer(
        [_X8], lambda L: L.Conv2D(16, 1, activation="relu", name="conv"), rng
    )


def _build_conv2d_3x3(rng):
    return single_layer(
        [_X8],
        lambda L: L.Conv2D(16, 3, padding="same", activation="relu", name="conv"),
        rng,
    )


def _build_conv2d_3x3_s2(rng):
    return single_layer(
        [_X8],
        lambda L: L.Conv2D(16, 3, strides=2, padding="same", name="conv"),
        rng,
    )


def _build_conv2d_3x3_d2(rng):
    return single_layer(
        [_X8],
        lambda L: L.Conv2D(
            16, 3, dilation_rate=2, padding="same", activation="relu6", name="conv"
        ),
        rng,
    )


def _build_conv2d_grouped(rng):
    # The TFLite converter lowers Keras groups=2 to a single CONV_2D whose filter
    # has in_ch/groups = 4 input channels (checked in tests/test_zoo.py).
    return single_layer(
        [_X8],
        lambda L: L.Conv2D(
            16, 3, padding="same", groups=2, activation="relu", name="conv"
        ),
        rng,
    )


def _build_depthwise_3x3(rng):
    return single_layer(
        [_X16],
        lambda L: L.DepthwiseConv2D(
            3, padding="same", activation="relu", name="dwconv"
        ),
        rng,
    )


def _build_depthwise_3x3_s2(rng):
    return single_layer(
        [_X16],
        lambda L: L.DepthwiseConv2D(
            3, strides=2, padding="same", activation="relu6", name="dwconv"
        ),
        rng,
    )


def _build_fully_connected(rng):
    return single_layer(
        [_FC_IN], lambda L: L.Dense(16, activation="relu", name="dense"), rng
    )


def _build_add(rng):
    # Add + ReLU: the converter fuses the ReLU into ADD's fused_activation_function.
    keras = tensorflow().keras
    a, b = _inputs([_X8, _X8])
    y = keras.layers.Add(name="add")([a, b])
    y = keras.layers.ReLU(name="relu")(y)
    return keras.Model([a, b], y)


def _build_logistic(rng):
    return single_layer([_X8], lambda L: L.Activation("sigmoid", name="logistic"), rng)


def _build_avg_pool(rng):
    return single_layer(
        [_X8],
        lambda L: L.AveragePooling2D(3, strides=2, padding="same", name="pool"),
        rng,
    )


def _build_max_pool(rng):
    return single_layer(
        [_X8],
        lambda L: L.MaxPooling2D(2, strides=2, padding="valid", name="pool"),
        rng,
    )


def _build_concat(rng):
    # int8 CONCATENATION requires every input to share the output's scale and
    # zero point.  TF 2.21's MLIR quantizer gives all three the union of the
    # calibration ranges (so ``concat`` stays a single op); the legacy quantizer
    # (``concat_requant``) keeps each input's own range and inserts a requantizing
    # QUANTIZE in front of the input whose scale differs from the output's, which
    # is why tests/test_zoo.py tolerates QUANTIZE next to the promised op.
    return single_layer(
        [_X8, _X8], lambda L: L.Concatenate(axis=-1, name="concat"), rng
    )


def _build_mul(rng):
    keras = tensorflow().keras
    a, b = _inputs([_X8, _X8])
    return keras.Model([a, b], keras.layers.Multiply(name="mul")([a, b]))


def _build_softmax(rng):
    return single_layer([_SOFTMAX_IN], lambda L: L.Softmax(axis=-1, name="softmax"), rng)


def _build_resize_bilinear(rng):
    return single_layer([(1, 8, 8, 8)], lambda L: L.UpSampling2D(
        2, interpolation="bilinear", name="resize_bilinear"), rng)


def _build_log_softmax(rng):
    # LOG_SOFTMAX: tvm_armq has no integer kernel for it yet; the model tests the float
    # fallback.
    tf = tensorflow()
    return single_layer([_SOFTMAX_IN], lambda L: L.Activation(tf.nn.log_softmax,
                                                               name="log_softmax"), rng)


def _build_sub(rng):
    keras = tensorflow().keras
    a, b = _inputs([_X8, _X8])
    return keras.Model([a, b], keras.layers.Subtract(name="sub")([a, b]))


def _build_mean(rng):
    return single_layer([_X8], lambda L: L.GlobalAveragePooling2D(name="gap"), rng)


def _build_pad(rng):
    return single_layer(
        [_X8], lambda L: L.ZeroPadding2D(((1, 2), (2, 1)), name="pad"), rng
    )


# --------------------------------------------------------------------------
# Net builders
# --------------------------------------------------------------------------

_BN_BATCH = 8  # images used to fit the BN statistics of a net


def _finish_net(model, shape, rng):
    """Random weights, then BN statistics fitted on a seeded random batch."""
    _randomize_weights(model, rng)
    batch = rng.uniform(-1.0, 1.0, (_BN_BATCH,) + tuple(shape[1:])).astype(np.float32)
    _fit_batchnorm_stats(model, batch)
    return model


def _mobilenet_v1(alpha, shape, rng):
    keras = tensorflow().keras
    (inp,) = _inputs([shape])
    model = keras.applications.MobileNet(
        input_tensor=inp,
        alpha=alpha,
        weights=None,
        classifier_activation=None,
    )
    return _finish_net(model, shape, rng)


def _build_mobilenet_v1_025(rng):
    return _mobilenet_v1(0.25, (1, 128, 128, 3), rng)


def _build_mobilenet_v1_100(rng):
    return _mobilenet_v1(1.0, (1, 224, 224, 3), rng)


def _build_mobilenet_v2_100(rng):
    keras = tensorflow().keras
    shape = (1, 224, 224, 3)
    (inp,) = _inputs([shape])
    model = keras.applications.MobileNetV2(
        input_tensor=inp,
        alpha=1.0,
        weights=None,
        classifier_activation=None,
    )
    return _finish_net(model, shape, rng)


def _application(name: str, shape, rng, **options):
    """``keras.applications.<name>`` on a (1, h, w, 3) input with random weights, 1000
    logits (no softmax), its batch-norm statistics fitted (``_finish_net``)."""
    keras = tensorflow().keras
    (inp,) = _inputs([shape])
    model = getattr(keras.applications, name)(input_tensor=inp, weights=None,
                                              classifier_activation=None, **options)
    return _finish_net(model, shape, rng)


def _build_mobilenet_v3_small(rng):
    """Keras MobileNetV3-Small: HARD_SWISH, squeeze-excite blocks (SHAPE -> STRIDED_SLICE
    -> PACK -> RESHAPE around the excite vector, a hard-sigmoid as MUL / ADD by
    constants), per-channel MUL."""
    return _application("MobileNetV3Small", (1, 96, 96, 3), rng, alpha=0.75,
                        include_preprocessing=False)


def _build_densenet121(rng):
    """Keras DenseNet-121 at 64x64: the batch-norm in front of each convolution stays a
    per-channel MUL and ADD by constants (nothing to fold it into), 58 concatenations."""
    return _application("DenseNet121", (1, 64, 64, 3), rng)


def _build_efficientnet_b1(rng):
    """Keras EfficientNet-B1 at 64x64: swish as LOGISTIC and MUL, squeeze-excite blocks
    (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE, MUL), an input Normalization layer."""
    return _application("EfficientNetB1", (1, 64, 64, 3), rng)


def _build_densenet169(rng):
    """Keras DenseNet-169 at 64x64: DenseNet-121's layout with deeper third and fourth
    dense blocks (32 and 32 layers), each batch-norm in front of a convolution a
    per-channel MUL and ADD by constants."""
    return _application("DenseNet169", (1, 64, 64, 3), rng)


# Xception's smallest input: its entry flow halves the image four times with VALID
# and strided layers, and Keras refuses anything below 71 pixels.
_XCEPTION_MIN_SIDE = 71


def _build_xception(rng):
    """Keras Xception at its smallest input (71x71): separable convolutions (a depthwise
    3x3 then a 1x1) with residual ADDs around strided 1x1 projections, max pools."""
    side = _XCEPTION_MIN_SIDE
    return _application("Xception", (1, side, side, 3), rng)


def _build_inception_v3(rng):
    """Keras InceptionV3 at its full 299x299: inception blocks of 1x1, 3x3, 1x7/7x1 and
    3x1/1x3 branches with average and max pools, joined by CONCATENATION."""
    return _application("InceptionV3", (1, 299, 299, 3), rng)


def _build_resnet50(rng):
    """Keras ResNet50 at its full 224x224: a 7x7 stride-2 stem and a max pool, then 16
    bottleneck blocks (1x1, 3x3, 1x1 convolutions and a residual ADD)."""
    return _application("ResNet50", (1, 224, 224, 3), rng)


def _build_resnet_block(rng):
    """Tiny ResNet: stem, 2 identity blocks (16 ch), 1 strided block (32 ch)."""
    keras = tensorflow().keras
    L = keras.layers
    shape = (1, 32, 32, 3)
    (inp,) = _inputs([shape])

    def conv_bn(x, ch, stride, relu, name, k=3):
        x = L.Conv2D(ch, k, strides=stride, padding="same", use_bias=False,
                     name=f"{name}_conv")(x)
        x = L.BatchNormalization(name=f"{name}_bn")(x)
        return L.ReLU(name=f"{name}_relu")(x) if relu else x

    def block(x, ch, stride, name):
        shortcut = x
        y = conv_bn(x, ch, stride, True, f"{name}_a")
        y = conv_bn(y, ch, 1, False, f"{name}_b")
        if stride != 1 or x.shape[-1] != ch:
            shortcut = conv_bn(x, ch, stride, False, f"{name}_proj", k=1)
        y = L.Add(name=f"{name}_add")([shortcut, y])
        return L.ReLU(name=f"{name}_out")(y)

    x = conv_bn(inp, 16, 1, True, "stem")
    x = block(x, 16, 1, "block1")
    x = block(x, 16, 1, "block2")
    x = block(x, 32, 2, "block3")
    x = L.GlobalAveragePooling2D(name="gap")(x)
    x = L.Dense(10, name="logits")(x)
    model = keras.Model(inp, x, name="resnet_block")
    return _finish_net(model, shape, rng)


def _build_inception_block(rng):
    """Tiny Inception: a stem, then one block of four branches (1x1; 1x1 -> 1x7 -> 7x1;
    1x1 -> 3x3; 3x3 average pool -> 1x1) joined by CONCATENATION, global pool, dense."""
    keras = tensorflow().keras
    L = keras.layers
    shape = (1, 24, 24, 3)
    (inp,) = _inputs([shape])

    def conv(x, ch, k, name, stride=1):
        x = L.Conv2D(ch, k, strides=stride, padding="same", use_bias=False,
                     name=f"{name}_conv")(x)
        x = L.BatchNormalization(name=f"{name}_bn")(x)
        return L.ReLU(name=f"{name}_relu")(x)

    x = conv(inp, 16, 3, "stem", stride=2)
    b1 = conv(x, 8, 1, "b1x1")
    b2 = conv(conv(conv(x, 8, 1, "b7_a"), 8, (1, 7), "b7_b"), 12, (7, 1), "b7_c")
    b3 = conv(conv(x, 8, 1, "b3_a"), 12, 3, "b3_b")
    b4 = L.AveragePooling2D(3, strides=1, padding="same", name="pool")(x)
    b4 = conv(b4, 8, 1, "bpool")
    x = L.Concatenate(name="concat")([b1, b2, b3, b4])
    x = conv(x, 32, 3, "reduce", stride=2)
    x = L.GlobalAveragePooling2D(name="gap")(x)
    x = L.Dense(10, name="logits")(x)
    model = keras.Model(inp, x, name="inception_block")
    return _finish_net(model, shape, rng)


def _conv_bn_relu(L, x, ch, kernel, name, stride=1):
    """Conv2D (no bias) -> BatchNormalization -> ReLU, the layers named ``name_*``."""
    x = L.Conv2D(ch, kernel, strides=stride, padding="same", use_bias=False,
                 name=f"{name}_conv")(x)
    x = L.BatchNormalization(name=f"{name}_bn")(x)
    return L.ReLU(name=f"{name}_relu")(x)


# A small U-Net segmenter: per-pixel class logits at the input's resolution.
_UNET_SHAPE = (1, 32, 32, 3)
_UNET_CLASSES = 4


def _build_unet(rng):
    """U-Net-style segmenter: a conv stage at full size, two stride-2 stages down to 8x8;
    back up by a stride-2 TRANSPOSE_CONV (with ReLU) to 16x16 and a bilinear upsampling
    (RESIZE_BILINEAR, half-pixel centres) to 32x32, each CONCATENATEd with the encoder's
    map of that size (the skip connections) and convolved; a 1x1 conv gives the logits."""
    keras = tensorflow().keras
    L = keras.layers
    (inp,) = _inputs([_UNET_SHAPE])
    e1 = _conv_bn_relu(L, inp, 16, 3, "enc1")
    e2 = _conv_bn_relu(L, e1, 32, 3, "enc2", stride=2)
    bottom = _conv_bn_relu(L, e2, 64, 3, "bottom", stride=2)
    up2 = L.Conv2DTranspose(32, 3, strides=2, padding="same", activation="relu",
                            name="up2")(bottom)
    d2 = _conv_bn_relu(L, L.Concatenate(name="skip2")([up2, e2]), 32, 3, "dec2")
    up1 = L.UpSampling2D(2, interpolation="bilinear", name="up1")(d2)
    d1 = _conv_bn_relu(L, L.Concatenate(name="skip1")([up1, e1]), 16, 3, "dec1")
    logits = L.Conv2D(_UNET_CLASSES, 1, name="logits")(d1)
    model = keras.Model(inp, logits, name="unet")
    return _finish_net(model, _UNET_SHAPE, rng)


# DS-CNN keyword spotting: 49 frames of 10 MFCC features, 12 classes (10 words,
# silence, unknown), 64 channels throughout, four depthwise-separable blocks.
_KWS_SHAPE = (1, 49, 10, 1)
_KWS_CLASSES = 12
_KWS_CHANNELS = 64
_KWS_BLOCKS = 4
_KWS_STEM_KERNEL = (10, 4)


def _build_ds_cnn(rng):
    """DS-CNN keyword spotter: a 10x4 stride-2 conv stem, four depthwise-separable blocks
    (3x3 depthwise -> BN -> ReLU -> 1x1 conv -> BN -> ReLU), global average pool, dense."""
    keras = tensorflow().keras
    L = keras.layers
    (inp,) = _inputs([_KWS_SHAPE])
    x = _conv_bn_relu(L, inp, _KWS_CHANNELS, _KWS_STEM_KERNEL, "stem", stride=2)
    for i in range(1, _KWS_BLOCKS + 1):
        x = L.DepthwiseConv2D(3, padding="same", use_bias=False, name=f"dw{i}")(x)
        x = L.BatchNormalization(name=f"dw{i}_bn")(x)
        x = L.ReLU(name=f"dw{i}_relu")(x)
        x = _conv_bn_relu(L, x, _KWS_CHANNELS, 1, f"pw{i}")
    x = L.GlobalAveragePooling2D(name="gap")(x)
    x = L.Dense(_KWS_CLASSES, name="logits")(x)
    model = keras.Model(inp, x, name="ds_cnn")
    return _finish_net(model, _KWS_SHAPE, rng)


# SSD-style detector: 3 anchors per cell, 6 classes scored independently (sigmoid),
# prediction heads on the three feature maps of a strided backbone (12x12, 6x6, 3x3 for
# a 48x48 image).
_SSD_SHAPE = (1, 48, 48, 3)
_SSD_ANCHORS = 3
_SSD_CLASSES = 6
_BOX_COORDS = 4
_SSD_BACKBONE = ((16, "stage1"), (32, "stage2"), (64, "stage3"), (64, "stage4"))
_SSD_HEAD_STAGES = 3  # the last three stages carry heads


def _build_ssd_head(rng):
    """SSD-style detector: a backbone of stride-2 3x3 conv stages; on each of its last
    three feature maps a 3x3 box conv (4 per anchor) and a 3x3 class conv (one score per
    class and anchor), RESHAPEd to (1, cells * anchors, 4) and (1, cells * anchors,
    classes), CONCATENATEd across the scales; the class scores through LOGISTIC.
    Outputs, in the converter's order: scores (1, N, classes), then boxes (1, N, 4)."""
    keras = tensorflow().keras
    L = keras.layers
    (inp,) = _inputs([_SSD_SHAPE])
    x, maps = inp, []
    for channels, name in _SSD_BACKBONE:
        x = _conv_bn_relu(L, x, channels, 3, name, stride=2)
        maps.append(x)
    boxes, scores = [], []
    for i, fmap in enumerate(maps[-_SSD_HEAD_STAGES:]):
        b = L.Conv2D(_BOX_COORDS * _SSD_ANCHORS, 3, padding="same", name=f"box{i}")(fmap)
        boxes.append(L.Reshape((-1, _BOX_COORDS), name=f"box{i}_reshape")(b))
        c = L.Conv2D(_SSD_CLASSES * _SSD_ANCHORS, 3, padding="same", name=f"cls{i}")(fmap)
        scores.append(L.Reshape((-1, _SSD_CLASSES), name=f"cls{i}_reshape")(c))
    boxes = L.Concatenate(axis=1, name="boxes")(boxes)
    scores = L.Concatenate(axis=1, name="class_logits")(scores)
    scores = L.Activation("sigmoid", name="scores")(scores)
    model = keras.Model(inp, [boxes, scores], name="ssd_head")
    return _finish_net(model, _SSD_SHAPE, rng)


# Two inputs (an image and a feature vector) and two outputs (logits and a feature map).
_TWO_IN_IMAGE = (1, 24, 24, 3)
_TWO_IN_VECTOR = (1, 16)
_TWO_OUT_CLASSES = 10
_TWO_OUT_MAP_CHANNELS = 8


def _build_two_in_two_out(rng):
    """Two inputs, two outputs: the image through two strided conv-BN-ReLU layers, the
    vector through a dense layer with ReLU; the pooled image features ADDed to the vector
    features, CONCATENATEd with them and a dense layer gives the logits (first output);
    a 1x1 conv of the image features gives a feature map (second output)."""
    keras = tensorflow().keras
    L = keras.layers
    image, vector = _inputs([_TWO_IN_IMAGE, _TWO_IN_VECTOR])
    f = _conv_bn_relu(L, image, 16, 3, "conv1", stride=2)
    f = _conv_bn_relu(L, f, 32, 3, "conv2", stride=2)
    v = L.Dense(32, activation="relu", name="vector_dense")(vector)
    g = L.GlobalAveragePooling2D(name="gap")(f)
    s = L.Add(name="add")([g, v])
    joined = L.Concatenate(name="concat")([s, v])
    logits = L.Dense(_TWO_OUT_CLASSES, name="logits")(joined)
    fmap = L.Conv2D(_TWO_OUT_MAP_CHANNELS, 1, name="map")(f)
    model = keras.Model([image, vector], [logits, fmap], name="two_in_two_out")
    _randomize_weights(model, rng)
    batches = [rng.uniform(-1.0, 1.0, (_BN_BATCH,) + shape[1:]).astype(np.float32)
               for shape in (_TWO_IN_IMAGE, _TWO_IN_VECTOR)]
    _fit_batchnorm_stats(model, batches)
    return model


def _build_conv2d_3x3_f32(rng):
    return single_layer(
        [_X8],
        lambda L: L.Conv2D(16, 3, strides=2, padding="same", activation="relu6",
                           name="conv"),
        rng,
    )


# --------------------------------------------------------------------------
# Registry (ordered: single-op models first, then nets)
# --------------------------------------------------------------------------

_TWO_RANGES = ((-1.0, 1.0), (-3.0, 2.0))

_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("conv2d_1x1", _build_conv2d_1x1, (_X8,),
              "CONV_2D 1x1, 8->16 ch, bias, fused ReLU", op="CONV_2D"),
    ModelSpec("conv2d_3x3", _build_conv2d_3x3, (_X8,),
              "CONV_2D 3x3 SAME, 8->16 ch, bias, fused ReLU", op="CONV_2D"),
    ModelSpec("conv2d_3x3_s2", _build_conv2d_3x3_s2, (_X8,),
              "CONV_2D 3x3 SAME stride 2, 8->16 ch, bias, no activation",
              op="CONV_2D"),
    ModelSpec("conv2d_3x3_d2", _build_conv2d_3x3_d2, (_X8,),
              "CONV_2D 3x3 SAME dilation 2, 8->16 ch, bias, fused ReLU6",
              op="CONV_2D"),
    ModelSpec("conv2d_grouped", _build_conv2d_grouped, (_X8,),
              "CONV_2D 3x3 SAME groups=2 (filter 16x3x3x4), 8->16 ch, bias, "
              "fused ReLU", op="CONV_2D"),
    ModelSpec("depthwise_3x3", _build_depthwise_3x3, (_X16,),
              "DEPTHWISE_CONV_2D 3x3 SAME, 16 ch, multiplier 1, bias, fused ReLU",
              op="DEPTHWISE_CONV_2D"),
    ModelSpec("depthwise_3x3_s2", _build_depthwise_3x3_s2, (_X16,),
              "DEPTHWISE_CONV_2D 3x3 SAME stride 2, 16 ch, bias, fused ReLU6",
              op="DEPTHWISE_CONV_2D"),
    ModelSpec("fully_connected", _build_fully_connected, (_FC_IN,),
              "FULLY_CONNECTED 256->16, bias, fused ReLU", op="FULLY_CONNECTED"),
    ModelSpec("add", _build_add, (_X8, _X8),
              "ADD of two inputs with different scales, fused ReLU", op="ADD",
              input_ranges=_TWO_RANGES),
    ModelSpec("avg_pool", _build_avg_pool, (_X8,),
              "AVERAGE_POOL_2D 3x3 stride 2 SAME", op="AVERAGE_POOL_2D"),
    ModelSpec("max_pool", _build_max_pool, (_X8,),
              "MAX_POOL_2D 2x2 stride 2 VALID", op="MAX_POOL_2D"),
    ModelSpec("concat", _build_concat, (_X8, _X8),
              "CONCATENATION on channels of two inputs, 8+8->16 ch",
              op="CONCATENATION", input_ranges=_TWO_RANGES),
    ModelSpec("mean", _build_mean, (_X8,),
              "MEAN over H, W (global average pool), 1x16x16x8 -> 1x8", op="MEAN"),
    ModelSpec("pad", _build_pad, (_X8,),
              "PAD with zeros, H (1,2), W (2,1)", op="PAD"),
    ModelSpec("mul", _build_mul, (_X8, _X8),
              "MUL of two inputs with different scales", op="MUL",
              input_ranges=_TWO_RANGES),
    ModelSpec("softmax", _build_softmax, (_SOFTMAX_IN,),
              "SOFTMAX over 16 classes, 1x8x8x16, input calibrated on [-4, 4]",
              op="SOFTMAX", input_ranges=((-4.0, 4.0),)),
    ModelSpec("concat_requant", _build_concat, (_X8, _X8),
              "CONCATENATION on channels of two inputs with different scales: a "
              "QUANTIZE requantizes one of them first (legacy quantizer)",
              op="CONCATENATION", input_ranges=_TWO_RANGES, legacy_quantizer=True),
    ModelSpec("logistic", _build_logistic, (_X8,),
              "LOGISTIC (sigmoid), 8 ch, input calibrated on [-4, 4]",
              op="LOGISTIC", input_ranges=((-4.0, 4.0),)),
    ModelSpec("sub", _build_sub, (_X8, _X8),
              "SUB of two inputs with different scales", op="SUB",
              input_ranges=_TWO_RANGES),
    ModelSpec("resize_bilinear", _build_resize_bilinear, ((1, 8, 8, 8),),
              "RESIZE_BILINEAR 8x8 -> 16x16 (Keras UpSampling2D, half-pixel centres)",
              op="RESIZE_BILINEAR"),
    ModelSpec("log_softmax", _build_log_softmax, (_SOFTMAX_IN,),
              "LOG_SOFTMAX over 16 classes, 1x8x8x16: no tvm_armq kernel yet, stays float "
              "QDQ", op="LOG_SOFTMAX", input_ranges=((-4.0, 4.0),)),
    # Nets.  Fewer calibration samples: a 224x224 MobileNet costs ~0.1 s each.
    ModelSpec("mobilenet_v1_0.25", _build_mobilenet_v1_025, ((1, 128, 128, 3),),
              "Keras MobileNet v1, alpha 0.25, 128x128, 1000 logits (no softmax)",
              calib_samples=32),
    ModelSpec("mobilenet_v1_1.0", _build_mobilenet_v1_100, ((1, 224, 224, 3),),
              "Keras MobileNet v1, alpha 1.0, 224x224, 1000 logits (no softmax)",
              calib_samples=16),
    ModelSpec("mobilenet_v2_1.0", _build_mobilenet_v2_100, ((1, 224, 224, 3),),
              "Keras MobileNet v2, alpha 1.0, 224x224, 1000 logits (no softmax)",
              calib_samples=16),
    ModelSpec("resnet_block", _build_resnet_block, ((1, 32, 32, 3),),
              "Small ResNet: conv-BN-ReLU stem, 3 residual blocks (ADD), "
              "global average pool, dense 10", calib_samples=64),
    ModelSpec("inception_block", _build_inception_block, ((1, 24, 24, 3),),
              "Small Inception: 4 branches (1x1, 1x7/7x1, 3x3, avg pool) joined by "
              "CONCATENATION, global average pool, dense 10", calib_samples=64),
    ModelSpec("mobilenet_v3_small", _build_mobilenet_v3_small, ((1, 96, 96, 3),),
              "Keras MobileNetV3-Small, alpha 0.75, 96x96, 1000 logits: HARD_SWISH, "
              "squeeze-excite (SHAPE / STRIDED_SLICE / PACK / RESHAPE, MUL)",
              calib_samples=32),
    ModelSpec("efficientnet_b1", _build_efficientnet_b1, ((1, 64, 64, 3),),
              "Keras EfficientNet-B1, 64x64, 1000 logits: swish (LOGISTIC, MUL), "
              "squeeze-excite", calib_samples=32),
    ModelSpec("densenet121", _build_densenet121, ((1, 64, 64, 3),),
              "Keras DenseNet-121, 64x64, 1000 logits: per-channel batch-norm as MUL "
              "and ADD by constants, 58 concatenations", calib_samples=32),
    ModelSpec("ds_cnn", _build_ds_cnn, (_KWS_SHAPE,),
              "DS-CNN keyword spotter, 49x10x1 MFCCs: 10x4 stride-2 conv stem, four "
              "depthwise-separable blocks of 64 ch, global average pool, dense 12",
              calib_samples=64),
    ModelSpec("ssd_head", _build_ssd_head, (_SSD_SHAPE,),
              "SSD-style detector, 48x48: box and class 3x3 convs on three scales, "
              "RESHAPE, CONCATENATION across scales, LOGISTIC scores; outputs scores "
              "(1, 567, 6) and boxes (1, 567, 4)", calib_samples=64),
    # The converter orders this model's inputs input_b (the vector), input (the image);
    # the shapes and calibration ranges follow the TFLite order.
    ModelSpec("two_in_two_out", _build_two_in_two_out, (_TWO_IN_VECTOR, _TWO_IN_IMAGE),
              "Two inputs (16-vector, 24x24 image), two outputs (6x6x8 map, 10 logits): "
              "conv, dense, ADD, CONCATENATION", input_ranges=_TWO_RANGES[::-1],
              calib_samples=64),
    ModelSpec("xception", _build_xception, ((1, _XCEPTION_MIN_SIDE, _XCEPTION_MIN_SIDE, 3),),
              "Keras Xception, 71x71 (its smallest input), 1000 logits: separable "
              "convolutions, residual ADDs, max pools", calib_samples=32),
    ModelSpec("densenet169", _build_densenet169, ((1, 64, 64, 3),),
              "Keras DenseNet-169, 64x64, 1000 logits: per-channel batch-norm as MUL "
              "and ADD by constants, 82 concatenations", calib_samples=32),
    ModelSpec("unet", _build_unet, (_UNET_SHAPE,),
              "Small U-Net, 32x32, 4 classes per pixel: two strided encoder stages, a "
              "TRANSPOSE_CONV and a bilinear RESIZE_BILINEAR upsampling, skip "
              "CONCATENATIONs", calib_samples=64),
    ModelSpec("inception_v3", _build_inception_v3, ((1, 299, 299, 3),),
              "Keras InceptionV3, 299x299, 1000 logits: 1x7/7x1 and 1x3/3x1 branches, "
              "average and max pools, CONCATENATION", calib_samples=16),
    ModelSpec("resnet50", _build_resnet50, ((1, 224, 224, 3),),
              "Keras ResNet50, 224x224, 1000 logits: 7x7 stride-2 stem, 1x1 / 3x3 / 1x1 "
              "bottlenecks, residual ADDs", calib_samples=16),
)

# The attention-era models (``zoo.transformers``): single ops, then nets.
_SEQUENCE_RANGE = ((-2.0, 2.0),)
_SPECS += (
    # The converter orders these two inputs input_b, input (the right operand first);
    # the shapes and calibration ranges follow the TFLite order.
    ModelSpec("batch_matmul", _tx.build_batch_matmul, (_tx.BATCH_MATMUL_B, _tx.BATCH_MATMUL_A),
              "BATCH_MATMUL of two int8 inputs, 2 heads of 16x24 times 24x20",
              op="BATCH_MATMUL", input_ranges=_TWO_RANGES[::-1]),
    ModelSpec("batch_matmul_adj", _tx.build_batch_matmul_adj,
              (_tx.BATCH_MATMUL_ADJ_B, _tx.BATCH_MATMUL_ADJ_A),
              "BATCH_MATMUL with adj_y (A.B^T), 2 heads of 17x24 times one 20x24 head "
              "broadcast to both", op="BATCH_MATMUL", input_ranges=_TWO_RANGES[::-1]),
    ModelSpec("gelu", _tx.build_gelu, (_tx.GELU_SHAPE,),
              "GELU (erf form), input calibrated on [-4, 4]", op="GELU",
              input_ranges=((-4.0, 4.0),)),
    ModelSpec("gelu_tanh", _tx.build_gelu_tanh, (_tx.GELU_SHAPE,),
              "GELU (approximate: its tanh form), input calibrated on [-4, 4]", op="GELU",
              input_ranges=((-4.0, 4.0),)),

    ModelSpec("fully_connected_3d", _tx.build_fully_connected_3d, (_tx.SEQUENCE,),
              "FULLY_CONNECTED on 1x16x32 (keep_num_dims) -> 1x16x24", op="FULLY_CONNECTED",
              input_ranges=_SEQUENCE_RANGE),
    # one Keras layer, but a chain of thirteen TFLite ops: a net of its own
    ModelSpec("layer_norm", _tx.build_layer_norm, (_tx.SEQUENCE,),
              "LayerNormalization over the last axis of 1x16x32: MEAN, a NEG float island, "
              "SQUARED_DIFFERENCE, RSQRT, MULs, ADDs", input_ranges=_SEQUENCE_RANGE),
    ModelSpec("dense_4d_shape_chain", _tx.build_dense_4d_shape_chain, (_tx.DENSE_4D,),
              "Dense layers on a 1x8x8x16 image of open batch: the converter's int32 shape "
              "chains (SHAPE, GATHER, REDUCE_PROD, CONCATENATION, PACK) feed each RESHAPE; "
              "LayerNorm and GELU between them"),
    ModelSpec("vit", _tx.build_vit, (_tx.VIT_SHAPE,),
              "ViT, 32x32 in 4x4 patches: class token, position embedding, 2 pre-norm "
              "encoder blocks of width 64 (4 heads, GELU MLP 128), 10 logits",
              calib_samples=32),
    ModelSpec("bert_encoder", _tx.build_bert, (_tx.BERT_SHAPE,),
              "BERT-style encoder over 32 token embeddings of width 64: 2 post-norm blocks "
              "(4 heads, tanh-GELU MLP 128); outputs the sequence and 4 pooled logits",
              input_ranges=_SEQUENCE_RANGE, calib_samples=32),
    ModelSpec("mobilevit", _tx.build_mobilevit, (_tx.MOBILEVIT_SHAPE,),
              "MobileViT-style, 32x32: conv stem, inverted residual, a MobileViT block "
              "(unfold to 2x2 patches, attention, fold back, concat, conv), 10 logits",
              calib_samples=32),
    ModelSpec("convnext", _tx.build_convnext, (_tx.CONVNEXT_SHAPE,),
              "ConvNeXt-style, 32x32: 4x4 stem, blocks of 7x7 depthwise, LayerNorm, GELU "
              "MLP, layer scale; 2 stages (32, 64 ch), 10 logits", calib_samples=32),
)

# single-op models first, then nets (a stable sort: each group keeps its order)
_SPECS = tuple(sorted(_SPECS, key=lambda s: s.kind != "op"))

# Float models: a registry of their own, so that ``names()`` stays the int8 zoo (the
# whole-model tests compare every one of those with TFLite bit for bit, in int8).
_FLOAT = "float32"
_FLOAT_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("conv2d_3x3_f32", _build_conv2d_3x3_f32, (_X8,),
              "float CONV_2D 3x3 SAME stride 2 (pads 0 top/left, 1 bottom/right), "
              "8->16 ch, bias, fused ReLU6", op="CONV_2D",
              precision=_FLOAT),
    ModelSpec("fully_connected_f32", _build_fully_connected, (_FC_IN,),
              "float FULLY_CONNECTED 256->16, bias, fused ReLU", op="FULLY_CONNECTED",
              precision=_FLOAT),
    ModelSpec("mobilenet_v1_0.25_f32", _build_mobilenet_v1_025, ((1, 128, 128, 3),),
              "float Keras MobileNet v1, alpha 0.25, 128x128, 1000 logits (no softmax)",
              precision=_FLOAT),
)

# Dynamic-range models: TFLite's converter with Optimize.DEFAULT and no representative
# dataset (int8 weights, float32 activations; the FULLY_CONNECTED / CONV_2D layers of
# 1024 weights or more run TFLite's hybrid kernels). Their float layers are TVM's float
# code, so a whole model matches TFLite within a tolerance, not to the bit.
_DYNAMIC = "dynamic_range"
_DYNAMIC_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("resnet_block_dynamic", _build_resnet_block, ((1, 32, 32, 3),),
              "resnet_block, dynamic-range quantized: hybrid CONV_2D and FULLY_CONNECTED, "
              "float ADD, pool and the small stem", precision=_DYNAMIC),
    ModelSpec("bert_encoder_dynamic", _tx.build_bert, (_tx.BERT_SHAPE,),
              "bert_encoder, dynamic-range quantized: hybrid FULLY_CONNECTED, float "
              "attention, LayerNorm and GELU", input_ranges=_SEQUENCE_RANGE,
              precision=_DYNAMIC),
)

_BY_NAME = {s.name: s for s in _SPECS + _FLOAT_SPECS + _DYNAMIC_SPECS}
assert len(_BY_NAME) == len(_SPECS) + len(_FLOAT_SPECS) + len(_DYNAMIC_SPECS), \
    "duplicate zoo model name"


def names() -> list[str]:
    """All model names, single-op models first, then nets."""
    return [s.name for s in _SPECS]


def specs() -> list[ModelSpec]:
    """All specs, in the same order as ``names()``."""
    return list(_SPECS)


def float_names() -> list[str]:
    """The float (fp32, not quantized) models, single-op models first, then nets."""
    return [s.name for s in _FLOAT_SPECS]


def dynamic_names() -> list[str]:
    """The dynamic-range models (int8 weights, float32 activations), nets only."""
    return [s.name for s in _DYNAMIC_SPECS]


class UnknownModelError(KeyError):
    """A model name that is not in the zoo; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would show the message repr()-quoted
        return str(self.args[0])


def spec(name: str) -> ModelSpec:
    """The spec of ``name``; ``UnknownModelError`` (a ``KeyError``) if unknown."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownModelError(
            f"unknown zoo model {name!r}; valid names: "
            f"{', '.join(names() + float_names())}"
        ) from None


# --------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------


def cache_dir() -> pathlib.Path:
    """``$TVM_ARMQ_HOME/models`` if set, else ``~/.cache/tvm_armq/models``."""
    home = os.environ.get("TVM_ARMQ_HOME")
    if home:
        return pathlib.Path(home).expanduser() / "models"
    return pathlib.Path.home() / ".cache" / "tvm_armq" / "models"


def model_dir() -> pathlib.Path:
    """Directory holding the current generator version's models."""
    return cache_dir() / f"v{ZOO_VERSION}"


def _sidecar(path: pathlib.Path) -> pathlib.Path:
    return path.with_suffix(".json")


def _is_valid(path: pathlib.Path) -> bool:
    """True if ``path`` and its sidecar exist and match this generator version."""
    try:
        meta = json.loads(_sidecar(path).read_text())
        data = path.read_bytes()
    except (OSError, ValueError):
        return False
    return (
        meta.get("zoo_version") == ZOO_VERSION
        and meta.get("sha256") == hashlib.sha256(data).hexdigest()
    )


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same dir + ``os.replace``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------
# Conversion
# --------------------------------------------------------------------------


def _representative_dataset(s: ModelSpec):
    """Seeded calibration samples: each input uniform in its ``input_ranges``."""
    ranges = s.input_ranges
    if len(ranges) == 1 and len(s.input_shapes) > 1:
        ranges = ranges * len(s.input_shapes)
    rng = np.random.RandomState(SEED + 1)

    def gen():
        for _ in range(s.calib_samples):
            yield [
                rng.uniform(lo, hi, shape).astype(np.float32)
                for shape, (lo, hi) in zip(s.input_shapes, ranges)
            ]

    return gen


def convert(s: ModelSpec) -> bytes:
    """Build the float model of ``s`` and quantize it to int8 TFLite bytes."""
    def quantize_int8(converter, tf):
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = _representative_dataset(s)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        if s.legacy_quantizer:
            converter.experimental_new_quantizer = False

    return _keras_to_tflite(s, quantize_int8)


def _convert_float(s: ModelSpec) -> bytes:
    """Build the float model of ``s`` and convert it to fp32 TFLite bytes, unquantized."""
    return _keras_to_tflite(s, lambda converter, tf: None)


def _convert_dynamic(s: ModelSpec) -> bytes:
    """Build the float model of ``s`` and convert it with dynamic-range quantization: int8
    weights, float32 activations, no representative dataset."""
    def dynamic_range(converter, tf):
        converter.optimizations = [tf.lite.Optimize.DEFAULT]

    return _keras_to_tflite(s, dynamic_range)


def _keras_to_tflite(s: ModelSpec, configure) -> bytes:
    """The Keras model of ``s`` (seeded) through TFLite's converter, set up by
    ``configure(converter, tf)``."""
    tf = tensorflow()
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(SEED)
    model = s.builder(np.random.RandomState(SEED))
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    configure(converter, tf)
    # from_keras_model exports a temporary SavedModel and Keras prints a summary of
    # it on stdout; keep stdout clean for callers (make_models.py prints paths).
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="Statistics for quantized inputs were expected"
        )
        data = converter.convert()
    tf.keras.backend.clear_session()
    return data


def build(
    name: str, *, force: bool = False, out_dir: str | os.PathLike | None = None
) -> pathlib.Path:
    """Return the path of ``<name>.tflite``, building it if needed.

    ``out_dir`` defaults to ``model_dir()``.  An existing file is returned as is
    if its sidecar matches (see module docstring); ``force=True`` always rebuilds.
    """
    s = spec(name)
    directory = pathlib.Path(out_dir) if out_dir is not None else model_dir()
    path = directory / f"{s.name}.tflite"
    if not force and _is_valid(path):
        return path

    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = {_FLOAT: _convert_float, _DYNAMIC: _convert_dynamic}.get(s.precision, convert)(s)
    seconds = time.perf_counter() - t0
    meta = {
        "name": s.name,
        "description": s.description,
        "zoo_version": ZOO_VERSION,
        "seed": SEED,
        "tensorflow_version": tensorflow().__version__,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "build_seconds": round(seconds, 2),
    }
    # Model first, sidecar last: the sidecar marks the pair as complete.
    atomic_write(path, data)
    atomic_write(_sidecar(path), (json.dumps(meta, indent=2) + "\n").encode())
    return path


def build_all(
    names: Iterable[str] | None = None,  # noqa: A002 - mirrors the CLI wording
    *,
    force: bool = False,
    out_dir: str | os.PathLike | None = None,
) -> list[pathlib.Path]:
    """Build ``names`` (default: every model), returning their paths in order."""
    selected = list(names) if names is not None else [s.name for s in _SPECS]
    for n in selected:  # fail on a typo before spending minutes on builds
        spec(n)
    return [build(n, force=force, out_dir=out_dir) for n in selected]
