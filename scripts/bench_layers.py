"""Estimated aarch64 cycles per layer: tvm_armq's kernels against TFLite (XNNPACK).

Every distinct convolution, depthwise convolution and dense layer of MobileNetV1 1.0 and
MobileNetV2 1.0 at 224x224, of ResNet-50 (224), and the characteristic convolution shapes
of InceptionV3 (299) and DenseNet-121 (224) (``LAYERS`` below, derived from the
architectures) becomes a single-op int8 TFLite model, built once with TensorFlow's converter (seeded, as the
model zoo builds its models) and cached under ``$TVM_ARMQ_HOME/bench`` (default
``~/.cache/tvm_armq/bench``). For each layer and ISA level:

  TFLite     ``armperf.py tflite MODEL`` - LiteRT with XNNPACK, one thread, on the level's
             emulated CPU (XNNPACK picks its micro-kernels from that CPU's features).
  tvm_armq   the layer's kernel built from exactly that model's parameters
             (``frontend.layers.read_layer``): conv2d / dense through ``conv2d_gemm`` with
             the level's best micro-kernel (``kernels.select``) and the knobs
             ``conv2d_gemm.default_knobs(shape, kernel, parallel=False)`` (``--knobs``
             overrides fields, e.g. ``--knobs m_tiles=2,n_tiles=4``); depthwise
             through ``schedules.depthwise`` (single thread too). The PrimFunc is exported
             for aarch64 and ``armperf.py script`` times one call of it.

Both run ``--runs`` times (default 2) after a warm-up, single thread, on the same llvm-mca
core model; the figures are estimated cycles per call. The TFLite figure also contains
the interpreter's per-``invoke`` overhead and the tvm_armq figure the Python -> PackedFunc
call; both are small next to a layer of a 224x224 net but not zero on the 7x7 and dense
layers. The printed table has one row per layer and level (ratio = tflite / tvm_armq:
above 1, tvm_armq is faster), then per model and level the totals over the layers
measured, each layer counted as many times as the model uses it.

The figure is armperf's own, taken as it is: version 2 and later decode the dot-product and
matrix instructions (sdot, smmla, bfmmla) and price straight-line code that qemu cut into
several blocks as the one block it is, on both sides. The armperf version is printed under
the table and stored in every row.

Before measuring, every layer is checked once on the host: the model holds the expected
op and shapes, the NumPy reference (``schedules.reference``) computed from the parameters
read from the file equals TFLite's reference kernels, and the arrays handed to the kernel
have exactly the PrimFunc's buffer shapes. Nothing runs on a device here.

    python scripts/bench_layers.py [--models mobilenet_v1_1.0 ...] [--layers REGEX]
                                   [--isa dotprod i8mm] [--limit N] [--runs 2]
                                   [--json rows.json] [--png chart.png] [--top N]
                                   [--results scripts/results/layers.json]

Time (2-core x86 host): one armperf run takes ~5-30 s (the 224x224 and 112x112 layers
are the slow ones), compiling a layer a few seconds, the first build of a layer's .tflite
model ~5 s. MobileNetV1's 20 distinct layers at two levels took 8.5 minutes; the full
MobileNet run (49 layers, 3 levels, two armperf runs each) 27 minutes, models cached;
ResNet-50's 21 layers at two levels, one run each, under an hour (its 224 x 224 stem and
56 x 56 layers are the slow ones). Use
``--models`` / ``--layers`` / ``--limit`` / ``--isa`` for a subset.

The figures are core-bound estimates (every load an L1 hit), for comparing two
implementations of the same layer on the same core model; they are not milliseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

import armperf_tool
from tvm_armq import export, targets, zoo
from tvm_armq.intrinsics import kernels, requant
from tvm_armq.schedules import gemm_compute, gemm_plan, gemm_schedule
from tvm_armq.schedules.gemm_layout import Conv2DShape, fold_bias, pack_weights
from tvm_armq.schedules import reference as ref
from tvm_armq.targets import LEVELS
from tvm_armq.frontend.layers import read_layer
from tvm_armq.frontend.model import TFLiteModel


# Bump when the builder, the layer table's meaning or the converter settings change:
# it is part of the cache path, so stale models are never reused.
BENCH_VERSION = 1

# Overrides of the GEMM schedule's default knobs (``--knobs``), applied to every conv /
# dense layer; the defaults are ``gemm_plan.default_knobs`` with parallel=False (armperf measures
# one thread).
KNOB_OVERRIDES: dict[str, int] = {}

V1, V2 = "mobilenet_v1_1.0", "mobilenet_v2_1.0"
R50, I3, D121 = "resnet50", "inception_v3", "densenet121"
MODELS = (V1, V2, R50, I3, D121)
# The short names the table uses for them (``_layer(..., v1=1)``).
MODEL_KEYS = {"v1": V1, "v2": V2, "r50": R50, "i3": I3, "d121": D121}

# TFLite builtin op of each layer kind.
TFLITE_OP = {"conv": "CONV_2D", "dw": "DEPTHWISE_CONV_2D", "dense": "FULLY_CONNECTED"}


@dataclasses.dataclass(frozen=True)
class Layer:
    """One distinct layer shape. ``hw`` is the (square) input size, ``k`` the kernel
    (an int for a square one, (kh, kw) for InceptionV3's 1x7, 7x1, ...), ``stride`` both
    strides; padding is SAME (for the stride-2 layers that is Keras' ZeroPadding2D((0, 1),
    (0, 1)) + VALID, the same pixels). ``act`` is the fused activation ("relu6", "relu" or
    "linear"); ``uses`` how often each model runs this shape."""

    name: str
    op: str  # "conv", "dw" or "dense"
    hw: int
    in_c: int
    out_c: int
    k: int | tuple[int, int]
    stride: int
    act: str
    uses: tuple[tuple[str, int], ...]

    @property
    def kernel(self) -> tuple[int, int]:
        """(kh, kw)."""
        return tuple(self.k) if isinstance(self.k, (tuple, list)) else (self.k, self.k)

    @property
    def out_hw(self) -> int:
        return -(-self.hw // self.stride)  # SAME: ceil(in / stride)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (1, self.in_c) if self.op == "dense" else (1, self.hw, self.hw, self.in_c)

    @property
    def output_shape(self) -> tuple[int, ...]:
        if self.op == "dense":
            return (1, self.out_c)
        return (1, self.out_hw, self.out_hw, self.out_c)

    @property
    def symbol(self) -> str:
        """The PrimFunc's name (armperf reports hot blocks by it)."""
        return re.sub(r"\W", "_", self.name)

    def describe(self) -> str:
        if self.op == "dense":
            return f"dense {self.in_c}->{self.out_c}"
        geometry = f"{self.hw}x{self.hw}x{self.in_c}"
        kh, kw = self.kernel
        if self.op == "dw":
            return f"dw {kh}x{kw}/s{self.stride} {geometry}"
        return f"conv {kh}x{kw}/s{self.stride} {geometry}->{self.out_c}"

    def count(self, model: str) -> int:
        return dict(self.uses).get(model, 0)


