"""Whole models through ``import tvm_armq`` + ``tvm.compile``, bit-exact against TFLite.

Every zoo model (the single ops and the nets: MobileNetV1 0.25 and 1.0, MobileNetV2 1.0,
the ResNet-style and the Inception-style block, MobileNetV3-Small, EfficientNet-B1,
DenseNet-121 and -169, Xception, InceptionV3, ResNet-50, the DS-CNN keyword spotter, the
SSD-style detector with its two outputs, the model of two inputs and two outputs, the U-Net
with its TRANSPOSE_CONV and RESIZE_BILINEAR) is compiled for an ISA level with
``compile_tflite``, run on that level's emulated device and compared with TFLite's
reference kernels: every output element must be equal, and every output of TFLite must
really vary (``armq_checks.output_pairs``). The compile report of those very modules says
which kernel each quantized layer became: no layer of a model with integer kernels stays
float, and the integer paths that only the small zoo models reach (MUL, SOFTMAX, LOGISTIC,
a QUANTIZE requantizing a CONCATENATION's input) are named in it; the float fallback
model really falls back.

Which (model, level) pairs the fast tier runs (the rest are ``exhaustive``):
- the small nets and the single-op models whose kernels depend on the level (GEMMs,
  depthwise) at every level;
- each big net (``BIG_NETS``), each attention-era net (``ATTENTION_NETS``) and
  MobileNetV3-Small (``ONE_LEVEL_SMALL_NETS``) at one level, the levels taken in turn so
  that each level runs such nets too; the five slowest nets (``EXHAUSTIVE_ONLY_NETS``) in
  the exhaustive tier only;
- the single-op models whose kernels are the same ``_neon`` ones at every level
  (``LEVEL_INDEPENDENT``, checked by ``test_level_independent_models_are``) at one level,
  again in turn.
"""

from __future__ import annotations

import dataclasses

import pytest
from armq_checks import one_level_in_turn, output_pairs, same_code_at_every_level, tier

from tvm_armq import zoo
from tvm_armq.targets import LEVELS as _LEVELS
from tvm_armq.report import Fallback, Lowered

pytestmark = pytest.mark.device

NETS = ["mobilenet_v1_0.25", "mobilenet_v1_1.0", "mobilenet_v2_1.0", "resnet_block",
        "inception_block", "mobilenet_v3_small", "efficientnet_b1", "densenet121",
        "ds_cnn", "ssd_head", "two_in_two_out", "xception", "densenet169", "inception_v3",
        "resnet50",
        "unet", "layer_norm", "dense_4d_shape_chain", "vit", "bert_encoder", "mobilevit",
        "convnext"]
# The nets whose compile and run at one level take minutes: the fast tier runs each at the
# one level given here (each level gets some), the exhaustive tier at the other two.
BIG_NETS = {"mobilenet_v1_1.0": "neon", "mobilenet_v2_1.0": "dotprod", "densenet121": "i8mm"}
# The five slowest nets run in the exhaustive tier only (at every level), to keep the fast
# tier inside CI's budget: InceptionV3 (97 s at one level; its 1x7 / 7x1 / 3x3 branches,
# average pools and concatenations are inception_block's, which the fast tier runs at every
# level), ResNet-50 (its bottlenecks are resnet_block's 1x1 and 3x3 convolutions and
# residual ADDs at ImageNet's sizes), EfficientNet-B1 (80 s in CI; its swish is the
# single-op swish model's and MobileViT's, its squeeze-excite blocks MobileNetV3-Small's),
# DenseNet-169 (76 s; DenseNet-121's layer shapes at 64 px, more of them) and Xception (64 s
# in CI; its separable convolutions, residual ADDs and stride-2 max pools are
# mobilenet_v1's, resnet_block's and max_pool's, which the fast tier runs).
EXHAUSTIVE_ONLY_NETS = ("inception_v3", "resnet50", "efficientnet_b1", "densenet169",
                        "xception")
# The attention-era nets, also at one level each in the fast tier: what differs between
# levels in them, the GEMMs of BATCH_MATMUL and FULLY_CONNECTED, the fast tier runs at every
# level in the single-op models (batch_matmul, batch_matmul_adj, fully_connected_3d) and in
# tests/test_batch_matmul.py; their other kernels are the same _neon ones at every level.
ATTENTION_NETS = {"layer_norm": "neon", "vit": "dotprod", "bert_encoder": "i8mm",
                  "mobilevit": "neon", "convnext": "i8mm", "dense_4d_shape_chain": "dotprod"}
