"""Where does a compiled model drift from TFLite? Every layer's output, compared in order.

Read this first. ``python -m tvm_armq diff MODEL.tflite --isa LEVEL`` answers it:

1. The model is imported as usual; the frontend names each TFLite operator's result
   ``op<index>_<code>`` (``frontend/converters.py``). ``keep_every_layer`` makes ``main``
   return all of those tensors instead of the model's outputs alone.
2. That module is compiled for the level exactly as ``compile_tflite`` compiles the model
   (tvm_armq's pass, then TVM's pipeline; or stock TVM alone with ``stock=True``), run on
   the device, and every layer's tensor comes back.
3. TFLite's reference kernels run the same input with every intermediate tensor kept
   (``experimental_preserve_all_tensors``); each operator's output tensor is read.
4. The two are compared operator by operator in graph order. ``LayerDiff`` records say,
   for each operator, which kernel ran it and by how much it differs; the first one that
   differs is where the drift starts (every later layer inherits it).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from .frontend.converters import operator_name, operator_of
from .frontend.model import TFLiteModel
from .report import Lowered


@dataclasses.dataclass(frozen=True)
class LayerDiff:
    """One TFLite operator's output, tvm_armq's against TFLite's reference kernels."""

    index: int          # the operator's index in the TFLite graph
    op: str             # its op code, e.g. "CONV_2D"
    kernel: str         # what ran it: a tvm_armq kernel, "float (QDQ)", or "frontend"
    shape: tuple
    max_diff: float     # the largest |difference| (an integer for an integer tensor)
    differ: int         # how many elements differ

    def line(self) -> str:
        verdict = "equal" if self.max_diff == 0 else \
            f"DIFFERS by up to {self.max_diff:g} in {self.differ}/{int(np.prod(self.shape))}"
        return (f"op {self.index:4d} {self.op:22s} {str(self.shape):20s} "
                f"{self.kernel:32s} {verdict}")


def keep_every_layer(mod):
    """``mod`` whose ``main`` returns every tensor bound to a named TFLite operator, in
    operator order, and the list of (operator index, op code) they stand for."""
    from tvm import relax

    mod = relax.transform.ToNonDataflow()(mod)  # dataflow variables cannot be returned
    func = mod["main"]
    kept = []
    for block in func.body.blocks:
        for binding in block.bindings:
            op = operator_of(binding.var.name)
            if op is not None and isinstance(binding.var.ty, relax.TensorType):
                kept.append((op, binding.var))
    kept.sort(key=lambda item: item[0][0])
    out = relax.Tuple([var for _, var in kept])
    body = relax.SeqExpr(func.body.blocks, out)
    ret = relax.TupleType([var.ty for _, var in kept])
    mod["main"] = relax.Function(func.params, body, ret, attrs=func.attrs)
    return relax.transform.Normalize()(mod), [op for op, _ in kept]


def _kernels(report: list) -> dict[str, str]:
    """Relax variable name -> the kernel the pass chose for it (or "float (QDQ)")."""
    return {r.name: (r.kernel if isinstance(r, Lowered) else "float (QDQ)") for r in report}


def _reference_tensors(model: TFLiteModel, inputs, operators) -> list[np.ndarray]:
    """TFLite's (``BUILTIN_REF``) output tensor of each operator, for ``inputs``."""
    it = model.reference_run(inputs, keep_all_tensors=True)
    graph = model.flatbuffer().Subgraphs(0)
    return [it.get_tensor(int(graph.Operators(index).Outputs(0))) for index, _ in operators]


def diff_layers(model, level: str, session, inputs=None, *, stock: bool = False,
                workdir=None) -> list[LayerDiff]:
    """Run ``model`` for ISA ``level`` on the RPC ``session`` with every layer kept and
    compare each layer with TFLite's; ``stock=True`` compiles with stock TVM (its float
    path) instead of tvm_armq's kernels. Returns one ``LayerDiff`` per operator, in order."""
    import tvm

    from . import build, export, hooks, targets
    from .frontend import importer

    model = TFLiteModel.load(model)
    inputs = model.random_inputs() if inputs is None else inputs
    mod, operators = keep_every_layer(importer.import_tflite(model))
    target = targets.resolve(level)
    report: list = []
    if not stock:
        mod = build.lower(mod, target, report=report)
    exe = tvm.compile(mod, target=target, relax_pipeline=hooks.stock_pipeline())
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        lib = export.export_aarch64(exe, Path(tmp) / "layers.so")
        got = build.run_on_device(session, lib, inputs)
    expected = _reference_tensors(model, inputs, operators)
    kernels = _kernels(report)
    out = []
    for (index, code), g, e in zip(operators, got, expected):
        kernel = "stock TVM" if stock else kernels.get(operator_name(index, code), "frontend")
        if g.shape != e.shape:
            raise RuntimeError(f"op {index} {code}: tvm_armq computed shape {g.shape}, "
                               f"TFLite {e.shape}")
        d = difference(g, e)
        worst = d.max(initial=0)
        out.append(LayerDiff(index, code, kernel, tuple(e.shape),
                             float(worst) if d.dtype.kind == "f" else int(worst),
                             int((d > 0).sum())))
    return out


def difference(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """|got - expected| per element: int64 for integer tensors, float64 for float ones
    (0 where both are the same NaN or equal: a float tensor is compared value for value,
    not truncated to integers)."""
    if np.issubdtype(expected.dtype, np.floating):
        same = (got == expected) | (np.isnan(got) & np.isnan(expected))
        return np.where(same, 0.0, np.abs(got.astype(np.float64) - expected))
    return np.abs(got.astype(np.int64) - expected.astype(np.int64))


def first_difference(layers: list[LayerDiff]) -> LayerDiff | None:
    """The first layer (in graph order) whose output differs from TFLite's, or None."""
    return next((layer for layer in layers if layer.max_diff), None)