def _layer(name, op, hw, in_c, out_c, k, stride, act, **uses):
    return Layer(name, op, hw, in_c, out_c, k, stride, act,
                 tuple((MODEL_KEYS[m], n) for m, n in uses.items()))


# MobileNetV1 1.0 (224x224): a 3x3/s2 stem conv 3 -> 32, then 13 pairs of depthwise 3x3
# (stride 1 or 2) + pointwise 1x1, global average pool and a 1x1 conv 1024 -> 1000 as the
# classifier (Keras' MobileNet). ReLU6 after every conv but the classifier.
# MobileNetV2 1.0 (224x224): the same stem, 17 inverted residual blocks (expand 1x1 with
# ReLU6 - absent in the first block -, depthwise 3x3 with ReLU6, linear project 1x1),
# a 1x1 conv 320 -> 1280 with ReLU6, global average pool and a dense 1280 -> 1000.
# Two shapes are shared: the stem and the first 112x112x32 depthwise.
#                name          op       hw  in_c out_c k stride act
LAYERS: tuple[Layer, ...] = (
    _layer("stem",         "conv",  224,    3,   32, 3, 2, "relu6", v1=1, v2=1),
    _layer("v1.dw1",       "dw",    112,   32,   32, 3, 1, "relu6", v1=1, v2=1),
    _layer("v1.pw1",       "conv",  112,   32,   64, 1, 1, "relu6", v1=1),
    _layer("v1.dw2",       "dw",    112,   64,   64, 3, 2, "relu6", v1=1),
    _layer("v1.pw2",       "conv",   56,   64,  128, 1, 1, "relu6", v1=1),
    _layer("v1.dw3",       "dw",     56,  128,  128, 3, 1, "relu6", v1=1),
    _layer("v1.pw3",       "conv",   56,  128,  128, 1, 1, "relu6", v1=1),
    _layer("v1.dw4",       "dw",     56,  128,  128, 3, 2, "relu6", v1=1),
    _layer("v1.pw4",       "conv",   28,  128,  256, 1, 1, "relu6", v1=1),
    _layer("v1.dw5",       "dw",     28,  256,  256, 3, 1, "relu6", v1=1),
    _layer("v1.pw5",       "conv",   28,  256,  256, 1, 1, "relu6", v1=1),
    _layer("v1.dw6",       "dw",     28,  256,  256, 3, 2, "relu6", v1=1),
    _layer("v1.pw6",       "conv",   14,  256,  512, 1, 1, "relu6", v1=1),
    _layer("v1.dw7-11",    "dw",     14,  512,  512, 3, 1, "relu6", v1=5),
    _layer("v1.pw7-11",    "conv",   14,  512,  512, 1, 1, "relu6", v1=5),
    _layer("v1.dw12",      "dw",     14,  512,  512, 3, 2, "relu6", v1=1),
    _layer("v1.pw12",      "conv",    7,  512, 1024, 1, 1, "relu6", v1=1),
    _layer("v1.dw13",      "dw",      7, 1024, 1024, 3, 1, "relu6", v1=1),
    _layer("v1.pw13",      "conv",    7, 1024, 1024, 1, 1, "relu6", v1=1),
    _layer("v1.logits",    "conv",    1, 1024, 1000, 1, 1, "linear", v1=1),
    # MobileNetV2: block b's layers are v2.bN.{expand,dw,project}; a range names every
    # block with that shape.
    _layer("v2.b0.project", "conv", 112,   32,   16, 1, 1, "linear", v2=1),
    _layer("v2.b1.expand", "conv",  112,   16,   96, 1, 1, "relu6", v2=1),
    _layer("v2.b1.dw",     "dw",    112,   96,   96, 3, 2, "relu6", v2=1),
    _layer("v2.b1.project", "conv",  56,   96,   24, 1, 1, "linear", v2=1),
    _layer("v2.b2-3.expand", "conv", 56,   24,  144, 1, 1, "relu6", v2=2),
    _layer("v2.b2.dw",     "dw",     56,  144,  144, 3, 1, "relu6", v2=1),
    _layer("v2.b2.project", "conv",  56,  144,   24, 1, 1, "linear", v2=1),
    _layer("v2.b3.dw",     "dw",     56,  144,  144, 3, 2, "relu6", v2=1),
    _layer("v2.b3.project", "conv",  28,  144,   32, 1, 1, "linear", v2=1),
    _layer("v2.b4-6.expand", "conv", 28,   32,  192, 1, 1, "relu6", v2=3),
    _layer("v2.b4-5.dw",   "dw",     28,  192,  192, 3, 1, "relu6", v2=2),
    _layer("v2.b4-5.project", "conv", 28, 192,   32, 1, 1, "linear", v2=2),
    _layer("v2.b6.dw",     "dw",     28,  192,  192, 3, 2, "relu6", v2=1),
    _layer("v2.b6.project", "conv",  14,  192,   64, 1, 1, "linear", v2=1),
    _layer("v2.b7-10.expand", "conv", 14,  64,  384, 1, 1, "relu6", v2=4),
    _layer("v2.b7-10.dw",  "dw",     14,  384,  384, 3, 1, "relu6", v2=4),
    _layer("v2.b7-9.project", "conv", 14, 384,   64, 1, 1, "linear", v2=3),
    _layer("v2.b10.project", "conv", 14,  384,   96, 1, 1, "linear", v2=1),
    _layer("v2.b11-13.expand", "conv", 14, 96,  576, 1, 1, "relu6", v2=3),
    _layer("v2.b11-12.dw", "dw",     14,  576,  576, 3, 1, "relu6", v2=2),
    _layer("v2.b11-12.project", "conv", 14, 576,  96, 1, 1, "linear", v2=2),
    _layer("v2.b13.dw",    "dw",     14,  576,  576, 3, 2, "relu6", v2=1),
    _layer("v2.b13.project", "conv",  7,  576,  160, 1, 1, "linear", v2=1),
    _layer("v2.b14-16.expand", "conv", 7, 160,  960, 1, 1, "relu6", v2=3),
    _layer("v2.b14-16.dw", "dw",      7,  960,  960, 3, 1, "relu6", v2=3),
    _layer("v2.b14-15.project", "conv", 7, 960, 160, 1, 1, "linear", v2=2),
    _layer("v2.b16.project", "conv",  7,  960,  320, 1, 1, "linear", v2=1),
    _layer("v2.conv_last", "conv",    7,  320, 1280, 1, 1, "relu6", v2=1),
    _layer("v2.logits",    "dense",   1, 1280, 1000, 1, 1, "linear", v2=1),
    # ResNet-50 (Keras' ResNet50, 224x224): a 7x7/s2 stem 3 -> 64, then four stages of
    # bottleneck blocks at 56, 28, 14 and 7 px (3, 4, 6, 3 blocks): 1x1 reduce (stride 2
    # in a stage's first block but the first stage's), 3x3, 1x1 expand (linear; the
    # residual ADD and its ReLU follow), and in each stage's first block a 1x1 shortcut
    # of the expand's shape (stride 2 from the second stage on). Every shape, with how
    # often the net runs it (the first stage's shortcut is the expand's shape: x4).
    _layer("r50.stem",      "conv",  224,    3,   64, 7, 2, "relu", r50=1, d121=1),
    _layer("r50.s2.reduce0", "conv",  56,   64,   64, 1, 1, "relu", r50=1),
    _layer("r50.s2.reduce", "conv",   56,  256,   64, 1, 1, "relu", r50=2),
    _layer("r50.s2.3x3",    "conv",   56,   64,   64, 3, 1, "relu", r50=3),
    _layer("r50.s2.expand", "conv",   56,   64,  256, 1, 1, "linear", r50=4),
    _layer("r50.s3.reduce0", "conv",  56,  256,  128, 1, 2, "relu", r50=1),
    _layer("r50.s3.reduce", "conv",   28,  512,  128, 1, 1, "relu", r50=3),
    _layer("r50.s3.3x3",    "conv",   28,  128,  128, 3, 1, "relu", r50=4),
    _layer("r50.s3.expand", "conv",   28,  128,  512, 1, 1, "linear", r50=4),
    _layer("r50.s3.short",  "conv",   56,  256,  512, 1, 2, "linear", r50=1),
    _layer("r50.s4.reduce0", "conv",  28,  512,  256, 1, 2, "relu", r50=1),
    _layer("r50.s4.reduce", "conv",   14, 1024,  256, 1, 1, "relu", r50=5),
    _layer("r50.s4.3x3",    "conv",   14,  256,  256, 3, 1, "relu", r50=6),
    _layer("r50.s4.expand", "conv",   14,  256, 1024, 1, 1, "linear", r50=6),
    _layer("r50.s4.short",  "conv",   28,  512, 1024, 1, 2, "linear", r50=1),
    _layer("r50.s5.reduce0", "conv",  14, 1024,  512, 1, 2, "relu", r50=1),
    _layer("r50.s5.reduce", "conv",    7, 2048,  512, 1, 1, "relu", r50=2),
    _layer("r50.s5.3x3",    "conv",    7,  512,  512, 3, 1, "relu", r50=3),
    _layer("r50.s5.expand", "conv",    7,  512, 2048, 1, 1, "linear", r50=3),
    _layer("r50.s5.short",  "conv",   14, 1024, 2048, 1, 2, "linear", r50=1),
    _layer("r50.logits",    "dense",   1, 2048, 1000, 1, 1, "linear", r50=1),
    # InceptionV3 (299x299), its characteristic convolutions rather than all ~95 of
    # them: the stem's 3x3s at 147 and 71 px, the 35x35 blocks' 5x5 and 3x3 branches,
    # the 17x17 blocks' factorized 1x7 / 7x1 (128, 160 and 192 channels) and the 8x8
    # blocks' 1x3 / 3x1 and 3x3. SAME padding throughout (the stem's VALID convs lose a
    # pixel row and column there; the work per pixel is the same). Uses: how often the
    # net runs the shape.
    _layer("i3.stem2",      "conv",  147,   32,   32, 3, 1, "relu", i3=1),
    _layer("i3.stem3",      "conv",  147,   32,   64, 3, 1, "relu", i3=1),
    _layer("i3.stem5",      "conv",   71,   80,  192, 3, 1, "relu", i3=1),
    _layer("i3.35.5x5",     "conv",   35,   48,   64, 5, 1, "relu", i3=3),
    _layer("i3.35.3x3a",    "conv",   35,   64,   96, 3, 1, "relu", i3=4),
    _layer("i3.35.3x3b",    "conv",   35,   96,   96, 3, 1, "relu", i3=3),
    _layer("i3.17.1x7",     "conv",   17,  128,  128, (1, 7), 1, "relu", i3=3),
    _layer("i3.17.7x1",     "conv",   17,  128,  192, (7, 1), 1, "relu", i3=2),
    _layer("i3.17.1x7_160", "conv",   17,  160,  160, (1, 7), 1, "relu", i3=6),
    _layer("i3.8.1x3",      "conv",    8,  384,  384, (1, 3), 1, "relu", i3=4),
    _layer("i3.8.3x3",      "conv",    8,  448,  384, 3, 1, "relu", i3=2),
    # DenseNet-121 (224x224): every dense layer is a 1x1 bottleneck (its input channels
    # grow by 32 a layer) to 128, then a 3x3 128 -> 32; the 3x3 shapes are all here, the
    # bottlenecks by their first and last input width per block, the transitions' 1x1s
    # (the stem is ResNet-50's shape). DenseNet normalizes and activates before each
    # convolution, so its convolutions are linear.
    _layer("d121.b1.3x3",   "conv",   56,  128,   32, 3, 1, "linear", d121=6),
    _layer("d121.b2.3x3",   "conv",   28,  128,   32, 3, 1, "linear", d121=12),
    _layer("d121.b3.3x3",   "conv",   14,  128,   32, 3, 1, "linear", d121=24),
    _layer("d121.b4.3x3",   "conv",    7,  128,   32, 3, 1, "linear", d121=16),
    _layer("d121.b1.bn64",  "conv",   56,   64,  128, 1, 1, "linear", d121=1),
    _layer("d121.b3.bn992", "conv",   14,  992,  128, 1, 1, "linear", d121=1),
    _layer("d121.t1",       "conv",   56,  256,  128, 1, 1, "linear", d121=1),
    _layer("d121.t3",       "conv",   14, 1024,  512, 1, 1, "linear", d121=1),
)
assert len({layer.name for layer in LAYERS}) == len(LAYERS), "duplicate layer name"


