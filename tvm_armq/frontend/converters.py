"""What tvm_armq adds to TVM's TFLite frontend: exact quantized data movement, static
reshapes, and Relax variables named after the TFLite operator they come from.

Read this first. TVM 0.27's TFLite frontend (``tvm.relax.frontend.tflite``) refuses a
model outright if any operator with a quantized tensor is missing from its list of
quantized ops it trusts. Some missing ones only move int8 bytes; TFLite's own kernels for
them copy bytes too, whatever the scales, so the frontend's conversion (the same
``strided_slice`` / ``reshape`` / ``take`` of the int8 tensor) is exact:

    PAD, PADV2          the int8 tensor padded with its zero point
    SHAPE               the shape of a tensor (int32, no arithmetic on the data)
    STRIDED_SLICE, SLICE, SPLIT, SPLIT_V, SQUEEZE, EXPAND_DIMS, TRANSPOSE, PACK, GATHER,
    SPACE_TO_DEPTH, DEPTH_TO_SPACE, TILE
                        bytes moved or selected; nothing rounds (SPACE_TO_DEPTH and
                        DEPTH_TO_SPACE: a reshape, a transpose of the block axes, a
                        reshape; TILE: copies of the tensor side by side)

Converters emit SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE around Keras ``Reshape`` layers
(squeeze-excite blocks), and SHAPE -> GATHER -> REDUCE_PROD -> CONCATENATION / PACK ->
RESHAPE around a Dense applied to a rank-3/4 tensor of a model whose batch is open: the
RESHAPE's target shape is then a tensor computed in the graph, which the frontend cannot
turn into a Relax shape. That int32 arithmetic depends on shapes alone, so
``static_value`` evaluates it at import time (SHAPE reads the shape the input was
imported with) and the RESHAPE gets a static shape; where it cannot (a value that depends
on data), the RESHAPE takes its output's recorded shape (the sizes the model was
converted with). The shape arithmetic is then left unused (dead code, removed by the
pass).

TVM 0.27's EXPAND_DIMS converter fails on every model (it passes ``expand_dims`` a third
argument); ``_convert_expand_dims`` replaces it.

Some quantized converters are added or replaced so that the float chain means what
TFLite computes (the pass then makes it integer, ``passes/``):

    TRANSPOSE_CONV      TVM's drops the fused activation and sizes the output by Relax's
                        formula, not by the op's output_shape tensor (a 1x1 stride-2 SAME
                        layer comes out a row short), and TVM cannot build its NHWC
                        conv2d_transpose at all. ``_convert_transpose_conv`` emits
                        dequantize -> conv2d_transpose (NCHW, between two permute_dims)
                        -> (+ bias) -> quantize, padded as
                        TFLite pads (``transpose_conv_padding``), the rows TFLite adds at
                        the end as ``output_padding``, and the activation as a clip after
                        the quantize, as TVM's CONV_2D does. Float models keep TVM's.
    RESIZE_NEAREST_NEIGHBOR  not in TVM's list of quantized ops either; TVM's converter
                        resizes the int8 tensor itself, which the pass replaces with
                        TFLite's positions (``schedules.resize``).
    PRELU               not in TVM's list of quantized ops; ``_convert_prelu`` imports a
                        quantized one as quantize(where(d >= 0, d, d * dequantize(alpha)))
                        with d = dequantize(x) and alpha broadcast as TFLite broadcasts it.
    GELU                TVM refuses a quantized one and computes a float one in the erf
                        form even when it is ``approximate``; ``_convert_gelu`` imports a
                        quantized one as quantize(gelu(dequantize(x))) and a float one as
                        gelu(x), ``gelu_tanh`` for ``approximate`` in both.
    BATCH_MATMUL        TVM refuses a quantized one; ``_convert_batch_matmul`` imports it
                        as quantize(matmul(a, b)) of the dequantized operands, ``adj_x`` /
                        ``adj_y`` a ``permute_dims`` swapping that operand's last two axes,
                        the batch axes broadcast by ``matmul`` itself.
    SOFTMAX             TVM's drops the op's ``beta`` (softmax(beta * x)): a beta other
                        than 1 computed something else, float or quantized (found by
                        ``scripts/fuzz.py``). ``_convert_softmax`` emits
                        softmax(multiply(x, beta)) then; the pass reads beta back.

A tensor with one scale is quantized per tensor whatever axis its file names: TFLite's
converter writes axis 3 for every depthwise weight, and TVM's DEPTHWISE_CONV_2D refuses a
one-scale weight whose axis is not 0 (a depthwise layer of one channel; found by
``scripts/fuzz.py``). ``_one_scale_per_tensor`` reads such a tensor's axis as 0.

Each TFLite operator's result is bound to a Relax variable named ``op<index>_<code>``
(``op12_hard_swish``, see ``operator_name`` / ``operator_of``): the pass reads which
TFLite operator a chain of Relax calls came from (to choose TFLite's arithmetic for it,
and to name it in reports and errors), and ``diff`` maps layers back to TFLite tensors.
"""

