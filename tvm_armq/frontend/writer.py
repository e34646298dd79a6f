"""Write .tflite files directly, for what TensorFlow's converter cannot make.

The zoo (``tvm_armq.zoo``) builds its models with TensorFlow's converter, which today emits
int8 only. Legacy uint8 models (asymmetric weights), exact quantization parameters chosen
by a test, and the fuzzer's random layers (``scripts/fuzz.py``) need the flatbuffer
written by hand: ``graph_model`` writes any list of operators over a list of tensors with
the ``tflite`` package's builders, ``single_op_model`` the common case of one operator.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Operator:
    """One operator of a graph: its builtin code (a ``tflite.BuiltinOperator``), the indices
    of its input and output tensors, its options as (``tflite.BuiltinOptions`` type,
    function(builder) -> offset) or None, and the operator version."""

    op: int
    inputs: tuple
    outputs: tuple
    options: tuple | None = None
    version: int = 2


def _vector(builder, start, values, prepend):
    start(builder, len(values))
    for v in reversed(values):
        prepend(v)
    return builder.EndVector()


def single_op_model(op: int, tensors, inputs, outputs, options=None, version: int = 2) -> bytes:
    """A .tflite flatbuffer with one operator ``op`` (a ``tflite.BuiltinOperator``).

    ``tensors``: dicts with ``shape``, ``dtype`` and optionally ``q`` = (scale, zero point),
    or (scales, zero points, axis) for per-channel quantization along ``axis``, and
    ``data`` (a constant, e.g. MEAN's axes); ``inputs``/``outputs``: tensor indices;
    ``options``: (``tflite.BuiltinOptions`` type, function(builder) -> offset) or None.
    Non-constant inputs become the model's inputs, in order."""
    graph_in = [i for i in inputs if tensors[i].get("data") is None]
    return graph_model(tensors, [Operator(op, tuple(inputs), tuple(outputs), options, version)],
                       graph_in, list(outputs))


def graph_model(tensors, operators: list[Operator], inputs, outputs) -> bytes:
    """A .tflite flatbuffer with ``operators`` (in execution order) over ``tensors`` (dicts
    as for ``single_op_model``); ``inputs`` and ``outputs`` are the model's input and output
    tensor indices, in order."""
    import flatbuffers
    import tflite

    types = {"int8": tflite.TensorType.INT8, "uint8": tflite.TensorType.UINT8,
             "int16": tflite.TensorType.INT16, "int32": tflite.TensorType.INT32,
             "int64": tflite.TensorType.INT64, "float32": tflite.TensorType.FLOAT32}
    b = flatbuffers.Builder(1024)
    tflite.BufferStart(b)
    buffers, tensor_buffer = [tflite.BufferEnd(b)], []  # buffer 0: empty, by convention
    for t in tensors:
        if t.get("data") is None:
            tensor_buffer.append(0)
            continue
        data = b.CreateByteVector(np.ascontiguousarray(t["data"]).tobytes())
        tflite.BufferStart(b)
        tflite.BufferAddData(b, data)
        buffers.append(tflite.BufferEnd(b))
        tensor_buffer.append(len(buffers) - 1)
    offsets = []
    for i, t in enumerate(tensors):
        name = b.CreateString(f"t{i}")
        shape = _vector(b, tflite.TensorStartShapeVector, list(t["shape"]), b.PrependInt32)
        quant = None
        if t.get("q") is not None:
            # (scale, zero point), or (scales, zero points, axis): one per channel of axis
            scales, zps = np.atleast_1d(t["q"][0]), np.atleast_1d(t["q"][1])
            scale = _vector(b, tflite.QuantizationParametersStartScaleVector,
                            [float(v) for v in scales], b.PrependFloat32)
            zp = _vector(b, tflite.QuantizationParametersStartZeroPointVector,
                         [int(v) for v in zps], b.PrependInt64)
            tflite.QuantizationParametersStart(b)
            tflite.QuantizationParametersAddScale(b, scale)
            tflite.QuantizationParametersAddZeroPoint(b, zp)
            if len(t["q"]) > 2:
                tflite.QuantizationParametersAddQuantizedDimension(b, int(t["q"][2]))
            quant = tflite.QuantizationParametersEnd(b)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        tflite.TensorAddType(b, types[t["dtype"]])
        tflite.TensorAddBuffer(b, tensor_buffer[i])
        tflite.TensorAddName(b, name)
        if quant is not None:
            tflite.TensorAddQuantization(b, quant)
        offsets.append(tflite.TensorEnd(b))
    codes_of: dict[tuple[int, int], int] = {}  # (builtin op, version) -> opcode index
    op_offsets = []
    for o in operators:
        index = codes_of.setdefault((o.op, o.version), len(codes_of))
        opts = o.options[1](b) if o.options else None
        op_in = _vector(b, tflite.OperatorStartInputsVector, list(o.inputs), b.PrependInt32)
        op_out = _vector(b, tflite.OperatorStartOutputsVector, list(o.outputs), b.PrependInt32)
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, index)
        tflite.OperatorAddInputs(b, op_in)
        tflite.OperatorAddOutputs(b, op_out)
        if opts is not None:
            tflite.OperatorAddBuiltinOptionsType(b, o.options[0])
            tflite.OperatorAddBuiltinOptions(b, opts)
        op_offsets.append(tflite.OperatorEnd(b))
    tens = _vector(b, tflite.SubGraphStartTensorsVector, offsets, b.PrependUOffsetTRelative)
    g_in = _vector(b, tflite.SubGraphStartInputsVector, list(inputs), b.PrependInt32)
    g_out = _vector(b, tflite.SubGraphStartOutputsVector, list(outputs), b.PrependInt32)
    g_ops = _vector(b, tflite.SubGraphStartOperatorsVector, op_offsets,
                    b.PrependUOffsetTRelative)
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tens)
    tflite.SubGraphAddInputs(b, g_in)
    tflite.SubGraphAddOutputs(b, g_out)
    tflite.SubGraphAddOperators(b, g_ops)
    graph = tflite.SubGraphEnd(b)
    code_offsets = []
    for op, version in codes_of:  # in index order: dicts keep insertion order
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddBuiltinCode(b, op)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(op, 127))  # the pre-2.4 field
        tflite.OperatorCodeAddVersion(b, version)
        code_offsets.append(tflite.OperatorCodeEnd(b))
    codes = _vector(b, tflite.ModelStartOperatorCodesVector, code_offsets,
                    b.PrependUOffsetTRelative)
    graphs = _vector(b, tflite.ModelStartSubgraphsVector, [graph], b.PrependUOffsetTRelative)
    bufs = _vector(b, tflite.ModelStartBuffersVector, buffers, b.PrependUOffsetTRelative)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)  # the schema version TFLite reads
    tflite.ModelAddOperatorCodes(b, codes)
    tflite.ModelAddSubgraphs(b, graphs)
    tflite.ModelAddBuffers(b, bufs)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def options(kind: str, **fields) -> tuple:
    """A builtin options table for ``single_op_model`` / ``Operator``: ``kind`` is the
    table's name in the TFLite schema (``"Conv2DOptions"``) and each keyword one of its
    fields, as the ``tflite`` package spells the adder (``Padding``, ``StrideW``,
    ``FusedActivationFunction``, ...). Scalar fields only."""
    import tflite

    start, end = getattr(tflite, f"{kind}Start"), getattr(tflite, f"{kind}End")
    adders = [(getattr(tflite, f"{kind}Add{name}"), value) for name, value in fields.items()]

    def build(b):
        start(b)
        for add, value in adders:
            add(b, value)
        return end(b)

    return getattr(tflite.BuiltinOptions, kind), build