# MobileNetV3-Small at one level too (20 s a level in CI): what differs between levels in it,
# its 1x1 GEMMs and 3x3 / 5x5 depthwise layers, the fast tier runs at every level in the
# single-op models and in tests/test_conv2d_gemm.py and tests/test_depthwise.py.
ONE_LEVEL_SMALL_NETS = {"mobilenet_v3_small": "neon"}
ONE_LEVEL_NETS = {**BIG_NETS, **ATTENTION_NETS, **ONE_LEVEL_SMALL_NETS}
# Ops tvm_armq has no integer kernel for: they stay float (dequantize -> op -> quantize),
# which rounds once where TFLite's integer kernel rounds in fixed point, so an output can
# land one step off. Bound: at most one step, on at most this share of the outputs.
FLOAT_FALLBACK = {"log_softmax": 0.05}
SINGLE_OPS = [n for n in zoo.names() if n not in NETS and n not in FLOAT_FALLBACK]
# Single-op models that compile to the same kernels at every level, each named ``_neon``
# (or to none: TVM's own int8 code for a pool or a pad; or to float, the fallback model):
# the same code runs at each level, so the fast tier runs each at one level, in turn.
LEVEL_INDEPENDENT = ["add", "avg_pool", "max_pool", "concat", "mean", "pad", "mul", "softmax",
                     "concat_requant", "logistic", "sub", "resize_bilinear", "log_softmax",
                     "gelu", "gelu_tanh"]
SEEDS = (0, 1)
LEVELS = tuple(_LEVELS)


def fast_levels(name: str) -> tuple[str, ...]:
    """The levels at which the fast tier runs model ``name``."""
    if name in EXHAUSTIVE_ONLY_NETS:
        return ()
    if name in ONE_LEVEL_NETS:
        return (ONE_LEVEL_NETS[name],)
    if name in LEVEL_INDEPENDENT:
        return (one_level_in_turn(LEVEL_INDEPENDENT.index(name)),)
    return LEVELS


def tiered(names) -> list:
    """(level, name) of every model at every level, those outside ``fast_levels`` marked
    ``exhaustive``."""
    return [tier(level, name, id=f"{level}-{name}", fast=level in fast_levels(name))
            for name in names for level in LEVELS]


# Integer paths no net of the zoo contains, and the (op, kernel) of the ``Lowered``
# record each must leave in its model's compile report (a kernel given per level as
# (level, kernel) pairs where the levels' kernels differ). concat_requant is what TFLite's
# converter makes of a concatenation of differently scaled inputs: a standalone QUANTIZE
# (int8 -> int8) requantizes one input, then a CONCATENATION of equally scaled tensors
# copies (TFLite refuses an int8 CONCATENATION whose inputs' scales differ, so the pass's
# in-concat requantization, "concat_s8_neon+requantize_s8_neon", has no model to come from).
INTEGER_PATHS = {
    "mul": {("multiply", "multiply_s8_neon")},
    "logistic": {("logistic", "lut_s8_neon")},
    "softmax": {("softmax", "softmax_s8_neon")},
    "concat_requant": {("quantize", "requantize_s8_neon"), ("concat", "concat_s8_neon")},
    "sub": {("subtract", "subtract_s8_neon")},
    "mobilenet_v3_small": {("hard_swish", "lut_s8_neon"), ("multiply", "multiply_s8_neon")},
    "densenet121": {("multiply", "multiply_s8_neon"), ("add", "add_s8_neon")},
    # swish, x * LOGISTIC(x), is one table of x; squeeze-excite's gate a MUL
    # and its 5x5 depthwise layers keep the widening form at every level (DOT_MAX_TAPS)
    "efficientnet_b1": {("logistic", "lut_s8_neon"), ("multiply", "lut_s8_neon"),
                        ("multiply", "multiply_s8_neon"),
                        ("depthwise_conv2d", "depthwise_s8s8s32_5x5_neon_pairs16")},
    # a 3x3 depthwise: taps in fours through sdot where the level has it
    "ds_cnn": {("depthwise_conv2d", (("neon", "depthwise_s8s8s32_3x3_neon_pairs16"),
                                     ("dotprod", "depthwise_s8s8s32_3x3_dotprod"),
                                     ("i8mm", "depthwise_s8s8s32_3x3_dotprod"))),
               ("mean", "mean_s8_neon")},
    "ssd_head": {("logistic", "lut_s8_neon"), ("concat", "concat_s8_neon")},
    "two_in_two_out": {("add", "add_s8_neon"), ("concat", "concat_s8_neon")},
    "densenet169": {("multiply", "multiply_s8_neon"), ("add", "add_s8_neon")},
    "resize_bilinear": {("resize_bilinear", "resize_bilinear_s8_neon")},
    "unet": {("resize_bilinear", "resize_bilinear_s8_neon"), ("concat", "concat_s8_neon")},
    # attention: Q.K^T and P.V of run-time tensors, softmax over the last axis; each
    # LayerNorm's thirteen ops one row kernel; GELU a table; the class token a
    # CONCATENATION of a constant
    "vit": {("batch_matmul", (("neon", "gemm_s8s8s32_4x4x16_neon"),
                              ("dotprod", "gemm_s8s8s32_4x4x4_dotprod"),
                              ("i8mm", "gemm_s8s8s32_2x2x8_i8mm"))),
            ("gelu", "lut_s8_neon"), ("layer_norm", "layer_norm_s8_neon"),
            ("softmax", "softmax_s8_neon"), ("concat", "concat_s8_neon")},
    "bert_encoder": {("gelu", "lut_s8_neon"), ("softmax", "softmax_s8_neon"),
                     ("layer_norm", "layer_norm_s8_neon")},
    # a 7x7 depthwise, a per-pixel LayerNorm (the converter folds the layer scale, a MUL
    # by a per-channel constant after a Dense, into the Dense's weights)
    "convnext": {("gelu", "lut_s8_neon"), ("layer_norm", "layer_norm_s8_neon"),
                 ("depthwise_conv2d", "depthwise_s8s8s32_7x7_neon_pairs16")},
    "mobilevit": {("softmax", "softmax_s8_neon"), ("concat", "concat_s8_neon"),
                  ("layer_norm", "layer_norm_s8_neon")},
    # the LayerNorm chain alone
    "layer_norm": {("layer_norm", "layer_norm_s8_neon")},
}