from __future__ import annotations

import re

import numpy as np

from ..schedules.window import transpose_conv_padding

# Quantized ops whose frontend conversion moves int8 bytes only (see the docstring).
EXACT_DATA_MOVEMENT_OPS = frozenset({
    "PAD", "PADV2", "SHAPE", "STRIDED_SLICE", "SLICE", "SPLIT", "SPLIT_V", "SQUEEZE",
    "EXPAND_DIMS", "TRANSPOSE", "PACK", "GATHER", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "TILE",
})

NHWC_TO_NCHW, NCHW_TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)  # permute_dims axes

_NAME = re.compile(r"^op(\d+)_([a-z0-9_]+)$")
_MARK = "_tvm_armq_extended"


def operator_name(index: int, code: str) -> str:
    """The Relax variable name of TFLite operator ``index`` (``code`` as "CONV_2D")."""
    return f"op{index}_{code.lower()}"


def operator_of(name: str) -> tuple[int, str] | None:
    """(operator index, op code such as "HARD_SWISH") of a variable named by
    ``operator_name``, or None for any other name."""
    m = _NAME.match(name)
    return (int(m.group(1)), m.group(2).upper()) if m else None


_PART = re.compile(r"^(op\d+_[a-z0-9_]+?)__part(\d+)$")


def part_name(index: int, code: str, part: int) -> str:
    """The variable of part ``part`` of TFLite operator ``index`` when the converter makes
    the operator of several layers (a BATCH_MATMUL with a weight matrix per batch): the
    pass lowers each as a layer of that operator; ``operator_of`` does not take it for the
    operator's output (``diff`` compares outputs with TFLite's tensors)."""
    return f"{operator_name(index, code)}__part{part}"


def layer_of(name: str) -> tuple[int, str] | None:
    """(operator index, op code) of an operator's variable or of one of its parts."""
    m = _PART.match(name)
    return operator_of(m.group(1) if m else name)


def _recorded_shape(tensor) -> tuple[int, ...]:
    """The shape a flatbuffer tensor records. A dimension the model leaves open (-1 in its
    shape signature, Keras' batch) is recorded as the size the model was converted with,
    and the frontend imports the model's inputs with exactly those sizes."""
    return tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()


def _options(op, table_class):
    """The builtin options table of ``op`` as ``table_class`` (``tflite.GatherOptions``)."""
    table = op.BuiltinOptions()
    opts = table_class()
    if table is not None:
        opts.Init(table.Bytes, table.Pos)
    return opts


def _strided_slice(value, begin, end, strides, opts) -> np.ndarray:
    """STRIDED_SLICE of a 1-D or N-D ``value`` with TFLite's begin / end / shrink masks."""
    index = []
    for axis, (b, e, st) in enumerate(zip(begin, end, strides)):
        if opts.ShrinkAxisMask() >> axis & 1:
            index.append(int(b))
            continue
        b = None if opts.BeginMask() >> axis & 1 else int(b)
        e = None if opts.EndMask() >> axis & 1 else int(e)
        index.append(slice(b, e, int(st)))
    return np.asarray(value)[tuple(index)]


# The longest chain of shape arithmetic static_value follows (Keras writes about five ops)
SHAPE_CHAIN_MAX_DEPTH = 16


