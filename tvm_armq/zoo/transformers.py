"""The zoo's attention-era models: a ViT, a BERT-style encoder, a MobileViT-style hybrid,
a ConvNeXt-style net, and the single ops they are built from.

Each builder returns a float Keras model with seeded weights, as ``zoo``'s builders do;
``zoo`` registers them (``zoo.specs()``) and converts them to full-integer int8 TFLite.
What TFLite's converter makes of their layers (what the tests exercise):

    MultiHeadAttention  FULLY_CONNECTED on [1, tokens, width] for Q, K, V and the output
                        projection (``keep_num_dims``), RESHAPE + TRANSPOSE to heads,
                        BATCH_MATMUL Q.K^T (``adj_y``), MUL by 1/sqrt(head width), SOFTMAX
                        over the last axis, BATCH_MATMUL P.V, TRANSPOSE + RESHAPE back
    LayerNormalization  MEAN over the last axis, a float island DEQUANTIZE -> NEG ->
                        QUANTIZE, SQUARED_DIFFERENCE, MEAN, ADD of epsilon, RSQRT, three
                        MULs (by gamma: a constant) and an ADD
    Dense + GELU        FULLY_CONNECTED then GELU (``approximate`` false; the BERT encoder's
                        true, its tanh form)
    class token, position embedding, layer scale
                        CONCATENATION with a constant, ADD of a constant; the layer
                        scale (a MUL by a per-channel constant after a Dense) the
                        converter folds into the Dense's weights

Sizes are small (tens of tokens, widths of 64-96) so that every model compiles and runs
at the three ISA levels inside the test suite's budget; the arithmetic per op is the same
as at full size.
"""

from __future__ import annotations

import functools

import numpy as np

from . import keras as zoo_keras

# ViT: 32x32 RGB in 4x4 patches -> 64 tokens and a class token, width 64, 4 heads
VIT_SHAPE = (1, 32, 32, 3)
VIT_PATCH = 4
VIT_WIDTH = 64
VIT_HEADS = 4
VIT_MLP = 128
VIT_BLOCKS = 2
CLASSES = 10

# BERT-style encoder over a sequence of 32 token embeddings of width 64
BERT_SHAPE = (1, 32, 64)
BERT_HEADS = 4
BERT_MLP = 128
BERT_BLOCKS = 2
BERT_LABELS = 4

# MobileViT-style: a MobileNetV2 stem to 16x16, one MobileViT block of 2x2 patches
MOBILEVIT_SHAPE = (1, 32, 32, 3)
MOBILEVIT_CHANNELS = 16
MOBILEVIT_WIDTH = 32
MOBILEVIT_PATCH = 2
MOBILEVIT_HEADS = 2
MOBILEVIT_MLP = 64

# ConvNeXt-style: a 4x4 stride-4 stem, two stages (32 and 64 channels)
CONVNEXT_SHAPE = (1, 32, 32, 3)
CONVNEXT_STAGES = ((32, 2), (64, 1))  # (channels, blocks)
CONVNEXT_KERNEL = 7
CONVNEXT_EXPANSION = 4
LAYER_NORM_EPSILON = 1e-6

# Single ops
BATCH_MATMUL_A = (1, 2, 16, 24)       # two heads of 16 rows, depth 24
BATCH_MATMUL_B = (1, 2, 24, 20)       # ... times 20 columns
BATCH_MATMUL_ADJ_A = (1, 2, 17, 24)   # 17 rows (odd), depth 24
BATCH_MATMUL_ADJ_B = (1, 1, 20, 24)   # adj_y, one head broadcast over both
SEQUENCE = (1, 16, 32)                # a sequence of 16 tokens of width 32
DENSE_4D = (1, 8, 8, 16)              # an image a Dense layer is applied to, pixel by pixel
GELU_SHAPE = (1, 16, 16, 8)


