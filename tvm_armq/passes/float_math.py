"""The float32 ops left once the integer pass has run, on ``schedules.float_math``'s vector
kernels instead of TVM's code (which calls the C library per element for ``exp`` and
``tanh`` and leaves products and reductions as plain loops).

A dynamic-range model's float layers between its hybrid layers are these (a transformer's
GELU, SOFTMAX, LayerNorm and attention products; a CNN's float stem, residual ADDs and
pool); a full-integer model has none left (its quantized ops are integer kernels or
tables). Each float32 call of a kind the module knows becomes a ``call_tir`` of a scheduled
kernel, opaque to TVM's FuseOps:

- EXP, TANH, LOGISTIC, GELU's tanh form, SOFTMAX, MEAN (last axis, or H and W);
- matmul and NHWC conv2d (``Tile``), whose epilogue takes the bias, constant scale, ReLU or
  clip that follows when nothing else reads the product;
- a tree of elementwise ops (``float_math.TREE_OPS``) whose inner results nothing else
  reads, as one kernel.

A call an epilogue or a tree takes over is left uncalled, and ``DeadCodeElimination``
removes it and its kernel. Other dtypes and dynamic shapes are left as they are.
"""

from __future__ import annotations

import dataclasses

from ..intrinsics import names
from ..schedules import float_math
from .graph import is_const

FLOAT = float_math.FLOAT
_OPS = {"relax.exp": "exp", "relax.tanh": "tanh", "relax.sigmoid": "sigmoid",
        "relax.nn.gelu_tanh": "gelu_tanh", "relax.nn.softmax": float_math.SOFTMAX,
        "relax.mean": float_math.MEAN}
OPAQUE = 8  # relax's OpPatternKind kOpaque: FuseOps leaves a scheduled kernel whole


_EPILOGUE_CALLS = ("relax.add", "relax.multiply", "relax.nn.relu", "relax.clip")
_TREE_CALLS = {"relax.add": "add", "relax.subtract": "subtract", "relax.multiply": "multiply",
               "relax.divide": "divide", "relax.maximum": "maximum",
               "relax.minimum": "minimum", "relax.negative": "negative",
               "relax.sqrt": "sqrt", "relax.rsqrt": "rsqrt", "relax.nn.relu": "relu",
               "relax.clip": "clip", "relax.power": "power"}


class _NotATree(Exception):
    """An operand of a tree that is no static float32 tensor."""


def _tree_size(tree) -> int:
    """The number of ops in ``tree``."""
    if tree[0] in ("input", "const"):
        return 0
    return 1 + sum(_tree_size(t) for t in tree[1:] if isinstance(t, tuple))


@dataclasses.dataclass(frozen=True)
class Tile:
    """A tiled kernel's call, read from the model: ``op`` ("matmul" | "conv2d"), its
    operands, the shapes (and window) its ``*_func`` takes, and its epilogue so far."""

    op: str
    args: list
    shapes: tuple
    out_shape: list
    epilogue: tuple = ()

    def extended(self, step):
        return dataclasses.replace(self, epilogue=self.epilogue + (step,))


def _static_shapes(*exprs):
    """The static shapes of float32 ``exprs``, or None if one is not such a tensor."""
    from tvm import relax

    shapes = []
    for x in exprs:
        ty = x.ty
        if not isinstance(getattr(ty, "shape", None), relax.ShapeExpr) or \
                str(getattr(ty, "dtype", "")) != FLOAT:
            return None
        shapes.append([int(d) for d in ty.shape])
    return shapes


def _dataflow(func):
    """(each variable's bound call, each variable's number of uses) in ``func``."""
    from tvm import relax

    producer, users = {}, {}

    def visit(expr):
        if isinstance(expr, (relax.Call, relax.Tuple)):  # (call_tir's are a Tuple)
            for arg in expr.args if isinstance(expr, relax.Call) else expr.fields:
                if isinstance(arg, relax.Var):
                    users[arg] = users.get(arg, 0) + 1

    relax.analysis.post_order_visit(func, visit)
    for block in func.body.blocks:
        for binding in block.bindings:
            producer[binding.var] = binding.value
            if isinstance(binding.value, relax.Var):  # y = x: a use of x
                users[binding.value] = users.get(binding.value, 0) + 1
    if isinstance(func.body.body, relax.Var):  # the function's result is a use too
        users[func.body.body] = users.get(func.body.body, 0) + 1
    return producer, users