def static_value(converter, tensor_idx: int, depth: int = 0):
    """The value of an integer tensor the graph computes from shapes alone (Keras' shape
    arithmetic around a Dense applied to a rank-3/4 tensor: SHAPE, GATHER, REDUCE_PROD,
    PACK, CONCATENATION, STRIDED_SLICE of them and of constants), as a NumPy array, or None
    when it depends on data. SHAPE reads the shape the input was imported with."""
    import tflite

    wrapped = converter.get_tensors([tensor_idx])[0]
    if wrapped.buffer is not None and wrapped.buffer.DataLength():  # a constant
        return np.asarray(converter.get_tensor_value(wrapped))
    producers = getattr(converter, "_tvm_armq_producers", None)
    if producers is None:
        sub = converter.subgraph
        producers = {int(t): sub.Operators(i) for i in range(sub.OperatorsLength())
                     for t in sub.Operators(i).OutputsAsNumpy()}
        converter._tvm_armq_producers = producers
    op = producers.get(int(tensor_idx))
    if op is None or depth > SHAPE_CHAIN_MAX_DEPTH:
        return None
    code = converter.get_op_code_str(op)
    ins = [int(t) for t in op.InputsAsNumpy()]
    if code == "SHAPE":
        x = converter.bb.normalize(converter.get_expr(ins[0]))
        return np.array([int(d) for d in x.ty.shape], np.int32)
    args = [static_value(converter, t, depth + 1) for t in ins]
    if any(a is None for a in args):
        return None
    if code == "GATHER":
        axis = _options(op, tflite.GatherOptions).Axis()
        return np.take(args[0], args[1], axis=axis)
    if code == "REDUCE_PROD":
        keep = _options(op, tflite.ReducerOptions).KeepDims()
        return np.prod(args[0], axis=tuple(np.atleast_1d(args[1]).tolist()),
                       keepdims=bool(keep)).astype(args[0].dtype)
    if code == "PACK":
        return np.stack(args, axis=_options(op, tflite.PackOptions).Axis())
    if code == "CONCATENATION":
        return np.concatenate([np.atleast_1d(a) for a in args],
                              axis=_options(op, tflite.ConcatenationOptions).Axis())
    if code == "STRIDED_SLICE":
        return _strided_slice(args[0], *args[1:4], _options(op, tflite.StridedSliceOptions))
    return None


def _fold_computed_reshape(original):
    """RESHAPE whose target shape is computed in the graph -> a static shape: the value of
    that computation from the imported shapes (``static_value``), else the output's
    recorded shape (when that holds as many elements as the input)."""

    def convert_reshape(self, op):
        from tvm import relax

        inputs = self.get_input_tensors(op)
        if len(inputs) == 2 and self.has_expr(inputs[1].tensor_idx):
            x = self.get_expr(inputs[0].tensor_idx)
            in_shape = [int(d) for d in self.bb.normalize(x).ty.shape]
            size = int(np.prod(in_shape))
            target = static_value(self, inputs[1].tensor_idx)
            if target is not None:
                shape = [int(d) for d in np.asarray(target).reshape(-1)]
                if shape.count(-1) == 1:  # the one open axis takes what is left
                    known = int(np.prod([d for d in shape if d != -1]))
                    shape[shape.index(-1)] = size // known if known else 0
                if int(np.prod(shape)) == size:
                    return relax.op.reshape(x, shape)
            shape = _recorded_shape(self.get_output_tensors(op)[0].tensor)
            if int(np.prod(shape)) == size:
                return relax.op.reshape(x, shape)
        return original(self, op)

    return convert_reshape


def _convert_expand_dims(self, op):
    """EXPAND_DIMS: TVM 0.27's own converter calls ``relax.op.expand_dims`` with an extra
    argument and fails on every model; this one inserts the axis the constant names."""
    from tvm import relax

    x_tensor, axis_tensor = self.get_input_tensors(op)
    axis = int(np.asarray(self.get_tensor_value(axis_tensor)).reshape(-1)[0])
    return relax.op.expand_dims(self.get_tensor_expr(x_tensor), axis)