@functools.lru_cache(maxsize=None)
def _layers():
    """Keras layers of ours (defined on first use: TensorFlow is imported lazily). Their
    weights are named for ``zoo.keras.randomize_weights``: ``class_token``,
    ``position_embedding``, ``layer_scale``."""
    keras = zoo_keras.tensorflow().keras

    class ClassToken(keras.layers.Layer):
        """Prepend a learned token to a [1, tokens, width] sequence (CONCATENATION)."""

        def build(self, shape):
            self.token = self.add_weight(name="class_token", shape=(1, 1, shape[-1]))

        def call(self, x):
            return keras.ops.concatenate([self.token, x], axis=1)

    class PositionEmbedding(keras.layers.Layer):
        """Add a learned [tokens, width] embedding (ADD of a constant)."""

        def build(self, shape):
            self.table = self.add_weight(name="position_embedding", shape=(1, *shape[1:]))

        def call(self, x):
            return x + self.table

    class LayerScale(keras.layers.Layer):
        """Multiply each channel by a learned factor (MUL by a per-channel constant)."""

        def build(self, shape):
            self.scale = self.add_weight(name="layer_scale", shape=(shape[-1],))

        def call(self, x):
            return x * self.scale

    return ClassToken, PositionEmbedding, LayerScale


def _attention(L, x, width, heads, name):
    return L.MultiHeadAttention(heads, width // heads, name=name)(x, x)


def _mlp(L, x, width, hidden, name, approximate=False):
    h = L.Dense(hidden, name=f"{name}_fc1")(x)
    gelu = zoo_keras.tensorflow().keras.activations.gelu
    h = L.Activation(lambda v: gelu(v, approximate=approximate), name=f"{name}_gelu")(h)
    return L.Dense(width, name=f"{name}_fc2")(h)


def _pre_norm_block(L, x, width, heads, hidden, name):
    """ViT's block: x + attention(LN(x)), then x + MLP(LN(x))."""
    h = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"{name}_ln1")(x)
    x = L.Add(name=f"{name}_add1")([x, _attention(L, h, width, heads, f"{name}_attn")])
    h = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"{name}_ln2")(x)
    return L.Add(name=f"{name}_add2")([x, _mlp(L, h, width, hidden, f"{name}_mlp")])


def _post_norm_block(L, x, width, heads, hidden, name):
    """BERT's block: LN(x + attention(x)), then LN(x + MLP(x)) with GELU's tanh form."""
    x = L.Add(name=f"{name}_add1")([x, _attention(L, x, width, heads, f"{name}_attn")])
    x = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"{name}_ln1")(x)
    h = _mlp(L, x, width, hidden, f"{name}_mlp", approximate=True)
    x = L.Add(name=f"{name}_add2")([x, h])
    return L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"{name}_ln2")(x)


def _finish(model, rng):
    """Seeded weights (``zoo.keras.randomize_weights``), then the attention projections again
    with the fan-in they have: Q, K and V kernels are [width, heads, head width], each
    output a sum over ``width`` inputs (the zoo's rule would count width * heads); the
    output projection's [heads, head width, width] sums over both leading axes."""
    zoo_keras.randomize_weights(model, rng)
    for layer in model.layers:
        if not isinstance(layer, zoo_keras.tensorflow().keras.layers.MultiHeadAttention):
            continue
        for var in layer.weights:
            shape = tuple(var.shape)
            if zoo_keras.weight_role(var) == "kernel":
                output = "attention_output" in var.path
                fan_in = int(np.prod(shape[:-1])) if output else shape[0]
                var.assign(rng.normal(0.0, np.sqrt(2.0 / fan_in), shape).astype(np.float32))
    return model


# ----------------------------------------------------------------------------- nets
def build_vit(rng):
    """ViT: patch embedding (a 4x4 stride-4 conv), class token, position embedding,
    pre-norm encoder blocks, LayerNorm, the class token's logits."""
    keras = zoo_keras.tensorflow().keras
    L = keras.layers
    ClassToken, PositionEmbedding, _ = _layers()
    (inp,) = zoo_keras.named_inputs([VIT_SHAPE])
    x = L.Conv2D(VIT_WIDTH, VIT_PATCH, strides=VIT_PATCH, name="patch_embed")(inp)
    tokens = (VIT_SHAPE[1] // VIT_PATCH) * (VIT_SHAPE[2] // VIT_PATCH)
    x = L.Reshape((tokens, VIT_WIDTH), name="patches")(x)
    x = PositionEmbedding(name="position")(ClassToken(name="class_token")(x))
    for i in range(VIT_BLOCKS):
        x = _pre_norm_block(L, x, VIT_WIDTH, VIT_HEADS, VIT_MLP, f"block{i}")
    x = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="final_ln")(x)
    x = L.Lambda(lambda v: v[:, 0], name="class_output")(x)
    x = L.Dense(CLASSES, name="head")(x)
    return _finish(keras.Model(inp, x, name="vit"), rng)


