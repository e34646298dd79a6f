"""The float32 transcendental ops of a model (EXP, TANH, LOGISTIC, GELU's tanh form,
SOFTMAX) on ``schedules.float_math``'s vectorizable exp and tanh instead of TVM's, which
call the C library one element at a time.

A dynamic-range model's float layers between its hybrid layers are these (a transformer's
GELU and attention's SOFTMAX); a full-integer model has none left once the integer pass has
run (its quantized SOFTMAX, LOGISTIC, TANH, GELU are integer kernels or tables). The pass
replaces each float32 call with the same op built from ``float_math``'s TE, which TVM's
pipeline then legalizes, fuses and builds like any other; other dtypes are left as they are.
"""

from __future__ import annotations

from ..intrinsics import names
from ..schedules import float_math

FLOAT = "float32"
_OPS = {"relax.exp": "exp", "relax.tanh": "tanh", "relax.sigmoid": "sigmoid",
        "relax.nn.gelu_tanh": "gelu_tanh", "relax.nn.softmax": float_math.SOFTMAX,
        "relax.mean": float_math.MEAN}
OPAQUE = 8  # relax's OpPatternKind kOpaque: FuseOps leaves a scheduled kernel whole


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
            name = _OPS.get(getattr(call.op, "name", None))
            ty = original.ty
            if getattr(call.op, "name", None) == "relax.matmul":
                return self._matmul(original, call)
            if getattr(call.op, "name", None) == "relax.nn.conv2d":
                return self._conv2d(original, call)
            if name is None or str(getattr(ty, "dtype", "")) != FLOAT or \
                    not isinstance(getattr(ty, "shape", None), relax.ShapeExpr):
                return call
            shape = [int(d) for d in ty.shape]
            axis = int(call.attrs.axis) if name == float_math.SOFTMAX else None
            if name == float_math.MEAN:  # over the last axis, kept: a LayerNorm's
                data_ty = original.args[0].ty
                shape = [int(d) for d in data_ty.shape] if isinstance(
                    getattr(data_ty, "shape", None), relax.ShapeExpr) else None
                axes = [int(a) for a in (call.attrs.axis or [])]
                if shape is None or not call.attrs.keepdims or \
                        [a % len(shape) for a in axes] != [len(shape) - 1]:
                    return call
            gvar = self._add_kernel(float_math.func(name, shape, axis), name,
                                    names.elementwise_name(name, FLOAT))
            out_shape = [int(d) for d in ty.shape]
            return relax.op.call_tir(gvar, [call.args[0]], relax.TensorType(out_shape, FLOAT))

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
            shapes = [getattr(x.ty, "shape", None) for x in (a, b, original)]
            if any(not isinstance(s, relax.ShapeExpr) for s in shapes) or any(
                    str(getattr(x.ty, "dtype", "")) != FLOAT for x in (a, b, original)):
                return call
            a_shape, b_shape, out_shape = ([int(d) for d in s] for s in shapes)
            if len(a_shape) < 2 or len(a_shape) != len(b_shape) or \
                    a_shape[:-2] != b_shape[:-2] or a_shape[-1] != b_shape[-2]:
                return call
            gvar = self._add_kernel(float_math.matmul_func(a_shape, b_shape), "matmul",
                                    _tile_name("matmul"))
            return relax.op.call_tir(gvar, list(call.args), relax.TensorType(out_shape, FLOAT))

        def _conv2d(self, original, call):
            """A float32 NHWC / HWIO conv2d of one group (a CONV_2D the converter left
            float: a small one, or a model's stem) on ``float_math.conv2d_func``."""
            a = original.attrs
            data, weight = original.args
            shapes = [getattr(x.ty, "shape", None) for x in (data, weight, original)]
            if any(not isinstance(s, relax.ShapeExpr) for s in shapes) or any(
                    str(getattr(x.ty, "dtype", "")) != FLOAT for x in (data, weight, original)) \
                    or (a.data_layout, a.kernel_layout, a.out_layout) != ("NHWC", "HWIO", "NHWC") \
                    or int(a.groups) != 1:
                return call
            data_shape, weight_shape, out_shape = ([int(d) for d in s] for s in shapes)
            func = float_math.conv2d_func(
                data_shape, weight_shape, [int(v) for v in a.strides],
                [int(v) for v in a.padding], [int(v) for v in a.dilation])
            gvar = self._add_kernel(func, "conv2d", _tile_name("conv2d"))
            return relax.op.call_tir(gvar, list(call.args), relax.TensorType(out_shape, FLOAT))

    @tvm.transform.module_pass(opt_level=0, name="tvm_armq.vectorized_float_math")
    def run(mod, _ctx):
        rewrite = _Rewrite(mod)
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewrite.builder_.update_func(gvar, rewrite.visit_expr(func))
        return rewrite.builder_.get()

    return run