def _convert_transpose_conv(original):
    """TRANSPOSE_CONV of a quantized input as the docstring says; TVM's for a float one."""

    def convert_transpose_conv(self, op):
        import tvm
        from tflite.Padding import Padding
        from tflite.TransposeConvOptions import TransposeConvOptions
        from tvm import relax
        from tvm.relax.frontend.tflite import tflite_frontend

        inputs = self.get_input_tensors(op)
        shape_t, w_t, x_t = inputs[:3]  # TFLite's order: output shape, weights, input
        if not x_t.qnn_params:
            return original(self, op)
        out_t = self.get_output_tensors(op)[0]
        options = TransposeConvOptions()
        table = op.BuiltinOptions()
        options.Init(table.Bytes, table.Pos)
        if self.has_expr(shape_t.tensor_idx):  # computed in the graph, not a constant
            raise tvm.error.OpAttributeInvalid(
                "TRANSPOSE_CONV: the output shape must be a constant")
        out_shape = [int(d) for d in self.get_tensor_value(shape_t)]
        w_ohwi = self.get_tensor_value(w_t)
        _, kh, kw, _ = w_ohwi.shape
        _, in_h, in_w, _ = (int(d) for d in x_t.tensor.ShapeAsNumpy())
        strides = (options.StrideH(), options.StrideW())
        same = options.Padding() == Padding.SAME
        pads, extra = [], []
        for size, k, s, n_in in zip(out_shape[1:3], (kh, kw), strides, (in_h, in_w)):
            before = transpose_conv_padding(size, k, s, same)
            scattered = (n_in - 1) * s + k - before  # rows the scatter reaches past it
            after = max(0, scattered - size)          # cropped at the end
            pads.append((before, after))
            extra.append(size - (scattered - after))  # rows TFLite adds: bias only
        if any(not 0 <= e < s for e, s in zip(extra, strides)):
            raise tvm.error.OpAttributeInvalid(
                f"TRANSPOSE_CONV: output shape {out_shape} is more than a stride past "
                f"what a {kh}x{kw} stride {strides} kernel reaches from the input")
        # Relax's weight layout for conv2d_transpose is IOHW: out channels on axis 1
        w_iohw = self.exp_tab.new_const(np.ascontiguousarray(w_ohwi.transpose(3, 0, 1, 2)),
                                        dtype=self.get_tensor_type_str(w_t.tensor.Type()))
        w_f = relax.op.dequantize(w_iohw, w_t.qnn_params["scale"],
                                  w_t.qnn_params["zero_point"], axis=1)
        # NCHW between two transposes: TVM legalizes conv2d_transpose for NCHW only, and the
        # float chain must still build where the pass leaves it float
        x_nchw = relax.op.permute_dims(self.dequantize(self.get_tensor_expr(x_t), x_t),
                                       NHWC_TO_NCHW)
        y = relax.op.permute_dims(relax.op.nn.conv2d_transpose(
            x_nchw, w_f, strides=strides,
            padding=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]), output_padding=extra,
            data_layout="NCHW", kernel_layout="IOHW", out_dtype="float32"), NCHW_TO_NHWC)
        if len(inputs) > 3 and inputs[3].tensor_idx >= 0:  # the optional int32 bias
            b_t = inputs[3]
            bias = self.exp_tab.new_const(self.get_tensor_value(b_t), dtype="int32")
            scale = b_t.qnn_params["scale"] if b_t.qnn_params else relax.op.multiply(
                x_t.qnn_params["scale"], w_t.qnn_params["scale"])
            y = relax.op.add(y, relax.op.dequantize(bias, scale, relax.const(0, "int32"),
                                                    axis=0))
        q = out_t.qnn_params
        return self.convert_qnn_fused_activation_function(
            self.quantize(y, out_t), options.FusedActivationFunction(),
            tflite_frontend.get_scalar_from_constant(q["scale"]),
            tflite_frontend.get_scalar_from_constant(q["zero_point"]),
            self.get_tensor_type_str(out_t.tensor.Type()))

    return convert_transpose_conv


def _convert_prelu(original):
    """PRELU of a quantized input as the docstring says; TVM's for a float one."""

    def convert_prelu(self, op):
        from tvm import relax

        x_t, alpha_t = self.get_input_tensors(op)
        if not x_t.qnn_params:
            return original(self, op)
        out_t = self.get_output_tensors(op)[0]
        d = self.bb.normalize(self.dequantize(self.get_tensor_expr(x_t), x_t))
        alpha = self.dequantize(self.get_tensor_expr(alpha_t), alpha_t)
        negative = relax.op.multiply(d, alpha)
        y = relax.op.where(relax.op.greater_equal(d, relax.const(0.0, "float32")), d, negative)
        return self.quantize(y, out_t)

    return convert_prelu


def _one_scale_per_tensor(original):
    """get_tensors with a one-scale tensor's quantization axis read as 0 (the docstring)."""

    def get_tensors(self, tensors_idx_list):
        wrapped = original(self, tensors_idx_list)
        for t in wrapped:
            q = t.qnn_params
            if q and q.get("axis", 0) != 0 and t.tensor.Quantization().ScaleLength() == 1:
                q["axis"] = 0
        return wrapped

    return get_tensors


def softmax_beta(op) -> float:
    """The ``beta`` of a TFLite SOFTMAX operator (float32, as stored)."""
    from tflite.SoftmaxOptions import SoftmaxOptions

    table = op.BuiltinOptions()
    if table is None:
        return 1.0
    opts = SoftmaxOptions()
    opts.Init(table.Bytes, table.Pos)
    return float(opts.Beta())


def _convert_softmax(original):
    """SOFTMAX with its beta, as the docstring says; TVM's where beta is 1."""

    def convert_softmax(self, op):
        from tvm import relax

        beta = softmax_beta(op)
        if beta == 1.0:
            return original(self, op)
        x_t = self.get_input_tensors(op)[0]
        out_t = self.get_output_tensors(op)[0]
        x = self.get_tensor_expr(x_t)
        if x_t.qnn_params:
            x = self.bb.normalize(self.dequantize(x, x_t))
        y = relax.op.nn.softmax(relax.op.multiply(x, relax.const(beta, "float32")), axis=-1)
        return self.quantize(y, out_t) if out_t.qnn_params else y

    return convert_softmax