def build_bert(rng):
    """BERT-style encoder: token embeddings in, plus a position embedding, LayerNorm,
    post-norm blocks; outputs the sequence and a pooled [CLS] classification (tanh)."""
    keras = zoo_keras.tensorflow().keras
    L = keras.layers
    _, PositionEmbedding, _ = _layers()
    (inp,) = zoo_keras.named_inputs([BERT_SHAPE])
    width = BERT_SHAPE[-1]
    x = PositionEmbedding(name="position")(inp)
    x = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="embed_ln")(x)
    for i in range(BERT_BLOCKS):
        x = _post_norm_block(L, x, width, BERT_HEADS, BERT_MLP, f"block{i}")
    pooled = L.Dense(width, activation="tanh", name="pooler")(
        L.Lambda(lambda v: v[:, 0], name="cls")(x))
    logits = L.Dense(BERT_LABELS, name="classifier")(pooled)
    return _finish(keras.Model(inp, [x, logits], name="bert_encoder"), rng)


def _unfold(x, size, patch, width):
    """[1, H, W, C] -> [1, patch * patch, pixels of a patch position, C]: the pixels at
    the same position in every patch form one sequence (MobileViT's unfold)."""
    tf = zoo_keras.tensorflow()
    n = size // patch
    x = tf.reshape(x, (n, patch, n, patch * width))           # rows: patch row, in-patch row
    x = tf.transpose(x, (1, 0, 2, 3))                          # in-patch row first
    x = tf.reshape(x, (patch, n, n, patch, width))
    x = tf.transpose(x, (0, 3, 1, 2, 4))                       # in-patch column second
    return tf.reshape(x, (1, patch * patch, n * n, width))


def _fold(x, size, patch, width):
    """The inverse of ``_unfold``."""
    tf = zoo_keras.tensorflow()
    n = size // patch
    x = tf.reshape(x, (patch, patch, n, n, width))
    x = tf.transpose(x, (0, 2, 3, 1, 4))
    x = tf.reshape(x, (patch, n, n, patch * width))
    x = tf.transpose(x, (1, 0, 2, 3))
    return tf.reshape(x, (1, size, size, width))


def build_mobilevit(rng):
    """MobileViT-style hybrid: a stride-2 conv stem and an inverted-residual block to
    16x16, then a MobileViT block (3x3 and 1x1 convs, unfold into 2x2 patches, a
    pre-norm transformer block over each patch position's sequence, fold, 1x1 conv,
    CONCATENATION with its input, 3x3 conv), global pool, logits."""
    keras = zoo_keras.tensorflow().keras
    L = keras.layers
    (inp,) = zoo_keras.named_inputs([MOBILEVIT_SHAPE])
    c, d, size = MOBILEVIT_CHANNELS, MOBILEVIT_WIDTH, MOBILEVIT_SHAPE[1] // 2
    x = L.Conv2D(c, 3, strides=2, padding="same", activation="swish", name="stem")(inp)
    h = L.Conv2D(2 * c, 1, activation="swish", name="mv2_expand")(x)
    h = L.DepthwiseConv2D(3, padding="same", activation="swish", name="mv2_dw")(h)
    x = L.Add(name="mv2_add")([x, L.Conv2D(c, 1, name="mv2_project")(h)])
    local = L.Conv2D(c, 3, padding="same", activation="swish", name="mvit_local")(x)
    local = L.Conv2D(d, 1, name="mvit_in")(local)
    seq = L.Lambda(lambda v: _unfold(v, size, MOBILEVIT_PATCH, d), name="unfold")(local)
    h = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="mvit_ln1")(seq)
    h = L.MultiHeadAttention(MOBILEVIT_HEADS, d // MOBILEVIT_HEADS, attention_axes=(2,),
                             name="mvit_attn")(h, h)
    seq = L.Add(name="mvit_add1")([seq, h])
    h = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="mvit_ln2")(seq)
    seq = L.Add(name="mvit_add2")([seq, _mlp(L, h, d, MOBILEVIT_MLP, "mvit_mlp")])
    y = L.Lambda(lambda v: _fold(v, size, MOBILEVIT_PATCH, d), name="fold")(seq)
    y = L.Conv2D(c, 1, activation="swish", name="mvit_out")(y)
    y = L.Concatenate(name="mvit_concat")([x, y])
    y = L.Conv2D(c, 3, padding="same", activation="swish", name="mvit_fuse")(y)
    y = L.GlobalAveragePooling2D(name="gap")(y)
    y = L.Dense(CLASSES, name="head")(y)
    return _finish(keras.Model(inp, y, name="mobilevit"), rng)


