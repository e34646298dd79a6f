"""Reading a Relax function the way tvm_armq's passes need it, and rewriting it.

TVM 0.27's TFLite frontend imports a quantized model as QDQ chains (``dequantize`` ->
float op -> ``quantize``, a fused activation as a ``clip``). The passes (``passes.integer``:
int8 layers to integer kernels; ``passes.bf16``: float layers to bf16 GEMMs) match
those chains through what is here: ``Graph`` (what each variable was computed from and
how often it is used), the dtype and shape of an expression, constants behind reshapes
and transposes, a tensor's quantization (``QParams``), the clamp a fused activation
stands for (``fused_activation``: TFLite's range, not the frontend's rounding of it), and
``rewrite_functions``, which runs a rewriter over every function and drops what the
rewrites left unused. A matcher that cannot make a chain integer raises ``NotInteger``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..frontend.layers import (ACT_NONE, ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1,
                               activation_range)


class NotInteger(Exception):
    """Raised by a matcher: this chain cannot become integer (the message says why)."""


class Graph:
    """The bindings of one Relax function: what each variable was computed from
    (``defs``), how often each is read (``uses``), and the variable each bound value
    is bound to (``var_of``, keyed by the value object)."""

    def __init__(self, func):
        from tvm import relax

        self.defs, self.uses = {}, {}

        def count(expr):
            if isinstance(expr, relax.Var):
                self.uses[expr] = self.uses.get(expr, 0) + 1
            elif isinstance(expr, relax.Call):
                for a in expr.args:
                    count(a)
            elif isinstance(expr, relax.Tuple):
                for a in expr.fields:
                    count(a)
            elif isinstance(expr, relax.TupleGetItem):
                count(expr.tuple_value)

        for block in func.body.blocks:
            for b in block.bindings:
                self.defs[b.var] = b.value
                count(b.value)
        count(func.body.body)
        self.var_of = {value: var for var, value in self.defs.items()}
        # kernel calls a family shares between layers of this function (the hybrid
        # family's quantized input, read by every layer of the same input and scheme)
        self.shared: dict = {}

    def call(self, expr, *ops):
        """The Call that defines ``expr`` if it is one of ``ops``, else None."""
        from tvm import relax

        value = self.defs.get(expr) if isinstance(expr, relax.Var) else expr
        if isinstance(value, relax.Call) and isinstance(value.op, op_type()) \
                and value.op.name in ops:
            return value
        return None

    def const(self, expr) -> np.ndarray | None:
        """The value of ``expr`` if it is a constant, or a transpose/reshape of one."""
        from tvm import relax

        if isinstance(expr, relax.Var):
            expr = self.defs.get(expr)
        if expr is None:
            return None
        if is_const(expr):
            return expr.value.numpy()
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") in (
                "relax.permute_dims", "relax.reshape"):
            inner = self.const(expr.args[0])
            if inner is None:
                return None
            shape = [int(d) for d in expr.ty.shape]
            if expr.op.name == "relax.reshape":
                return inner.reshape(shape)
            axes = expr.attrs.axes
            return inner.transpose([int(a) for a in axes] if axes is not None else None)
        return None


def op_type():
    import tvm

    return tvm.ir.Op


def is_const(expr) -> bool:
    import tvm

    return isinstance(expr, tvm.ir.expr.Constant)


def shape_of(expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape)


def dtype_of(expr) -> str:
    return str(expr.ty.dtype)


@dataclasses.dataclass(frozen=True)
class QParams:
    """Scale(s) and zero point(s) of a quantized tensor, float32 as in the model."""

    scale: np.ndarray   # float32, shape () per tensor or (C,) per channel
    zp: np.ndarray      # int32, same shape
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1

    def per_channel(self, n: int) -> np.ndarray:
        """The scales as float64, one per each of ``n`` channels (a per-tensor scale
        repeated): a weight's scales, for the per-channel requantization."""
        return np.broadcast_to(self.scale.astype(np.float64).reshape(-1), (n,)).copy()

    def scalar(self, what: str) -> tuple[float, int]:
        if not self.per_tensor:
            raise NotInteger(f"{what} is quantized per channel")
        return float(self.scale.reshape(())), int(self.zp.reshape(()))


def qparams(graph: Graph, call) -> QParams:
    scale, zp = graph.const(call.args[1]), graph.const(call.args[2])
    if scale is None or zp is None:
        raise NotInteger("scale or zero point is not a constant")
    return QParams(scale.astype(np.float32), zp.astype(np.int32), int(call.attrs.axis))


def dequantize_of(graph: Graph, expr):
    """The ``dequantize`` call ``expr`` comes from, looking through a reshape, or None."""
    reshape = graph.call(expr, "relax.reshape")
    return graph.call(reshape.args[0] if reshape is not None else expr, "relax.dequantize")


def dequantized_const(graph: Graph, expr, what: str):
    """(int constant, QParams) of ``dequantize(constant)``, looking through a reshape."""
    deq = dequantize_of(graph, expr)
    if deq is None:
        raise NotInteger(f"{what} is not a dequantized constant")
    value = graph.const(deq.args[0])
    if value is None:
        raise NotInteger(f"{what} is not a constant")
    return value, qparams(graph, deq)


def fused_activation(lo: float, hi: float, scale: float, zp: int, dtype: str):
    """TFLite's clamp for the activation the frontend's ``clip(lo, hi)`` stands for.

    The frontend rounds with Python's round (ties to even); TFLite rounds half away
    from zero in float32. Recognise the activation by the frontend's own numbers, then
    recompute the range TFLite's way, so a tie can never put the clamp one step off.
    """
    info = np.iinfo(dtype)

    def frontend(v):
        return float(round(v / scale) + zp)

    candidates = {
        ACT_NONE: (info.min, info.max),
        ACT_RELU: (max(info.min, frontend(0.0)), info.max),
        ACT_RELU6: (max(info.min, frontend(0.0)), min(info.max, frontend(6.0))),
        ACT_RELU_N1_TO_1: (max(info.min, frontend(-1.0)), min(info.max, frontend(1.0))),
    }
    for act, (clo, chi) in candidates.items():
        if (float(clo), float(chi)) == (float(lo), float(hi)):
            return activation_range(act, scale, zp, dtype)
    return max(int(info.min), int(np.ceil(lo))), min(int(info.max), int(np.floor(hi)))


def clip_range(clip, out_q, dtype: str) -> tuple[int, int]:
    """The clamp of a layer's fused activation (the frontend's clip after its quantize)."""
    if clip is None:
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    lo, hi = (float(v.value) for v in clip.args[1:3])
    return fused_activation(lo, hi, *out_q, dtype)


def rewrite_functions(mod, make_rewriter, report: list | None = None):
    """``mod`` with every Relax function rewritten by ``make_rewriter(mod, func)`` (a
    ``PyExprMutator`` that collects records in ``.report``), then the float ops the
    rewrites left unused removed."""
    from tvm import relax

    out = mod
    for gv, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        rw = make_rewriter(out, func)
        rw.builder_.update_func(gv, rw.visit_expr(func))
        out = rw.builder_.get()
        if report is not None:
            report.extend(rw.report)
    return relax.transform.DeadCodeElimination()(out)
