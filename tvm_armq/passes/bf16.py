"""fp32 to bf16: the Relax pass that runs float conv2d / dense layers on ``bfmmla``.

The opt-in ``precision="bf16"`` of ``compile_tflite``. Read ``integer.py`` first: this
is its float counterpart, with the same records and the same way of replacing a chain of
Relax ops by one ``call_tir`` of a tvm_armq kernel whose weights are compile-time
constants. TVM 0.27's TFLite frontend imports a float CONV_2D with a fused ReLU6 as

    y   = conv2d(x, W)              x: fp32 NHWC, W: fp32 constant (HWIO), groups >= 1
    y   = add(y, b)                 b: fp32 constant, one value per output channel
    out = clip(y, 0, 6)             the fused activation (relu: ``nn.relu``)

and a FULLY_CONNECTED as ``matmul(x, permute_dims(W))`` followed by the same add and
activation. ``float_to_bf16`` finds those chains and replaces each with

    out = call_tir(conv2d_bf16, [x, W_packed, b])    (schedules/conv2d_bf16.py)

W is rounded to bf16 and packed for the micro-kernel here, once, in NumPy
(``pack_weights_bf16``); x is rounded to bf16 by the compiled code on every inference;
the GEMM accumulates in fp32 (``bfmmla``), then adds the fp32 bias and clamps to the
activation's range in fp32. A layer without a bias gets a bias of zeros. The arithmetic
is modelled bit for bit by ``schedules.reference.conv2d_bf16_nhwc``.

What becomes bf16 (a ``Lowered`` record each, kernel ``gemm_bf16bf16f32_2x2x4_bf16``):

    conv2d NHWC / HWIO, groups = 1 or in_c / groups > 1   -> conv2d_bf16 (GEMM)
    matmul of fp32 rows by a constant fp32 [K, N] weight   -> conv2d_bf16 (a 1x1 conv)

Everything else stays fp32 as the frontend made it; float conv2d / matmul that stay are
reported with the reason (``Fallback``): depthwise conv2d (no bf16 depthwise kernel: a
depthwise layer has too little reduction per output for a matrix instruction), weights
that are not constants, other layouts. Targets without the BF16 extension (FEAT_BF16,
``+bf16``) cannot run ``bfmmla``: asking for the pass there is a ``MissingTargetFeature``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import targets
from ..report import Fallback, Lowered
from .graph import Graph, dtype_of, rewrite_functions, shape_of

FLOAT = "float32"
OP = "conv2d_bf16"
# The frontend's fused activations: relu, and clip(lo, hi) for relu6 and relu_n1_to_1.
_RELU = "relax.nn.relu"
_CLIP = "relax.clip"
_CORES = ("relax.nn.conv2d", "relax.matmul")


class NotBf16(Exception):
    """Raised by the matcher: this float layer stays fp32 (the message says why)."""


def bf16_kernel(target):
    """The bf16 micro-kernel record for ``target``: ``bfmmla``'s, or a
    ``MissingTargetFeature`` naming that kernel and the target when it lacks +bf16.

    ``kernels.select`` would fall back to the scalar reference kernel on such a target;
    precision="bf16" is an explicit request for the matrix instruction, so it is an
    error instead (a scalar bf16 GEMM would be slower than the fp32 code it replaces).
    """
    from tvm_armq.intrinsics import kernels

    return kernels.require(kernels.get(kernels.GEMM_BF16BF16F32_2X2X4_BF16), target)


# ------------------------------------------------------------------ matched layers
@dataclasses.dataclass
class _FloatLayer:
    """A float conv2d / dense chain, read back out of the graph."""

    op: str                 # "conv2d" | "dense"
    x: object               # the fp32 input variable
    shape: object           # schedules.gemm_layout.Conv2DShape (dense: the 1x1 case)
    weight: np.ndarray      # fp32 HWIO (dense: [1, 1, K, N])
    bias: np.ndarray        # fp32 [out_c]
    act_range: tuple | None  # (lo, hi) of the fused activation, either side None: open
    out_shape: tuple        # the chain's Relax output shape


def _conv_shape(x, weight: np.ndarray, attrs):
    from tvm_armq.schedules.gemm_layout import Conv2DShape

    b, h, w, c = shape_of(x)
    kh, kw, _, n = weight.shape
    return Conv2DShape(b, h, w, c, n, kh, kw,
                       strides=tuple(int(v) for v in attrs.strides),
                       dilation=tuple(int(v) for v in attrs.dilation),
                       padding=tuple(int(v) for v in attrs.padding),
                       groups=int(attrs.groups))


def _match_core(graph: Graph, core) -> tuple[str, object, object, np.ndarray]:
    """(op, input, Conv2DShape, fp32 HWIO weight) of a float conv2d / matmul call."""
    from tvm_armq.schedules.gemm_layout import Conv2DShape

    x = core.args[0]
    if dtype_of(x) != FLOAT or dtype_of(core) != FLOAT:
        raise NotBf16(f"dtype {dtype_of(x)} -> {dtype_of(core)} (float32 only)")
    weight = graph.const(core.args[1])
    if weight is None:
        raise NotBf16("the weight is not a constant")
    if weight.dtype != np.float32:
        raise NotBf16(f"weight dtype {weight.dtype} (float32 only)")
    if core.op.name == "relax.matmul":
        in_shape = shape_of(x)
        if weight.ndim != 2 or len(in_shape) < 1 or in_shape[-1] != weight.shape[0]:
            raise NotBf16(f"matmul {in_shape} x {weight.shape} is not [..., K] x [K, N]")
        rows = int(np.prod(in_shape[:-1], dtype=np.int64))
        return "dense", x, Conv2DShape.dense(rows, *weight.shape), weight[None, None]
    attrs = core.attrs
    if (str(attrs.data_layout), str(attrs.out_layout)) != ("NHWC", "NHWC"):
        raise NotBf16(f"layout {attrs.data_layout} -> {attrs.out_layout} (NHWC only)")
    in_c, groups = shape_of(x)[3], int(attrs.groups)
    if groups > 1 and groups == in_c:
        raise NotBf16("no bf16 depthwise kernel (kh * kw products per output: too "
                      "little reduction for bfmmla)")
    if str(attrs.kernel_layout) != "HWIO":
        raise NotBf16(f"kernel layout {attrs.kernel_layout} (HWIO only)")
    if weight.ndim != 4:
        raise NotBf16(f"weight of shape {weight.shape}")
    return "conv2d", x, _conv_shape(x, weight, attrs), weight


def _bias_of(graph: Graph, add, y, n_out: int, out_ndim: int) -> np.ndarray | None:
    """The per-channel fp32 bias of ``add(y, b)`` / ``add(b, y)``, or None if the other arm
    is not a constant that broadcasts along the channel axis only."""
    other = add.args[1] if add.args[0].same_as(y) else add.args[0]
    if other.same_as(y):
        return None
    b = graph.const(other)
    if b is None or b.dtype != np.float32 or b.ndim > out_ndim or b.ndim == 0:
        return None
    if b.shape[-1] != n_out or any(d != 1 for d in b.shape[:-1]):
        return None
    return b.reshape(-1)


def _activation(call) -> tuple | None:
    """(lo, hi) of a relu / clip call (an infinite side: None), or None for other calls."""
    name = call.op.name
    if name == _RELU:
        return (0.0, None)
    if name == _CLIP:
        lo, hi = (float(v.value) for v in call.args[1:3])
        if lo > hi:
            return None
        return (lo if np.isfinite(lo) else None, hi if np.isfinite(hi) else None)
    return None


class _Chains:
    """Every float conv2d / matmul of a function, matched: which binding ends each chain
    (the layer, to lower there) and which cores stay fp32 (the reason)."""

    def __init__(self, graph: Graph):
        from tvm import relax

        self.graph = graph
        self.users: dict = {}
        for var, value in graph.defs.items():
            if isinstance(value, relax.Call):
                for a in value.args:
                    if isinstance(a, relax.Var):
                        self.users.setdefault(a, []).append((var, value))
        self.layers: dict = {}      # the chain's last variable -> _FloatLayer
        self.fallbacks: dict = {}   # the core's variable -> (op, reason)
        for var, value in graph.defs.items():
            if graph.call(value, *_CORES) is None:
                continue
            op = "dense" if value.op.name == "relax.matmul" else "conv2d"
            if op == "conv2d" and int(value.attrs.groups) == shape_of(value.args[0])[3] > 1:
                op = "depthwise_conv2d"
            try:
                self._match(var, value)
            except NotBf16 as e:
                self.fallbacks[var] = (op, str(e))

    def _only_user(self, var):
        """The single (var, call) that reads ``var``, if exactly one binding does and the
        function does not return ``var`` itself."""
        users = self.users.get(var, [])
        if len(users) != 1 or self.graph.uses.get(var, 0) != 1:
            return None
        return users[0]

    def _match(self, var, core):
        op, x, shape, weight = _match_core(self.graph, core)
        out_ndim = len(shape_of(core))
        end, bias, act = var, None, None
        nxt = self._only_user(end)
        if nxt is not None and self.graph.call(nxt[1], "relax.add") is not None:
            bias = _bias_of(self.graph, nxt[1], end, shape.out_c, out_ndim)
            if bias is not None:
                end = nxt[0]
                nxt = self._only_user(end)
        if nxt is not None and self.graph.call(nxt[1], _RELU, _CLIP) is not None:
            act = _activation(nxt[1])
            if act is not None:
                end = nxt[0]
        if bias is None:
            bias = np.zeros(shape.out_c, np.float32)
        self.layers[end] = _FloatLayer(op, x, shape, weight, bias, act,
                                       shape_of(self.graph.defs[end]))


# ------------------------------------------------------------------ the kernel
def _bf16_call(layer: _FloatLayer, target, schedule: bool):
    """(PrimFunc, data shape, [B_packed, bias], kernel out shape, kernel name) of a layer."""
    from tvm_armq.schedules import conv2d_bf16 as cb
    from tvm_armq.schedules import gemm_plan

    kernel = bf16_kernel(target)
    s = layer.shape
    plan = gemm_plan.plan(s, kernel)
    func = cb.conv2d_bf16_func(plan, act_range=layer.act_range)
    func = func.with_attr({"tvm_armq.op": OP, "tvm_armq.kernel": kernel.name})
    if schedule:
        func = cb.schedule_conv2d_bf16(func, plan, target)
    consts = [cb.pack_weights_bf16(layer.weight, plan.main.tile, s.groups),
              layer.bias.astype(np.float32)]
    data_shape = (s.batch, s.in_h, s.in_w, s.in_c)
    return func, data_shape, consts, (s.gemm_m, s.groups, s.gemm_n), kernel.name


# ------------------------------------------------------------------ the pass
def _bf16_rewriter():
    from tvm import relax

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        """Replaces the last call of each matched chain by the bf16 kernel call; the calls
        before it become unused and ``DeadCodeElimination`` removes them."""

        def __init__(self, mod, func, target, schedule):
            super().__init__(mod)
            self.target, self.schedule = target, schedule
            self.chains = _Chains(Graph(func))
            self.var_of = self.chains.graph.var_of
            self.report: list = []

        def visit_call_(self, call):
            var = self.var_of.get(call)
            if var in self.chains.fallbacks:
                op, reason = self.chains.fallbacks[var]
                self.report.append(Fallback(op, var.name, reason))
            layer = self.chains.layers.get(var)
            if layer is None:
                return super().visit_call_(call)
            return self._lower(var.name, layer)

        def _lower(self, label, layer: _FloatLayer):
            func, data_shape, consts, out_shape, kname = _bf16_call(layer, self.target,
                                                                    self.schedule)
            x = self.visit_expr(layer.x)
            if shape_of(layer.x) != data_shape:  # dense: rows x K seen as an NHWC image
                x = self.builder_.emit(relax.op.reshape(x, data_shape))
            # te.create_prim_func names every func "main"; the module names them instead
            gv = self.builder_.add_func(func.without_attr("global_symbol"), f"tvm_armq_{OP}")
            out = relax.op.call_tir(gv, [x] + [relax.const(c) for c in consts],
                                    relax.TensorType(out_shape, FLOAT))
            if tuple(out_shape) != tuple(layer.out_shape):
                out = relax.op.reshape(self.builder_.emit(out), layer.out_shape)
            self.report.append(Lowered(layer.op, label, shape_of(layer.x), layer.out_shape,
                                       kname))
            return out

    return Rewriter


def float_to_bf16(target, report: list | None = None, *, schedule: bool = True):
    """The pass: every matched fp32 conv2d / dense of every Relax function becomes the bf16
    GEMM kernel for ``target`` (weights rounded to bf16 and packed now, activations rounded
    on the fly, fp32 accumulation, bias and activation fused). ``report`` (if given)
    receives one ``report.Lowered`` per lowered layer and one ``report.Fallback``
    per float conv2d / matmul left in fp32, in model order. ``schedule=False`` leaves the
    kernels unscheduled: for inspection, never for a build.

    Raises ``kernels.MissingTargetFeature`` (naming the bfmmla kernel and ``target``) at
    once when ``target`` lacks the BF16 extension.
    """
    import tvm

    target = targets.resolve(target)
    bf16_kernel(target)  # the error before any work, not from inside the pass machinery

    @tvm.transform.module_pass(opt_level=0, name="tvm_armq.FloatToBf16")
    def run(mod, _ctx):
        rewriter_cls = _bf16_rewriter()
        return rewrite_functions(mod, lambda m, f: rewriter_cls(m, f, target, schedule),
                                 report)

    return run
