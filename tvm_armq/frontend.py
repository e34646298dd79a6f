"""What tvm_armq adds to TVM's TFLite frontend: exact quantized data movement, static
reshapes, and Relax variables named after the TFLite operator they come from.

Read this first. TVM 0.27's TFLite frontend (``tvm.relax.frontend.tflite``) refuses a
model outright if any operator with a quantized tensor is missing from its list of
quantized ops it trusts. Some missing ones only move int8 bytes; TFLite's own kernels for
them copy bytes too, whatever the scales, so the frontend's conversion (the same
``strided_slice`` / ``reshape`` / ``take`` of the int8 tensor) is exact:

    PAD, PADV2          the int8 tensor padded with its zero point
    SHAPE               the shape of a tensor (int32, no arithmetic on the data)
    STRIDED_SLICE, SLICE, SPLIT, SPLIT_V, SQUEEZE, EXPAND_DIMS, TRANSPOSE, PACK, GATHER
                        bytes moved or selected; nothing rounds

Converters emit SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE around Keras ``Reshape`` layers
(squeeze-excite blocks): the RESHAPE's target shape is then a tensor computed in the
graph, which the frontend cannot turn into a Relax shape. Every tensor records its shape in
the flatbuffer (the sizes the model was converted with, which are the sizes the frontend
imports it with), so such a RESHAPE is folded at compile time to its output's shape, and
the shape arithmetic before it is left unused (dead code, removed by the pass).

TVM 0.27's EXPAND_DIMS converter fails on every model (it passes ``expand_dims`` a third
argument); ``_convert_expand_dims`` replaces it.

Each TFLite operator's result is bound to a Relax variable named ``op<index>_<code>``
(``op12_hard_swish``, see ``operator_name`` / ``operator_of``): the pass reads which
TFLite operator a chain of Relax calls came from (to choose TFLite's arithmetic for it,
and to name it in reports and errors), and ``diff`` maps layers back to TFLite tensors.
"""

from __future__ import annotations

import re

import numpy as np

# Quantized ops whose frontend conversion moves int8 bytes only (see the docstring).
EXACT_DATA_MOVEMENT_OPS = frozenset({
    "PAD", "PADV2", "SHAPE", "STRIDED_SLICE", "SLICE", "SPLIT", "SPLIT_V", "SQUEEZE",
    "EXPAND_DIMS", "TRANSPOSE", "PACK", "GATHER",
})

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


def _recorded_shape(tensor) -> tuple[int, ...]:
    """The shape a flatbuffer tensor records. A dimension the model leaves open (-1 in its
    shape signature, Keras' batch) is recorded as the size the model was converted with,
    and the frontend imports the model's inputs with exactly those sizes."""
    return tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()


def _fold_computed_reshape(original):
    """RESHAPE whose target shape is computed in the graph -> its output's recorded shape
    (when that holds as many elements as the input)."""

    def convert_reshape(self, op):
        from tvm import relax

        inputs = self.get_input_tensors(op)
        shape = _recorded_shape(self.get_output_tensors(op)[0].tensor)
        if len(inputs) == 2 and self.has_expr(inputs[1].tensor_idx):
            x = self.get_expr(inputs[0].tensor_idx)
            in_shape = [int(d) for d in self.bb.normalize(x).ty.shape]
            if int(np.prod(in_shape)) == int(np.prod(shape)):
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
    conv.__init__ = _naming_init(conv.__init__)
    setattr(conv, _MARK, True)