def build_convnext(rng):
    """ConvNeXt-style: 4x4 stride-4 stem and LayerNorm; blocks of a 7x7 depthwise conv,
    per-pixel LayerNorm, Dense 4x with GELU, Dense back, layer scale, residual ADD; a
    LayerNorm and 2x2 stride-2 conv between stages; global pool, LayerNorm, logits."""
    keras = zoo_keras.tensorflow().keras
    L = keras.layers
    _, _, LayerScale = _layers()
    (inp,) = zoo_keras.named_inputs([CONVNEXT_SHAPE])
    x = L.Conv2D(CONVNEXT_STAGES[0][0], 4, strides=4, name="stem")(inp)
    x = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="stem_ln")(x)
    for s, (channels, blocks) in enumerate(CONVNEXT_STAGES):
        if s:
            x = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"down{s}_ln")(x)
            x = L.Conv2D(channels, 2, strides=2, name=f"down{s}")(x)
        for b in range(blocks):
            name = f"stage{s}_block{b}"
            h = L.DepthwiseConv2D(CONVNEXT_KERNEL, padding="same", name=f"{name}_dw")(x)
            h = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name=f"{name}_ln")(h)
            h = _mlp(L, h, channels, CONVNEXT_EXPANSION * channels, f"{name}_mlp")
            x = L.Add(name=f"{name}_add")([x, LayerScale(name=f"{name}_scale")(h)])
    x = L.GlobalAveragePooling2D(name="gap")(x)
    x = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="head_ln")(x)
    x = L.Dense(CLASSES, name="head")(x)
    return _finish(keras.Model(inp, x, name="convnext"), rng)


# ----------------------------------------------------------------------------- single ops
def _two_input(shapes, fn, name, rng):
    keras = zoo_keras.tensorflow().keras
    ins = zoo_keras.named_inputs(shapes)
    out = keras.layers.Lambda(lambda v: fn(*v), name=name)(ins)
    return _finish(keras.Model(ins, out), rng)


def build_batch_matmul(rng):
    tf = zoo_keras.tensorflow()
    return _two_input([BATCH_MATMUL_A, BATCH_MATMUL_B], tf.matmul, "batch_matmul", rng)


def build_batch_matmul_adj(rng):
    tf = zoo_keras.tensorflow()
    return _two_input([BATCH_MATMUL_ADJ_A, BATCH_MATMUL_ADJ_B],
                      lambda a, b: tf.matmul(a, b, transpose_b=True), "batch_matmul", rng)


def build_gelu(rng):
    keras = zoo_keras.tensorflow().keras
    return zoo_keras.single_layer([GELU_SHAPE], lambda L: L.Activation(
        lambda v: keras.activations.gelu(v, approximate=False), name="gelu"), rng)


def build_gelu_tanh(rng):
    keras = zoo_keras.tensorflow().keras
    return zoo_keras.single_layer([GELU_SHAPE], lambda L: L.Activation(
        lambda v: keras.activations.gelu(v, approximate=True), name="gelu"), rng)


def build_layer_norm(rng):
    return zoo_keras.single_layer([SEQUENCE], lambda L: L.LayerNormalization(
        epsilon=LAYER_NORM_EPSILON, name="layer_norm"), rng)


def build_fully_connected_3d(rng):
    return zoo_keras.single_layer([SEQUENCE], lambda L: L.Dense(24, name="dense"), rng)


def build_dense_4d_shape_chain(rng):
    """Dense layers on a 1x8x8x16 image whose batch the model leaves open (None, as Keras
    models usually do): TFLite's converter then computes each FULLY_CONNECTED's reshapes
    in the graph (SHAPE, GATHER, REDUCE_PROD, CONCATENATION, PACK feeding a RESHAPE),
    which the frontend folds to static shapes; a LayerNorm and a GELU between them."""
    keras = zoo_keras.tensorflow().keras
    L = keras.layers
    inp = keras.Input(DENSE_4D[1:], name="input")  # batch left open
    x = L.Dense(32, name="dense1")(inp)
    x = L.LayerNormalization(epsilon=LAYER_NORM_EPSILON, name="ln")(x)
    x = L.Dense(16, activation="gelu", name="dense2")(x)
    return _finish(keras.Model(inp, x), rng)