def _convert_gelu(original):
    """GELU as ``gelu``, or ``gelu_tanh`` for the op's ``approximate`` form, of a float
    input, and as quantize(that of dequantize(x)) of a quantized one (the pass makes it
    TFLite's table). TVM's refuses a quantized GELU and computes the erf form of a float
    one whatever ``approximate`` says (up to 4.7e-4 from TFLite's tanh form on a
    dynamic-range BERT's activations)."""

    def convert_gelu(self, op):
        from tflite.GeluOptions import GeluOptions
        from tvm import relax

        x_t = self.get_input_tensors(op)[0]
        approximate = False
        table = op.BuiltinOptions()
        if table is not None:
            opts = GeluOptions()
            opts.Init(table.Bytes, table.Pos)
            approximate = bool(opts.Approximate())
        gelu = relax.op.nn.gelu_tanh if approximate else relax.op.nn.gelu
        if not x_t.qnn_params:
            return gelu(self.get_tensor_expr(x_t))
        d = self.bb.normalize(self.dequantize(self.get_tensor_expr(x_t), x_t))
        return self.quantize(gelu(d), self.get_output_tensors(op)[0])

    return convert_gelu


def _last_two_swapped(x, rank: int):
    from tvm import relax

    return relax.op.permute_dims(x, [*range(rank - 2), rank - 1, rank - 2])


def _convert_batch_matmul(original):
    """BATCH_MATMUL of quantized operands as quantize(matmul(a, b)) of the dequantized
    operands, ``adj_x`` / ``adj_y`` as a swap of the last two axes of that operand and the
    batch axes broadcast as ``matmul`` broadcasts them (TFLite's rule); the pass makes it
    one integer kernel. TVM's for float operands."""

    def convert_batch_matmul(self, op):
        from tflite.BatchMatMulOptions import BatchMatMulOptions
        from tvm import relax

        a_t, b_t = self.get_input_tensors(op)
        out_t = self.get_output_tensors(op)[0]
        opts = BatchMatMulOptions()
        table = op.BuiltinOptions()
        opts.Init(table.Bytes, table.Pos)
        if is_hybrid(a_t, b_t):
            return _hybrid_batch_matmul(self, op, a_t, b_t, out_t, opts)
        if not (a_t.qnn_params and b_t.qnn_params and out_t.qnn_params):
            return original(self, op)
        operands = []
        for t, adjoint in ((a_t, opts.AdjX()), (b_t, opts.AdjY())):
            d = self.bb.normalize(self.dequantize(self.get_tensor_expr(t), t))
            rank = len(_recorded_shape(t.tensor))
            operands.append(self.bb.normalize(_last_two_swapped(d, rank)) if adjoint else d)
        return self.quantize(relax.op.matmul(*operands), out_t)

    return convert_batch_matmul


# ------------------------------------------------------------- dynamic-range (hybrid)
# A hybrid layer's weight dequantize is bound to a variable named for how TFLite computes
# the layer (``hybrid_name``): the pass (``passes/hybrid.py``) reads the scheme from it.
HYBRID_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL")
_HYBRID = re.compile(r"^hybrid_(sym|asym)_(row_scale|channel_first)")


def hybrid_name(inputs: str, epilogue: str) -> str:
    """The variable name of a hybrid layer's dequantized weight: TFLite's input scheme
    (``schedules.hybrid.SYMMETRIC`` / ``ASYMMETRIC``) and epilogue order (``ROW_SCALE`` /
    ``CHANNEL_FIRST``)."""
    name = f"hybrid_{inputs}_{epilogue}"
    assert _HYBRID.match(name), name
    return name


def hybrid_scheme(name: str) -> tuple[str, str] | None:
    """(inputs, epilogue) of a variable named by ``hybrid_name`` (a suffix the builder adds
    to a repeated name is ignored), else None."""
    m = _HYBRID.match(name)
    return (m.group(1), m.group(2)) if m else None


def is_hybrid(x_t, w_t) -> bool:
    """A float32 input with an int8 weight quantized offline: TFLite's dynamic range."""
    from tflite.TensorType import TensorType

    return (x_t.tensor.Type() == TensorType.FLOAT32 and w_t.tensor.Type() == TensorType.INT8
            and bool(w_t.qnn_params))


def _hybrid_weight(self, weight: np.ndarray, w_t, axis: int, scheme: tuple[str, str]):
    """dequantize(weight) bound to the variable ``hybrid_name(*scheme)``; ``axis``: the
    output channel's axis of ``weight`` as laid out here."""
    from tvm import relax

    q = w_t.qnn_params
    const = self.exp_tab.new_const(np.ascontiguousarray(weight), dtype="int8")
    return self.bb.emit(relax.op.dequantize(const, q["scale"], q["zero_point"], axis=axis),
                        name_hint=hybrid_name(*scheme))