def _tile_name(op: str) -> str:
    """A register-tiled float kernel's name: ``matmul_f32f32f32_4x16x1_neon`` (A, B and
    the sums float32; MATMUL_ROWS x MATMUL_COLUMNS outputs, one k at a time)."""
    return names.kernel_name(op, (FLOAT,) * 3, "neon",
                             shape=(float_math.MATMUL_ROWS, float_math.MATMUL_COLUMNS, 1))


def vectorized_float_math():
    """The Relax module pass."""
    import tvm
    from tvm import relax
    from tvm.relax import expr_functor

    @expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_call_(self, original):
            call = super().visit_call_(original)
            op = getattr(call.op, "name", None)
            ty = original.ty
            if op in _EPILOGUE_CALLS and str(getattr(ty, "dtype", "")) == FLOAT:
                folded = self._epilogue_op(original, call)
                if folded is not None:
                    return folded
            if op in _TREE_CALLS:
                return self._tree(original, call)
            if op == "relax.matmul":
                return self._matmul(original, call)
            if op == "relax.nn.conv2d":
                return self._conv2d(original, call)
            name = _OPS.get(op)
            if name is None or str(getattr(ty, "dtype", "")) != FLOAT or \
                    not isinstance(getattr(ty, "shape", None), relax.ShapeExpr):
                return call
            shape = [int(d) for d in ty.shape]
            axis = int(call.attrs.axis) if name == float_math.SOFTMAX else None
            if name == float_math.MEAN:
                shapes = _static_shapes(original.args[0])
                if shapes is None:
                    return call
                shape = shapes[0]
                axes = sorted(int(a) % len(shape) for a in (call.attrs.axis or []))
                if len(shape) == 4 and axes == [1, 2]:  # a global average pool
                    func = float_math.spatial_mean_func(shape, bool(call.attrs.keepdims))
                    gvar = self._add_kernel(func, "spatial_mean", names.elementwise_name(
                        "spatial_mean", FLOAT))
                    return relax.op.call_tir(gvar, [call.args[0]], relax.TensorType(
                        [int(d) for d in ty.shape], FLOAT))
                if not call.attrs.keepdims or axes != [len(shape) - 1]:  # LayerNorm's
                    return call
            gvar = self._add_kernel(float_math.func(name, shape, axis), name,
                                    names.elementwise_name(name, FLOAT))
            out_shape = [int(d) for d in ty.shape]
            return relax.op.call_tir(gvar, [call.args[0]], relax.TensorType(out_shape, FLOAT))

        def _tree(self, original, call):
            """A float op of ``float_math.TREE_OPS`` and the ones it reads whose results
            nothing else reads, as one kernel (``float_math.tree_func``): a LayerNorm's
            steps between its means, an ADD and the ReLU after it. A lone op is left to
            TVM."""
            shapes = _static_shapes(original)
            if shapes is None:
                return call
            leaves = {}  # original expression -> (its input index, its shape)
            try:
                tree = self._tree_of(original, leaves, root=True)
            except _NotATree:
                return call
            size = 0 if tree is None else _tree_size(tree)
            if size < 2:
                return call
            inputs = sorted(leaves.items(), key=lambda item: item[1][0])
            func = float_math.tree_func(tree, [shape for _, (_, shape) in inputs], shapes[0])
            gvar = self._add_kernel(func, "elementwise", names.elementwise_name(
                "elementwise", FLOAT, variant=f"ops{size}"))
            args = [self.visit_expr(expr) for expr, _ in inputs]
            return relax.op.call_tir(gvar, args, original.ty)

        def _tree_of(self, expr, leaves, root=False):
            """The tree of ``expr`` (``float_math.TREE_OPS``' form), its operands that are
            not folded in recorded in ``leaves``; None if ``expr`` (the root) is no op of
            the trees."""
            call = expr if root else self.producer.get(expr)
            fused = root or (isinstance(expr, relax.Var) and self.users.get(expr, 0) == 1)
            kind = _TREE_CALLS.get(getattr(getattr(call, "op", None), "name", None))
            if fused and kind is not None and _static_shapes(call) is not None:
                if kind == "power":  # x ** 2 only
                    exponent = call.args[1]
                    if not (is_const(exponent) and exponent.value.numpy().size == 1
                            and float(exponent.value.numpy().reshape(-1)[0]) == 2.0):
                        return self._leaf(expr, leaves) if not root else None
                    return ("square", self._tree_of(call.args[0], leaves))
                if kind == "clip":
                    lo, hi = (float(v.value) for v in call.args[1:3])
                    return ("clip", self._tree_of(call.args[0], leaves), lo, hi)
                return (kind, *[self._tree_of(a, leaves) for a in call.args])
            return None if root else self._leaf(expr, leaves)

        def _leaf(self, expr, leaves):
            if is_const(expr) and expr.value.numpy().size == 1:
                return ("const", float(expr.value.numpy().reshape(-1)[0]))
            shapes = _static_shapes(expr)
            if shapes is None:
                raise _NotATree
            if expr not in leaves:
                leaves[expr] = (len(leaves), shapes[0])
            return ("input", leaves[expr][0])

        def _add_kernel(self, func, op: str, kernel: str):
            """``func`` in the module as ``tvm_armq_float_<op>``, named ``kernel`` (the
            naming grammar's) for the per-layer tables, and opaque to FuseOps."""
            func = func.without_attr("global_symbol").with_attrs({
                "op_pattern": OPAQUE, "tvm_armq.kernel": kernel, "tvm_armq.layer_op": op})
            return self.builder_.add_func(func, f"tvm_armq_float_{op}")

        def _matmul(self, original, call):
            """A float32 matmul of two operands with the same leading dimensions (attention's
            products, a FULLY_CONNECTED left float) on ``float_math.matmul_func``."""
            a, b = original.args
            shapes = _static_shapes(a, b, original)
            if shapes is None:
                return call
            a_shape, b_shape, out_shape = shapes
            if len(a_shape) < 2 or len(a_shape) != len(b_shape) or \
                    a_shape[:-2] != b_shape[:-2] or a_shape[-1] != b_shape[-2]:
                return call
            return self._tile(original, Tile("matmul", list(call.args), (a_shape, b_shape),
                                             out_shape))

        def _conv2d(self, original, call):
            """A float32 NHWC / HWIO conv2d of one group (a CONV_2D the converter left
            float: a small one, or a model's stem) on ``float_math.conv2d_func``."""
            a = original.attrs
            shapes = _static_shapes(*original.args, original)
            if shapes is None or (a.data_layout, a.kernel_layout, a.out_layout) != (
                    "NHWC", "HWIO", "NHWC") or int(a.groups) != 1:
                return call
            data_shape, weight_shape, out_shape = shapes
            window = ([int(v) for v in a.strides], [int(v) for v in a.padding],
                      [int(v) for v in a.dilation])
            return self._tile(original, Tile("conv2d", list(call.args),
                                             (data_shape, weight_shape, *window), out_shape))

        def _epilogue_op(self, original, call):
            """``call`` folded into the tiled kernel that makes its operand, when that
            kernel's output is read by nothing else and ``call`` is an epilogue op
            (``float_math.EPILOGUE_OPS``: a bias, a constant scale, ReLU, a clip)."""
            op = call.op.name
            x = original.args[0]
            if op in ("relax.add", "relax.multiply") and is_const(x):
                x = original.args[1]  # the constant first: c + x, c * x
            tile = self.tiles.get(self.producer.get(x))
            if tile is None or self.users.get(x, 0) != 1:
                return None
            if op == "relax.nn.relu":
                step = ("relu", None)
            elif op == "relax.clip":
                lo, hi = (float(v.value) for v in original.args[1:3])
                step = ("clip", (lo, hi))
            else:
                c = next((v for v in original.args if is_const(v)), None)
                values = None if c is None else c.value.numpy()
                channels = tile.out_shape[-1]
                if values is None or str(values.dtype) != FLOAT or \
                        values.size not in (1, channels) or \
                        (values.size == channels and values.shape[-1] != channels):
                    return None
                step = (op.split(".")[-1], values.reshape(-1))
            return self._tile(original, tile.extended(step))

        def _tile(self, original, tile):
            """The call of ``tile``'s kernel (built for it) for ``original``."""
            if tile.op == "matmul":
                func = float_math.matmul_func(*tile.shapes, epilogue=tile.epilogue)
            else:
                func = float_math.conv2d_func(*tile.shapes, epilogue=tile.epilogue)
            gvar = self._add_kernel(func, tile.op, _tile_name(tile.op))
            self.tiles[original] = tile
            consts = [relax.const(c) for c in float_math.epilogue_constants(tile.epilogue)]
            return relax.op.call_tir(gvar, tile.args + consts,
                                     relax.TensorType(tile.out_shape, FLOAT))

    @tvm.transform.module_pass(opt_level=0, name="tvm_armq.vectorized_float_math")
    def run(mod, _ctx):
        rewrite = _Rewrite(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewrite.tiles, (rewrite.producer, rewrite.users) = {}, _dataflow(func)
                rewrite.builder_.update_func(gvar, rewrite.visit_expr(func))
        # a kernel whose output an epilogue op took over is no longer called
        return relax.transform.DeadCodeElimination()(rewrite.builder_.get())

    return run
