"""A TFLite model as TVM 0.27's TFLite frontend imports it (a Relax module, QDQ: every
quantized layer dequantize -> float op -> quantize), refused with an error that names the
tensor or operator when the frontend cannot import it or tvm_armq cannot compile it
(int16 activations, a dynamic-range op without a hybrid kernel) instead of a bare
TypeError or KeyError.
"""

from __future__ import annotations

import os
import sys

from .converters import HYBRID_OPS
from .model import TFLiteModel


class UnsupportedModel(ValueError):
    """A valid TFLite model that TVM's TFLite frontend cannot import (a tensor type or an
    operator it has no conversion for); the message names the model and what is at fault."""


# Tensor types TVM 0.27's TFLite frontend imports (tflite.TensorType names). int16
# activations (TFLite's 16x8 quantization) and the rest stop it with a bare TypeError.
IMPORTABLE_TYPES = ("FLOAT32", "INT8", "UINT8", "INT32", "INT64", "BOOL")


def _unsupported_tensor(m: TFLiteModel) -> str | None:
    """What TVM's frontend would choke on among the model's tensor types, said plainly."""
    import tflite

    names = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}
    fb = m.flatbuffer()
    for g in range(fb.SubgraphsLength()):
        graph = fb.Subgraphs(g)
        for i in range(graph.TensorsLength()):
            t = graph.Tensors(i)
            kind = names.get(t.Type(), str(t.Type()))
            if kind not in IMPORTABLE_TYPES:
                hint = (" (16x8 quantization: int16 activations, int8 weights)"
                        if kind == "INT16" else "")
                return (f"tensor {i} ({(t.Name() or b'').decode(errors='replace')!r}) is "
                        f"{kind.lower()}{hint}; TVM's TFLite frontend imports "
                        f"{', '.join(k.lower() for k in IMPORTABLE_TYPES)} tensors: convert "
                        "the model with int8 quantization")
    return None


def _dynamic_range_op(m: TFLiteModel) -> str | None:
    """The first dynamic-range quantized operator (float32 activations, int8 weights
    quantized offline, the input quantized at run time by TFLite) that tvm_armq cannot
    compile (not one of ``converters.HYBRID_OPS``), said plainly."""
    import tflite

    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    fb = m.flatbuffer()
    graph = fb.Subgraphs(0)
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        tensors = [graph.Tensors(t) if t >= 0 else None for t in op.InputsAsNumpy()]
        if not tensors or tensors[0] is None:
            continue
        first = tensors[0]
        weights = [t for t in tensors[1:] if t is not None and t.Type() == tflite.TensorType.INT8
                   and t.Quantization() is not None and t.Quantization().ScaleLength() > 0]
        if first.Type() == tflite.TensorType.FLOAT32 and weights:
            code = fb.OperatorCodes(op.OpcodeIndex())
            kind = names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "?")
            if kind == "BATCH_MATMUL":
                problem = _hybrid_batch_matmul_problem(fb, op, tensors)
                if problem:
                    return f"operator {i} (BATCH_MATMUL): {problem}"
            if kind in HYBRID_OPS:
                continue
            ops = f"{', '.join(HYBRID_OPS[:-1])} and {HYBRID_OPS[-1]}"
            return (f"operator {i} ({kind}) is dynamic-range quantized (float32 activations, "
                    f"int8 weights): tvm_armq compiles {ops} of such models, not this op; "
                    "convert the model with a representative dataset (TFLite's full "
                    "integer quantization)")
    return None


def _hybrid_batch_matmul_problem(fb, op, tensors) -> str | None:
    """Why a dynamic-range BATCH_MATMUL cannot be compiled as TFLite computes it, or None:
    its int8 operand must be a constant (the hybrid kernel's weights), with one scale or
    one per column, and the batch axes as ``converters.tflite_hybrid_batch_axes`` says."""
    from tflite.BatchMatMulOptions import BatchMatMulOptions

    from .converters import tflite_hybrid_batch_axes

    x, w = tensors[0], tensors[1]
    if fb.Buffers(w.Buffer()).DataLength() == 0:
        return ("a float32 operand times an int8 operand that is not a constant: TFLite "
                "runs its hybrid kernel on a constant int8 operand only")
    opts = BatchMatMulOptions()
    table = op.BuiltinOptions()
    opts.Init(table.Bytes, table.Pos)
    x_shape, w_shape = (tuple(int(d) for d in t.ShapeAsNumpy()) for t in (x, w))
    q = w.Quantization()
    columns = len(w_shape) - (2 if opts.AdjY() else 1)
    if q.ScaleLength() > 1 and q.QuantizedDimension() != columns:
        return (f"the int8 operand's scales run along its axis {q.QuantizedDimension()}, "
                f"not along its columns (axis {columns}), as TFLite's hybrid kernel reads them")
    if not tflite_hybrid_batch_axes(x_shape, w_shape, bool(opts.AdjX()),
                                    bool(opts.AsymmetricQuantizeInputs())):
        return (f"a float32 {x_shape} times an int8 {w_shape}: with two batch axes above 1, "
                "TFLite's hybrid kernel reads each row's input scale (and zero point, and "
                "the weights' row sums) at the sum of the batch indices rather than at the "
                "row's own (reference/batch_matmul.h), so its result is not the rows' "
                "product; tvm_armq compiles one with at most one batch axis above 1 (merge "
                "the batch axes with a RESHAPE first)")
    return None


def _drop_block_builders(error: BaseException) -> None:
    """Free what a failed import leaves in its frames, and in those of the errors it chains
    (the frontend's BlockBuilder), with
    the process's stderr muted: the builder's C++ destructor warns ("BlockBuilder destroyed
    with remaining blocks!") when the frontend stopped inside a function's scope, a line
    the user should not see after tvm_armq's own error. The frames keep their code and
    line numbers for ``--debug``'s traceback. (Reading a frame's ``f_locals`` would keep
    its locals alive: nothing here does.)"""
    import gc
    import traceback

    chain, seen = [], set()
    while error is not None and id(error) not in seen:  # the error and the ones it chains
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            for e in chain:
                traceback.clear_frames(e.__traceback__)
            gc.collect()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def import_tflite(model) -> "tvm.IRModule":
    """The Relax module of a TFLite model, as TVM's TFLite frontend imports it.

    Raises ``UnsupportedModel`` naming the tensor or operator when the frontend cannot
    import the model (it would otherwise fail with a bare TypeError or KeyError)."""
    from tvm.relax.frontend.tflite import from_tflite

    m = TFLiteModel.load(model)
    problem = _unsupported_tensor(m) or _dynamic_range_op(m)
    if problem:
        raise UnsupportedModel(f"{m.label}: {problem}")
    try:
        mod = from_tflite(m.flatbuffer())
    except Exception as e:  # noqa: BLE001 - whatever the frontend trips on, it is the model
        _drop_block_builders(e)
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise UnsupportedModel(f"{m.label}: TVM's TFLite frontend cannot import it "
                               f"({type(e).__name__}: {first})") from e
    return mod[0] if isinstance(mod, tuple) else mod