# ----------------------------------------------------------------- TFLite models

def bench_dir() -> Path:
    """``$TVM_ARMQ_HOME/bench`` if set, else ``~/.cache/tvm_armq/bench``."""
    home = os.environ.get("TVM_ARMQ_HOME")
    root = Path(home).expanduser() if home else Path.home() / ".cache" / "tvm_armq"
    return root / "bench" / f"v{BENCH_VERSION}"


def _keras_model(layer: Layer, rng):
    """The float Keras model of one layer, weights drawn from ``rng`` as the zoo does."""
    act = None if layer.act == "linear" else layer.act

    def make(L):
        if layer.op == "dense":
            return L.Dense(layer.out_c, activation=act, name="dense")
        if layer.op == "dw":
            return L.DepthwiseConv2D(layer.kernel, strides=layer.stride, padding="same",
                                     activation=act, name="dwconv")
        return L.Conv2D(layer.out_c, layer.kernel, strides=layer.stride, padding="same",
                        activation=act, name="conv")

    return zoo.single_layer([layer.input_shape], make, rng)


def tflite_model(layer: Layer) -> Path:
    """The layer's single-op int8 .tflite, built with the zoo's converter settings (seeded
    weights and calibration data) on first use and cached with a JSON sidecar that names
    the layer, the versions and the file's sha256."""
    path = bench_dir() / f"{layer.symbol}.tflite"
    sidecar = path.with_suffix(".json")
    want = {"layer": dataclasses.asdict(layer), "bench_version": BENCH_VERSION,
            "zoo_version": zoo.ZOO_VERSION}
    try:
        meta = json.loads(sidecar.read_text())
        if (all(meta.get(k) == json.loads(json.dumps(v)) for k, v in want.items())
                and meta.get("sha256") == hashlib.sha256(path.read_bytes()).hexdigest()):
            return path
    except (OSError, ValueError):
        pass
    spec = zoo.ModelSpec(layer.symbol, lambda rng: _keras_model(layer, rng),
                         (layer.input_shape,), layer.describe(), op=TFLITE_OP[layer.op])
    data = zoo.convert(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    zoo.atomic_write(path, data)  # model first, sidecar last (marks the pair complete)
    meta = dict(want, tensorflow_version=zoo.tensorflow().__version__,
                sha256=hashlib.sha256(data).hexdigest())
    zoo.atomic_write(sidecar, (json.dumps(meta, indent=1) + "\n").encode())
    return path


# ----------------------------------------------------------------- tvm_armq kernels

def depthwise_api():
    """``schedules.depthwise`` if it has the API this script uses, else the reason why not
    (the schedule may still be changing; conv / dense are benched regardless). The API is
    probed by building, scheduling and packing a small 3x3 layer the way the bench does."""
    try:
        from tvm_armq.schedules import depthwise as dw

        shape = dw.DepthwiseShape(1, 4, 4, dw.LANES, padding=(1, 1, 1, 1))
        func = dw.depthwise_func(shape, in_zp=0, out_zp=0, act_range=(-128, 127))
        dw.schedule_depthwise(func, shape, parallel=False)
        taps = np.ones((1, shape.kh, shape.kw, shape.out_c), np.int8)
        channels = np.ones(shape.out_c, np.int32)
        dw.pack_params(taps, channels, channels, -channels, shape, in_zp=0)
        dw.default_channel_block(shape)
    except Exception as err:  # noqa: BLE001 - whatever fails, the answer is: skip depthwise
        return (f"schedules.depthwise does not offer the API used here "
                f"({type(err).__name__}: {err})")
    return dw


@dataclasses.dataclass
class LayerKernel:
    """A scheduled PrimFunc with its arguments (inputs, packed weights, ..., output)."""

    func: object  # tvm.tirx.PrimFunc, named ``layer.symbol``
    args: list[np.ndarray]  # every parameter in order; the last is the (zeroed) output
    name: str  # micro-kernel (conv / dense) or depthwise variant


def _requant_params(q) -> tuple[np.ndarray, np.ndarray]:
    mult, shift = requant.quantize_multipliers(q.real_scales())
    return mult.astype(np.int32), shift.astype(np.int32)


def _conv_kernel(layer: Layer, q, x, target) -> LayerKernel:
    """conv2d / dense through the GEMM schedule with the level's best micro-kernel."""
    if q.op == "FULLY_CONNECTED":
        rows, k = q.input_shape
        shape = Conv2DShape.dense(rows, k, q.weight.shape[0])
    else:
        _, h, w, c = q.input_shape
        _, kh, kw, _ = q.weight.shape
        shape = Conv2DShape(1, h, w, c, q.weight.shape[0], kh, kw, strides=q.strides,
                            dilation=q.dilation, padding=q.padding, groups=q.groups)
    micro = kernels.select(target, "int8", "int8", rows=shape.gemm_m, depth=shape.gemm_k)
    mult, shift = _requant_params(q)
    # built as the compiler builds it (tvm_armq.passes.gemm): one plan (a pointwise layer
    # may read its input in place), for the layer's largest shift, and with TFLite's
    # rounding of the op (passes.gemm.requant_rounding: FC once, conv twice)
    knobs = dataclasses.replace(gemm_plan.default_knobs(shape, micro, parallel=False),
                                **KNOB_OVERRIDES)
    plan = gemm_plan.plan(shape, micro, knobs=knobs)
    f = gemm_compute.conv2d_gemm_func(plan, in_zp=q.in_zp, out_zp=q.out_zp,
                                      act_range=q.act_range, max_shift=int(shift.max()),
                                      min_shift=int(shift.min()),
                                      rounding="single" if q.op == "FULLY_CONNECTED"
                                      else "double")
    f = gemm_schedule.schedule_conv2d_gemm(f, plan, target).with_attr("global_symbol",
                                                                      layer.symbol)
    w = q.weight_hwio()
    out = np.zeros((shape.gemm_m, shape.groups, shape.gemm_n), np.int8)
    args = [x.reshape(shape.batch, shape.in_h, shape.in_w, shape.in_c),
            pack_weights(w, plan.main.tile, shape.groups), fold_bias(w, q.bias, q.in_zp),
            mult, shift, out]
    tail = " +1-row tail" if plan.tail is not None else ""
    return LayerKernel(f, args, f"{micro.name} {knobs.m_tiles}x{knobs.n_tiles}"
                                f"/k{knobs.k_unroll}{tail}")


def _depthwise_kernel(layer: Layer, q, x, dw) -> LayerKernel:
    """Depthwise conv2d through ``schedules.depthwise`` (single thread)."""
    _, h, w, c = q.input_shape
    _, kh, kw, oc = q.weight.shape
    shape = dw.DepthwiseShape(1, h, w, c, multiplier=oc // c, kh=kh, kw=kw,
                              strides=q.strides, dilation=q.dilation, padding=q.padding)
    mult, shift = _requant_params(q)
    options = dict(int16_pairs=bool(q.weight.min() > -128), max_shift=int(shift.max()),
                   min_shift=int(shift.min()))
    f = dw.depthwise_func(shape, in_zp=q.in_zp, out_zp=q.out_zp, act_range=q.act_range,
                          **options)
    f = dw.schedule_depthwise(f, shape, parallel=False).with_attr("global_symbol",
                                                                  layer.symbol)
    params = dw.pack_params(q.weight, q.bias, mult, shift, shape, in_zp=q.in_zp, **options)
    out = np.zeros((1, shape.out_h, shape.out_w, shape.out_c), np.int8)
    name = f"depthwise cb{dw.default_channel_block(shape)} smull/smlal"
    return LayerKernel(f, [x] + params + [out], name)


def make_kernel(layer: Layer, q, x, level: str, dw) -> LayerKernel:
    """The layer's tvm_armq kernel for ``level`` from the model's parameters ``q``, on
    input ``x``; checked to take arguments of exactly its PrimFunc's buffer shapes and
    to have an output of TFLite's size."""
    kern = (_depthwise_kernel(layer, q, x, dw) if layer.op == "dw"
            else _conv_kernel(layer, q, x, targets.resolve(level)))
    for param, arr in zip(kern.func.params, kern.args, strict=True):  # params are buffers
        want = (tuple(int(d) for d in param.shape), str(param.dtype))
        if want != (arr.shape, arr.dtype.name):
            raise AssertionError(f"{layer.name}: argument {param.name} is {arr.dtype}"
                                 f"{arr.shape}, the PrimFunc wants {want[1]}{want[0]}")
    if kern.args[-1].size != int(np.prod(layer.output_shape)):
        raise AssertionError(f"{layer.name}: kernel output {kern.args[-1].shape} does not "
                             f"hold TFLite's {layer.output_shape}")
    return kern


def check_layer(layer: Layer, model_path: Path):
    """The host-side guard, once per layer: the model holds the op and shapes the table
    says, and the NumPy reference computed from the parameters read from the file
    (``read_layer``) equals TFLite's reference kernels. Returns (parameters, input)."""
    model = TFLiteModel.load(model_path)
    q = read_layer(model_path)
    if (q.op, q.input_shape, q.output_shape) != (TFLITE_OP[layer.op], layer.input_shape,
                                                 layer.output_shape):
        raise AssertionError(f"{layer.name}: the model holds {q.op} {q.input_shape} -> "
                             f"{q.output_shape}, the table says {TFLITE_OP[layer.op]} "
                             f"{layer.input_shape} -> {layer.output_shape}")
    (x,) = model.random_inputs(seed=0)
    kw = dict(strides=q.strides, dilation=q.dilation, padding=q.padding)
    if q.op == "FULLY_CONNECTED":
        acc = ref.dense(x, q.weight.T, q.bias, in_zp=q.in_zp)
    elif q.op == "DEPTHWISE_CONV_2D":
        acc = ref.depthwise_conv2d_nhwc(x, q.weight, q.bias, in_zp=q.in_zp,
                                        multiplier=q.weight.shape[-1] // q.input_shape[-1],
                                        **kw)
    else:
        acc = ref.conv2d_nhwc(x, q.weight_hwio(), q.bias, in_zp=q.in_zp, groups=q.groups,
                              **kw)
    expected = ref.requantize(acc, *_requant_params(q), q.out_zp, *q.act_range, "int8")
    (y,) = model.reference_outputs([x])
    if expected.shape != y.shape or not np.array_equal(expected, y):
        raise AssertionError(f"{layer.name}: the host reference {expected.shape} differs "
                             f"from TFLite's {y.shape} output")
    return q, x


def export_kernel(kern: LayerKernel, level: str, workdir: Path, symbol: str) -> tuple[Path, Path]:
    """The kernel's aarch64 shared library and an .npz of its arguments (arg0, arg1, ...)."""
    import tvm

    ex = tvm.compile(tvm.IRModule({symbol: kern.func}), target=targets.resolve(level))
    lib = export.export_aarch64(ex, workdir / f"{symbol}-{level}.so")
    npz = workdir / f"{symbol}.npz"
    np.savez(npz, **{f"arg{i}": a for i, a in enumerate(kern.args)})
    return lib, npz


# Runs inside armperf's emulated aarch64 Python (numpy and the tvm runtime only):
# setup(args) loads the kernel and its arguments and returns one call of it.
GUEST_SETUP = textwrap.dedent('''\
    import numpy as np
    import tvm


    def setup(args):
        lib_path, npz_path, symbol = args
        dev = tvm.cpu()
        func = tvm.runtime.load_module(lib_path)[symbol]
        with np.load(npz_path) as saved:
            tensors = [tvm.runtime.tensor(saved[f"arg{i}"], dev)
                       for i in range(len(saved.files))]
        return lambda: func(*tensors)
''')


# ----------------------------------------------------------------- armperf

def armperf(armperf_py: Path, kind: str, path: Path, level: str, runs: int, top: int,
            args=()) -> dict:
    """One ``armperf.py tflite|script`` run; its figures for the workload."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, str(armperf_py), kind, str(path), "--isa", level,
               "--runs", str(runs), "--top", str(top), "--json", out.name]
        for a in args:
            cmd += ["--arg", str(a)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"armperf {kind} {path.name} at {level} failed:\n"
                               f"{(res.stderr or res.stdout)[-2000:]}")
        return json.loads(Path(out.name).read_text())[kind]


def _hot(result: dict) -> list[dict]:
    """The hottest blocks of an armperf result, with their share of the run."""
    return [dict(h, share=h["cycles"] / result["cycles_per_run"]) for h in result["hot"]]


# ----------------------------------------------------------------- output

COLUMNS = ("layer", "shape", "isa", "tflite cyc", "tvm_armq cyc", "tflite/tvm", "kernel")
ROW_FORMAT = "{:18s} {:30s} {:8s} {:>12s} {:>13s} {:>10s}  {}"
TOTAL_FORMAT = "{:18s} {:8s} {:>7s} {:>12s} {:>13s} {:>10s}"


def print_row(row: dict) -> None:
    print(ROW_FORMAT.format(row["layer"], row["shape"], row["isa"], f"{row['tflite']:.4g}",
                            f"{row['tvm_armq']:.4g}", f"{row['tflite_over_tvm_armq']:.3f}",
                            row["kernel"]), flush=True)


def totals(rows: list[dict], selected: list[Layer], models) -> list[dict]:
    """Per model and level: sums over the measured layers, each times its use count."""
    by_name = {layer.name: layer for layer in selected}
    out = []
    for model in models:
        for level in dict.fromkeys(r["isa"] for r in rows):
            mine = [(r, by_name[r["layer"]].count(model)) for r in rows
                    if r["isa"] == level and by_name[r["layer"]].count(model)]
            if not mine:
                continue
            tfl = sum(r["tflite"] * n for r, n in mine)
            tvm = sum(r["tvm_armq"] * n for r, n in mine)
            out.append({"model": model, "isa": level, "layers": len(mine),
                        "armperf": max(r["armperf"] for r, _ in mine),
                        "instances": sum(n for _, n in mine), "tflite": tfl, "tvm_armq": tvm,
                        "tflite_over_tvm_armq": tfl / tvm})
    return out


def print_totals(tots: list[dict]) -> None:
    print()
    print(TOTAL_FORMAT.format("model", "isa", "layers", "tflite cyc", "tvm_armq cyc",
                              "tflite/tvm"))
    for t in tots:
        print(TOTAL_FORMAT.format(t["model"], t["isa"], f"{t['layers']}/{t['instances']}",
                                  f"{t['tflite']:.4g}", f"{t['tvm_armq']:.4g}",
                                  f"{t['tflite_over_tvm_armq']:.3f}"))
    print("(layers: distinct shapes measured / layer instances they stand for in the model)")
    versions = sorted({t["armperf"] for t in tots})
    print(f"(figures: armperf version {', '.join(map(str, versions))}, as it prices them)")


def write_png(rows: list[dict], path: Path) -> None:
    """Grouped bars: tflite / tvm_armq per layer, one bar per level (matplotlib if present)."""
    try:
        import matplotlib
    except ImportError:
        print(f"--png: matplotlib is not installed, no chart written to {path}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = list(dict.fromkeys(r["layer"] for r in rows))
    levels = list(dict.fromkeys(r["isa"] for r in rows))
    ratio = {(r["layer"], r["isa"]): r["tflite_over_tvm_armq"] for r in rows}
    width = 0.8 / len(levels)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(layers) * len(levels)), 5))
    xs = np.arange(len(layers))
    for i, level in enumerate(levels):
        ax.bar(xs + i * width, [ratio.get((n, level), np.nan) for n in layers], width,
               label=level)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(xs + width * (len(levels) - 1) / 2, layers, rotation=75, fontsize=8)
    ax.set_ylabel("TFLite cycles / tvm_armq cycles (above 1: tvm_armq faster)")
    ax.set_title("Estimated cycles per layer, armperf, single thread")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    print(f"chart written to {path}")


# ----------------------------------------------------------------- main

def select_layers(models, pattern, limit) -> list[Layer]:
    rx = re.compile(pattern) if pattern else None
    chosen = [layer for layer in LAYERS if any(layer.count(m) for m in models)
              and (rx is None or rx.search(layer.name))]
    return chosen[:limit] if limit else chosen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--layers", metavar="REGEX", help="only layers whose name matches")
    ap.add_argument("--isa", nargs="+", default=list(LEVELS), choices=list(LEVELS))
    ap.add_argument("--limit", type=int, metavar="N", help="only the first N selected layers")
    ap.add_argument("--runs", type=int, default=2, help="measured calls per armperf run")
    ap.add_argument("--top", type=int, default=5, help="hot blocks kept per measurement")
    armperf_tool.add_option(ap)
    ap.add_argument("--json", type=Path, help="write the rows and totals here")
    ap.add_argument("--results", type=Path, metavar="JSON",
                    help="write the rows without their hot blocks here: the per-layer table's "
                         "data (scripts/results/layers.json, rendered by render_results.py)")
    ap.add_argument("--png", type=Path, help="bar chart of the ratios (needs matplotlib)")
    ap.add_argument("--list", action="store_true", help="print the layer table and exit")
    ap.add_argument("--knobs", metavar="NAME=INT,...", default="",
                    help="override GEMM knobs of every conv / dense layer")
    a = ap.parse_args()
    for item in filter(None, a.knobs.split(",")):
        name, _, value = item.partition("=")
        if name not in {f.name for f in dataclasses.fields(gemm_plan.GemmKnobs)} or not value:
            ap.error(f"--knobs: {item!r} is not NAME=INT with a GemmKnobs field name")
        KNOB_OVERRIDES[name] = int(value)

    selected = select_layers(a.models, a.layers, a.limit)
    if a.list:
        for layer in selected:
            uses = ", ".join(f"{m} x{n}" for m, n in layer.uses)
            print(f"{layer.name:18s} {layer.describe():30s} {layer.act:6s} {uses}")
        return 0
    armperf_tool.require(ap, a.armperf)
    if not selected:
        ap.error("no layer selected")
    dw = depthwise_api()
    if isinstance(dw, str):
        print(f"note: depthwise layers skipped: {dw}", flush=True)
        selected = [layer for layer in selected if layer.op != "dw"]

    rows = []
    print(ROW_FORMAT.format(*COLUMNS), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_layers-") as tmp:
        workdir = Path(tmp)
        setup_py = workdir / "kernel_setup.py"
        setup_py.write_text(GUEST_SETUP)
        for layer in selected:
            model_path = tflite_model(layer)
            q, x = check_layer(layer, model_path)
            for level in a.isa:
                kern = make_kernel(layer, q, x, level, dw)
                lib, npz = export_kernel(kern, level, workdir, layer.symbol)
                tfl = armperf(a.armperf, "tflite", model_path, level, a.runs, a.top)
                tvm = armperf(a.armperf, "script", setup_py, level, a.runs, a.top,
                              args=(lib, npz, layer.symbol))
                row = {"layer": layer.name, "op": TFLITE_OP[layer.op],
                       "shape": layer.describe(), "act": layer.act, "uses": dict(layer.uses),
                       "isa": level, "core": tvm["core"], "tflite": tfl["cycles_per_run"],
                       "tvm_armq": tvm["cycles_per_run"],
                       "tflite_over_tvm_armq": tfl["cycles_per_run"] / tvm["cycles_per_run"],
                       "kernel": kern.name, "tflite_insns": tfl["insns_per_run"],
                       "tvm_armq_insns": tvm["insns_per_run"],
                       "armperf": tvm.get("armperf", 1), "tflite_hot": _hot(tfl),
                       "tvm_armq_hot": _hot(tvm)}
                rows.append(row)
                print_row(row)
    tots = totals(rows, selected, a.models)
    print_totals(tots)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "totals": tots}, indent=1))
    if a.results:
        a.results.write_text(json.dumps([{k: v for k, v in r.items() if not k.endswith("_hot")
                                          and not k.endswith("_insns") and k != "core"}
                                         for r in rows], indent=1))
    if a.png:
        write_png(rows, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