def _hybrid_finish(self, y, inputs, activation):
    """A hybrid layer's float bias (when the op has one) and fused activation."""
    from tvm import relax

    if len(inputs) > 2 and inputs[2].tensor_idx >= 0:
        bias = self.exp_tab.new_const(self.get_tensor_value(inputs[2]).astype(np.float32),
                                      dtype="float32")
        y = relax.op.add(y, bias)
    return self.convert_fused_activation_function(y, activation)


def _convert_fully_connected(original):
    """A dynamic-range FULLY_CONNECTED (float32 input, int8 weight) as matmul(x,
    dequantize(W^T)) + bias and its activation, the weight's variable naming TFLite's input
    scheme (the op's ``asymmetric_quantize_inputs``); TVM's for any other."""

    def convert_fully_connected(self, op):
        from tflite.FullyConnectedOptions import FullyConnectedOptions
        from tvm import relax

        from ..schedules import hybrid

        inputs = self.get_input_tensors(op)
        x_t, w_t = inputs[0], inputs[1]
        if not is_hybrid(x_t, w_t):
            return original(self, op)
        opts = FullyConnectedOptions()
        table = op.BuiltinOptions()
        opts.Init(table.Bytes, table.Pos)
        w = self.get_tensor_value(w_t)  # [N, K]
        k = w.shape[1]
        scheme = (hybrid.ASYMMETRIC if opts.AsymmetricQuantizeInputs() else hybrid.SYMMETRIC,
                  hybrid.ROW_SCALE)
        x = self.get_tensor_expr(x_t)
        in_shape = _recorded_shape(x_t.tensor)
        if in_shape[-1] != k:  # TFLite reads any input as rows of K
            x = relax.op.reshape(x, (int(np.prod(in_shape)) // k, k))
        y = relax.op.matmul(x, _hybrid_weight(self, w.T, w_t, 1, scheme))
        y = _hybrid_finish(self, y, inputs, opts.FusedActivationFunction())
        out_shape = _recorded_shape(self.get_output_tensors(op)[0].tensor)
        rows = int(np.prod(in_shape)) // k
        made = (*in_shape[:-1], w.shape[0]) if in_shape[-1] == k else (rows, w.shape[0])
        return relax.op.reshape(y, out_shape) if tuple(made) != tuple(out_shape) else y

    return convert_fully_connected


def _hybrid_batch_matmul(self, op, a_t, b_t, out_t, opts):
    """A dynamic-range BATCH_MATMUL (float32 x times a constant int8 y), as TFLite's
    ``EvalHybrid`` computes it: each row of x (after ``adj_x``) quantized on its own, the
    sums scaled by the row's scale times the weight's, no bias. With one weight matrix
    (y 2-D, or its batch axes all 1) that is a hybrid dense layer over all rows of x; with
    several, one hybrid dense layer per batch index of the broadcast batch shape, on x's
    slice and y's matrix there, each bound to a ``part_name`` of the operator (the pass
    takes each one as a layer of this operator), their outputs concatenated."""
    from tvm import relax

    from ..schedules import hybrid

    # the importer has refused what TFLite does not compute as a product of constants
    # (``importer._hybrid_batch_matmul_problem``)
    w = self.get_tensor_value(b_t)
    if opts.AdjY():
        w = np.swapaxes(w, -1, -2)
    *w_batch, k, n = w.shape
    x, x_shape = self.get_tensor_expr(a_t), _recorded_shape(a_t.tensor)
    if opts.AdjX():
        x = _last_two_swapped(x, len(x_shape))
        x_shape = (*x_shape[:-2], x_shape[-1], x_shape[-2])
    *x_batch, m, _ = x_shape
    scheme = (hybrid.ASYMMETRIC if opts.AsymmetricQuantizeInputs() else hybrid.SYMMETRIC,
              hybrid.ROW_SCALE)
    out_shape = _recorded_shape(out_t.tensor)
    matrices = w.reshape(-1, k, n)
    if len(matrices) == 1:
        rows = int(np.prod(x_batch, dtype=np.int64)) * m
        y = relax.op.matmul(relax.op.reshape(x, (rows, k)),
                            _hybrid_weight(self, matrices[0], b_t, 1, scheme))
        return relax.op.reshape(y, out_shape)
    batch = np.broadcast_shapes(tuple(x_batch), tuple(w_batch))
    x3 = relax.op.reshape(x, (int(np.prod(x_batch, dtype=np.int64)), m, k))
    weights, parts = {}, []
    index = self.armq_positions[op._tab.Pos]
    for part, at in enumerate(np.ndindex(*batch)):
        xi, wi = (_broadcast_index(at, tuple(dims)) for dims in (x_batch, w_batch))
        if wi not in weights:
            weights[wi] = _hybrid_weight(self, matrices[wi], b_t, 1, scheme)
        x_slice = relax.op.reshape(
            relax.op.strided_slice(x3, axes=[0], begin=[xi], end=[xi + 1]), (m, k))
        parts.append(self.bb.emit(relax.op.matmul(x_slice, weights[wi]),
                                  name_hint=part_name(index, "BATCH_MATMUL", part)))
    return relax.op.reshape(relax.op.concat(parts, axis=0), out_shape)


def tflite_hybrid_batch_axes(x_shape, w_shape, adj_x: bool, asymmetric: bool) -> bool:
    """Whether TFLite's hybrid BATCH_MATMUL computes the rows' product for these operand
    shapes. Its kernel steps through the input scales and zero points by rows x batch
    index on every batch axis (and through the weights' row sums by columns x batch index),
    so the product is right only while x has at most one batch axis above 1 (the weight
    too, where the input is asymmetric and the row sums count), after TFLite merges x's
    third-last axis into its rows (for a weight whose third-last axis is 1, without
    adj_x)."""
    xs, ws = list(x_shape), list(w_shape)
    if not adj_x and len(xs) > 2 and len(ws) > 2 and ws[-3] == 1:
        xs, ws = xs[:-3] + [xs[-3] * xs[-2], xs[-1]], ws[:-3] + ws[-2:]
    above = [sum(d > 1 for d in shape[:-2]) for shape in (xs, ws)]
    return above[0] <= 1 and (not asymmetric or above[1] <= 1)


def _broadcast_index(at: tuple, dims: tuple) -> int:
    """The flat index into batch axes ``dims`` of the broadcast batch index ``at`` (axes
    aligned at the right, an axis of size 1 read at 0)."""
    own = at[len(at) - len(dims):]
    return int(np.ravel_multi_index(tuple(i if d > 1 else 0 for i, d in zip(own, dims)),
                                    dims)) if dims else 0


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """(before, after) of TFLite's SAME padding along one axis (``ComputePaddingHeightWidth``:
    the output is ceil(size / stride), the odd pixel after)."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size)
    return total // 2, total - total // 2


def _convert_conv(original):
    """A dynamic-range CONV_2D or DEPTHWISE_CONV_2D as conv2d(x, dequantize(W)) + bias and
    its activation (NHWC, HWIO; a depthwise weight [kh, kw, 1, C * M] with C groups), the
    weight's variable naming TFLite's computation: a CONV_2D with per-channel scales (or a
    grouped one) quantizes the image asymmetrically and scales channel first, one with a
    single scale symmetrically and by the row's scale times the weight's (``conv.cc``'s
    two hybrid paths); a DEPTHWISE_CONV_2D quantizes the image asymmetrically and scales by
    the weight's scale times the image's (``DepthwiseConvHybridPerChannel``). TVM's for any
    other convolution."""

    def convert_conv(self, op, conv_type):
        from tflite.Conv2DOptions import Conv2DOptions
        from tflite.DepthwiseConv2DOptions import DepthwiseConv2DOptions
        from tflite.Padding import Padding
        from tvm import relax

        from ..schedules import hybrid

        inputs = self.get_input_tensors(op)
        x_t, w_t = inputs[0], inputs[1]
        if conv_type not in ("conv2d", "depthwise") or not is_hybrid(x_t, w_t):
            return original(self, op, conv_type=conv_type)
        depthwise = conv_type == "depthwise"
        opts = DepthwiseConv2DOptions() if depthwise else Conv2DOptions()
        table = op.BuiltinOptions()
        opts.Init(table.Bytes, table.Pos)
        w = self.get_tensor_value(w_t)  # OHWI; a depthwise weight [1, kh, kw, C * M]
        _, h, wd, in_c = _recorded_shape(x_t.tensor)
        if depthwise:
            w_hwio = w.transpose(1, 2, 0, 3)  # [kh, kw, 1, C * M]: one channel per group
            scheme = (hybrid.ASYMMETRIC, hybrid.ROW_SCALE)
            groups = in_c
        else:
            w_hwio = w.transpose(1, 2, 3, 0)
            scales = np.atleast_1d(w_t.tensor.Quantization().ScaleAsNumpy())
            per_channel = scales.size > 1 and bool((scales != scales[0]).any())
            scheme = ((hybrid.ASYMMETRIC, hybrid.CHANNEL_FIRST)
                      if per_channel or w.shape[3] != in_c
                      else (hybrid.SYMMETRIC, hybrid.ROW_SCALE))
            groups = in_c // w.shape[3]
        kh, kw = w_hwio.shape[:2]
        strides = (opts.StrideH(), opts.StrideW())
        dilation = (opts.DilationHFactor(), opts.DilationWFactor())
        pads = ((0, 0), (0, 0))
        if opts.Padding() == Padding.SAME:
            pads = tuple(same_padding(n, k, s, d) for n, k, s, d in
                         zip((h, wd), (kh, kw), strides, dilation))
        w_f = _hybrid_weight(self, w_hwio, w_t, 3, scheme)
        y = relax.op.nn.conv2d(self.get_tensor_expr(x_t), w_f, strides=strides,
                               padding=(pads[0][0], pads[1][0], pads[0][1], pads[1][1]),
                               dilation=dilation, groups=groups, data_layout="NHWC",
                               kernel_layout="HWIO", out_dtype="float32")
        return _hybrid_finish(self, y, inputs, opts.FusedActivationFunction())

    return convert_conv


def _check_unsupported_ops(original):
    """TVM's check of the model's ops, without its refusal of dynamic-range ops that our
    converters import (``HYBRID_OPS``; the importer refuses the others first, naming the
    operator). TVM raises one error listing every kind of gap, a line each: the line of
    dynamic-range ops is dropped when it names ours only, and any other line still raises."""

    def check_unsupported_ops(self):
        import tvm

        try:
            original(self)
        except tvm.error.OpNotImplemented as e:
            kept = []
            for line in str(e).splitlines():
                found = re.search(r"likely to have dynamic range quantization: (.*?)\. ", line)
                if found and set(re.findall(r"'(\w+)'", found.group(1))) <= set(HYBRID_OPS):
                    continue
                kept.append(line)
            if any(line.strip() for line in kept):
                raise tvm.error.OpNotImplemented("\n".join(kept)) from None

    return check_unsupported_ops


def _bind_named(converter, code: str, convert, positions: dict):
    """``convert`` with its result (a call) emitted as the variable ``op<index>_<code>``."""

    def named(*args, **kwargs):  # called as convert(op=op); some entries are partials
        from tvm import relax

        result = convert(*args, **kwargs)
        op = kwargs["op"] if "op" in kwargs else args[0]
        index = positions.get(op._tab.Pos)
        if isinstance(result, relax.Call) and index is not None:
            return converter.bb.emit(result, name_hint=operator_name(index, code))
        return result

    return named


def _naming_init(original):
    def __init__(self, model, subgraph, *args, **kwargs):
        original(self, model, subgraph, *args, **kwargs)
        positions = {subgraph.Operators(i)._tab.Pos: i for i in range(subgraph.OperatorsLength())}
        self.armq_positions = positions  # a converter naming the variables of its parts
        for code, convert in list(self.convert_map.items()):
            self.convert_map[code] = _bind_named(self, code, convert, positions)

    return __init__


def extend() -> None:
    """Extend TVM's TFLite frontend as the docstring says (idempotent)."""
    from tvm.relax.frontend.tflite import tflite_frontend

    conv = tflite_frontend.OperatorConverter
    if getattr(conv, _MARK, False):
        return
    conv._SUPPORTED_QUANTIZED_OPS = conv._SUPPORTED_QUANTIZED_OPS | EXACT_DATA_MOVEMENT_OPS
    conv.convert_reshape = _fold_computed_reshape(conv.convert_reshape)
    conv.convert_expand_dims = _convert_expand_dims
    conv._SUPPORTED_QUANTIZED_OPS = conv._SUPPORTED_QUANTIZED_OPS | {
        "PRELU", "RESIZE_NEAREST_NEIGHBOR", "GELU", "BATCH_MATMUL"}
    conv.convert_transpose_conv = _convert_transpose_conv(conv.convert_transpose_conv)
    conv.convert_prelu = _convert_prelu(conv.convert_prelu)
    conv.convert_softmax = _convert_softmax(conv.convert_softmax)
    conv.convert_gelu = _convert_gelu(conv.convert_gelu)
    conv.convert_batch_matmul = _convert_batch_matmul(conv.convert_batch_matmul)
    conv.convert_fully_connected = _convert_fully_connected(conv.convert_fully_connected)
    conv.convert_conv = _convert_conv(conv.convert_conv)
    conv.check_unsupported_ops = _check_unsupported_ops(conv.check_unsupported_ops)
    conv.get_tensors = _one_scale_per_tensor(conv.get_tensors)
    conv.__init__ = _naming_init(conv.__init__)
    setattr(conv, _MARK, True)
