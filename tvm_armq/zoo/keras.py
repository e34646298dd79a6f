"""Keras helpers shared by the zoo's model builders (``zoo``, ``zoo.transformers``):
TensorFlow imported on first use, named model inputs, seeded weights, batch-norm
statistics fitted to a batch, and a model of one layer. See ``zoo``'s docstring for why
weights are drawn this way (determinism, live activations)."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np


# --------------------------------------------------------------------------
# TensorFlow access (lazy)
# --------------------------------------------------------------------------


def tensorflow():
    """Import TensorFlow quietly, on first use only."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: PLC0415  (deliberately lazy)

    return tf


def named_inputs(spec_shapes: Sequence[tuple[int, ...]]):
    """Keras Input tensors with batch 1 and stable names (``input``, ``input_b``)."""
    keras = tensorflow().keras
    names_ = ["input", "input_b", "input_c"]
    return [
        keras.Input(shape=s[1:], batch_size=s[0], name=names_[i])
        for i, s in enumerate(spec_shapes)
    ]


# --------------------------------------------------------------------------
# Weight initialisation
# --------------------------------------------------------------------------


def weight_role(variable) -> str:
    """Short role of a Keras weight: 'kernel', 'bias', 'gamma', 'moving_mean', ..."""
    # Keras 3 names are bare ("kernel"); tf.keras 2 used "layer/kernel:0".
    return variable.name.split("/")[-1].split(":")[0]


def randomize_weights(model, rng: np.random.RandomState) -> None:
    """Overwrite every weight of ``model`` with values drawn from ``rng``.

    Kernels (a separable conv's two too): He-normal (std = sqrt(2 / fan_in)) so ReLU
    nets keep their activation scale.  Biases: N(0, 0.2), clearly non-zero.  BatchNorm:
    gamma U(0.5, 1.5), beta N(0.1, 0.2), moving stats (0, 1) -- nets then refit the moving
    stats with ``fit_batchnorm_stats``.  An input Normalization layer: the identity.
    """
    for layer in model.layers:
        for var in layer.weights:
            shape = tuple(var.shape)
            role = weight_role(var)
            if role == "depthwise_kernel":
                # (kh, kw, in_ch, multiplier): each output sees kh*kw inputs.
                fan_in = shape[0] * shape[1]
                value = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
            elif role in ("kernel", "pointwise_kernel"):
                # Conv (kh, kw, in_ch/groups, out), Dense (in, out), or the 1x1 half
                # of a separable conv (1, 1, in_ch * multiplier, out).
                fan_in = int(np.prod(shape[:-1]))
                value = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
            elif role == "bias":
                value = rng.normal(0.0, 0.2, shape)
            elif role == "gamma":
                value = rng.uniform(0.5, 1.5, shape)
            elif role == "beta":
                value = rng.normal(0.1, 0.2, shape)
            elif role == "moving_mean":
                value = np.zeros(shape)
            elif role == "moving_variance":
                value = np.ones(shape)
            elif role in ("class_token", "position_embedding"):
                # the attention models' learned tokens (zoo.transformers)
                value = rng.normal(0.0, 0.5, shape)
            elif role == "layer_scale":
                value = rng.uniform(0.5, 1.5, shape)
            elif role in ("mean", "variance", "count"):
                # an input Normalization layer's statistics (EfficientNet's): the
                # identity (mean 0, variance 1), as the un-adapted layer starts
                value = np.ones(shape) if role == "variance" else np.zeros(shape)
            else:
                raise ValueError(
                    f"zoo: don't know how to initialise weight {var.name!r} "
                    f"of layer {layer.name!r}"
                )
            var.assign(value.astype(np.float32))


def fit_batchnorm_stats(model, batch: np.ndarray | list[np.ndarray]) -> None:
    """Set each BN's moving mean/variance to the statistics of its real input.

    One forward pass in training mode with momentum 0 makes every BN normalise with
    the batch statistics *and* store exactly those as its moving statistics.  Since
    each layer saw the same inputs it will see in inference mode on this batch, the
    inference-mode net then reproduces the training-mode activations.  (Dropout is
    active in that pass too; in the Keras MobileNets it sits after the last BN, so
    it cannot affect any statistics.)
    """
    keras = tensorflow().keras
    bns = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.momentum = 0.0
    # keras.applications models built on ``input_tensor`` declare their inputs as
    # a one-element list; match that structure to avoid a Keras warning.  A model of
    # several inputs gets a list of batches, one per input, and takes it as it is.
    if isinstance(batch, list):
        inputs = batch
    else:
        inputs = [batch] if isinstance(model.input, list) else batch
    try:
        model(inputs, training=True)
    finally:
        for bn, m in zip(bns, saved):
            bn.momentum = m


def single_layer(shapes, make_layer, rng):
    """Model = one Keras layer applied to the inputs, weights from ``rng``."""
    keras = tensorflow().keras
    ins = named_inputs(shapes)
    layer = make_layer(keras.layers)
    out = layer(ins if len(ins) > 1 else ins[0])
    model = keras.Model(ins, out)
    randomize_weights(model, rng)
    return model