@dataclasses.dataclass
class Compiled:
    """One model at one level: its compile report and, per seed, (outputs, TFLite's)."""

    report: list
    runs: list


@pytest.fixture
def outputs(compiled_models):
    """``outputs(level, name)`` -> ``Compiled``: the zoo model compiled at the level once
    in this module, run on every seed."""
    return lambda level, name: Compiled(*compiled_models(level, name, zoo.build(name), SEEDS))


@pytest.mark.parametrize("level, name", tiered(NETS + SINGLE_OPS))
def test_model_is_bit_exact(outputs, level, name, report):
    compiled = outputs(level, name)
    fallbacks = [r.line() for r in compiled.report if isinstance(r, Fallback)]
    assert fallbacks == [], f"{name} at {level}: layers left in float:\n" + "\n".join(fallbacks)
    assert len(compiled.runs) == len(SEEDS)
    for seed, (got, expected) in zip(SEEDS, compiled.runs):
        for g, e, diff in output_pairs(got, expected, f"{name} at {level}, seed {seed}"):
            report(f"tvm_armq   {name:18s} {level:8s} seed {seed} max|diff| {diff.max():3d}  "
                   f"differ {int((diff > 0).sum()):5d}/{diff.size}")
            assert diff.max() == 0, f"{name} at {level}, seed {seed}: {int((diff > 0).sum())} " \
                                    f"of {diff.size} outputs differ, by up to {diff.max()}"


@pytest.mark.parametrize("level, name", tiered(sorted(INTEGER_PATHS)))
def test_integer_path_runs_in_a_whole_model(outputs, level, name):
    """MUL, SUB, SOFTMAX, LOGISTIC, QUANTIZE, CONCATENATION after a requantization, and in
    the nets HARD_SWISH, the batch-norms left as MUL / ADD by constants, the detector's
    concatenations across scales and its LOGISTIC scores, ran on their integer kernels in
    the bit-exact modules: the compile report names each one."""
    assert name in SINGLE_OPS + NETS  # so test_model_is_bit_exact compares its outputs
    lowered = {(r.op, r.kernel) for r in outputs(level, name).report
               if isinstance(r, Lowered)}
    wanted = {(op, dict(kernel)[level] if isinstance(kernel, tuple) else kernel)
              for op, kernel in INTEGER_PATHS[name]}
    missing = wanted - lowered
    assert not missing, f"{name} at {level}: {sorted(missing)} not in {sorted(lowered)}"


@pytest.mark.parametrize("level, name", tiered(sorted(FLOAT_FALLBACK)))
def test_float_fallback_runs_within_one_step(outputs, level, name, report):
    """An op without an integer kernel still runs, in float, within one step of TFLite."""
    compiled = outputs(level, name)
    assert any(isinstance(r, Fallback) for r in compiled.report), \
        f"{name} at {level} did not fall back to float: {compiled.report}"
    assert len(compiled.runs) == len(SEEDS)
    for seed, (got, expected) in zip(SEEDS, compiled.runs):
        for g, e, diff in output_pairs(got, expected, f"{name} at {level}, seed {seed}"):
            report(f"tvm_armq   {name:18s} {level:8s} seed {seed} max|diff| {diff.max():3d}  "
                   f"differ {int((diff > 0).sum()):5d}/{diff.size}  (float fallback)")
            assert diff.max() <= 1 and (diff > 0).mean() <= FLOAT_FALLBACK[name]


def test_level_independent_models_are():
    """The models the fast tier runs at one level compile to the same kernels at every
    level, each a ``_neon`` one (or to none, or to float), and every other single-op model
    to kernels that differ between levels: it runs at all three. Nothing is built."""
    assert set(LEVEL_INDEPENDENT) <= set(SINGLE_OPS) | set(FLOAT_FALLBACK)
    for name in SINGLE_OPS + sorted(FLOAT_FALLBACK):
        assert same_code_at_every_level(zoo.build(name)) == (name in LEVEL_INDEPENDENT), name


def test_every_level_runs_a_big_net_and_every_model_runs_fast():
    """The fast tier's rotation leaves no level without a big net and no model out."""
    assert set(ONE_LEVEL_NETS) | set(EXHAUSTIVE_ONLY_NETS) <= set(NETS)
    assert set(BIG_NETS.values()) == set(LEVELS) == set(ATTENTION_NETS.values())
    assert all(fast_levels(name) for name in NETS + SINGLE_OPS + sorted(FLOAT_FALLBACK)
               if name not in EXHAUSTIVE_ONLY_NETS)
