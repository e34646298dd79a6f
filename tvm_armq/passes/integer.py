"""QDQ to integer: the Relax pass that makes quantized TFLite layers run tvm_armq kernels.

Read this first. TVM 0.27's TFLite frontend imports every quantized layer as float
compute between a ``dequantize`` and a ``quantize``; a CONV_2D with a fused ReLU6 is

    x_f  = dequantize(x, s_in, zp_in)                    x: int8 activations
    w_f  = dequantize(W, s_w[c], 0, axis=3)              W: int8 constant (HWIO)
    b_f  = dequantize(B, s_in * s_w[c], 0)               B: int32 constant
    y    = quantize(conv2d(x_f, w_f) + b_f, s_out, zp_out)
    out  = clip(y, lo, hi)                               the fused activation

The pass (``quantized_to_integer``; TVM names it ``tvm_armq.QuantizedToInteger``) finds that
chain, reads the int8/int32 constants and the scales back out of it, and replaces it with
one ``call_tir`` of a tvm_armq kernel:

    out  = call_tir(conv2d_gemm, [x, W_packed, bias_folded, multiplier, shift])

whose operands are compile-time constants re-laid for the micro-kernel
(``schedules.gemm_layout.pack_weights``: the alter-op step, run here once, in NumPy).
The requantization parameters are computed exactly as TFLite's Prepare computes them
(multiplier of in_scale * w_scale[c] / out_scale in double), and the clamp of the fused
activation as TFLite's ``CalculateActivationRangeQuantized`` does, so the integer result
is TFLite's to the bit. The float ops the chain leaves unused are removed afterwards.

What becomes integer (each a ``Lowered`` record in the pass's report): the op families,
one module of ``passes/`` each, tried in the order of ``families.FAMILIES``; the first
whose matcher recognizes the chain under a ``quantize`` (or, for the average pool and the
nearest resize, the frontend's own int8 form) lowers it:

    family          the frontend's chain                        the kernel
    batch_matmul    matmul of two dequantized int8 tensors      the level's GEMM, both
                    (BATCH_MATMUL; adj_x / adj_y a permute)     operands packed at run time
    gemm            conv2d (groups = 1 or in_c / groups > 1),   the level's GEMM (conv2d_gemm)
                    matmul with a constant weight (FC, on
                    [..., K] inputs too)
                    conv2d with groups = in_c (depthwise)       depthwise (NEON MACs / sdot)
    transpose_conv  conv2d_transpose between two permute_dims   a GEMM per output phase +
                                                                a pixel shuffle
    tables          sigmoid, tanh, exp, rsqrt, gelu, leakyrelu, lut: a 256-entry table of
                    relu, x * relu6(x + 3) / 6, negative (a     TFLite's arithmetic
                    float island) of one input
    elementwise     add, subtract, multiply (SQUARED_DIFFERENCE int8_ops: TFLite's 8-bit
                    as d * d), maximum, minimum, where (PRELU)  rescalings; a table of x
                                                                where both operands are
                                                                functions of one x (swish)
    reduce          mean, softmax                               int8_ops MEAN / softmax
    layer_norm      the converter's 13-op LayerNorm chain,      layer_norm: one row kernel
                    recognized at its last ADD
    requantize      dequantize (QUANTIZE of an int8 tensor)     int8_ops requantize
    concat          concat (of tensors and constants)           a copy per input (inputs
                                                                of another scale requantized)
    resize          resize2d: bilinear of a dequantized int8    resize: TFLite's 10-bit
                    tensor; nearest of the int8 tensor itself   interpolation / positions
    avg_pool        astype(avg_pool2d(astype(x, int32)))        int8_ops: TFLite's rounded
                                                                average

conv2d and dense also take TFLite's legacy uint8 scheme (uint8 weights with a zero point):
the u8 GEMM kernel of the target, plus a row-sums kernel for the weight zero point's term
(``schedules.conv2d_u8``).

The fused activation is either a ``clip`` after the quantize (conv, dense) or a float
``relu`` / ``clip(0, 6)`` before it (ADD, MUL); both become the clamp TFLite computes.
PAD, MAX_POOL_2D and reshapes are already integer in the frontend's output. Anything else
is left as the frontend made it (float between dequantize and quantize), still correct,
and the report says why (``Fallback`` records). ``hooks.py`` puts this pass in front of
``tvm.compile``'s default pipeline for aarch64 targets.
"""

from __future__ import annotations

import numpy as np

from ..report import Fallback
from .families import FAMILIES
from .graph import Graph, NotInteger, dtype_of, op_type, rewrite_functions, shape_of
from .operands import act_before
from .records import ConcatCall, KernelCall, Options, Root


def _op_names(value) -> tuple[str, ...]:
    """The op name of a Call to an op (for ``Graph.call``), else nothing."""
    op = getattr(value, "op", None)
    return (op.name,) if isinstance(op, op_type()) else ()


def _lowering_rewriter():
    from tvm import relax

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        """Replaces each layer an op family lowers by its integer kernel call."""

        def __init__(self, mod, func, opts: Options):
            super().__init__(mod)
            self.opts = opts
            self.graph = Graph(func)
            self.report: list = []
            self.var_of = self.graph.var_of
            # kernel outputs already emitted, by (KernelCall id, shape): the call is kept
            # with its variable, so its id is not reused while the entry lives
            self.emitted: dict = {}
            # quantize results whose only use is a clip: the clip is the layer's end
            self.fused = set()
            for value in self.graph.defs.values():  # a value may be a variable (an alias)
                clip = self.graph.call(value, "relax.clip")
                q = self.graph.call(clip.args[0], "relax.quantize") if clip is not None else None
                if q is not None and self.graph.uses.get(clip.args[0], 0) == 1:
                    self.fused.add(clip.args[0])
            # every layer end's match, made once here: (root, (family, found) or None) by
            # variable; and the inner layers of a chain one family's kernel runs whole (a
            # LayerNorm), which the chain's end absorbs
            self.matches, self.absorbed = {}, set()
            for var, value in self.graph.defs.items():
                root = self._root(value, var.name) if isinstance(value, relax.Call) else None
                if root is None:
                    continue
                self.matches[var] = root, self._match(root)
                if self.matches[var][1] is not None:
                    family, found = self.matches[var][1]
                    self.absorbed.update(family.absorbs(self.graph, found))

        def _match(self, root: Root):
            """(family, what it found) of the first family in FAMILIES that takes the
            layer ending at ``root``, or None."""
            for family in FAMILIES:
                if root.kind in family.roots:
                    found = family.match(self.graph, root)
                    if found is not None:
                        return family, found
            return None

        def _root(self, call, label: str) -> Root | None:
            """Where a layer ends, if ``call`` is such an end: a quantize (not one whose
            clip ends the layer), a clip of a quantize, or another op's call."""
            name = getattr(call.op, "name", "")
            quantize, clip = None, None
            if name == "relax.clip":
                q = self.graph.call(call.args[0], "relax.quantize")
                if q is None:  # a float clip: a hybrid layer's activation
                    return Root(call, name, label)
                if call.args[0] not in self.fused:
                    return None
                quantize, clip = q, call
            elif name == "relax.quantize":
                if self.var_of.get(call) in self.fused:
                    return None
                quantize = call
            if quantize is None:
                return Root(call, name, label)
            before, _ = act_before(self.graph, quantize.args[0])
            core = self.graph.call(before, *_op_names(self.graph.defs.get(before)))
            return Root(call, "relax.quantize", label, quantize, clip, core)

        def visit_call_(self, call):
            var = self.var_of.get(call)
            if var is not None and var in self.absorbed:  # removed with the float chain
                return super().visit_call_(call)
            if var is not None and var in self.matches:
                root, match = self.matches[var]
            else:  # a call bound to no variable
                root = self._root(call, var.name if var is not None else "?")
                match = self._match(root) if root is not None else None
            if match is not None:
                family, found = match
                lowered = self._try(root.label, family.report_op(root, found),
                                    lambda: family.lower(self.graph, root, found, self.opts))
                if lowered is not None:
                    return lowered
            elif root is not None and root.quantize is not None:
                # a quantized layer no family takes
                op = root.op if root.core is not None else "quantize"
                self.report.append(Fallback(op, root.label, "no integer kernel for this op"))
            return super().visit_call_(call)

        def _try(self, label, op, make):
            try:
                return self._emit(make())
            except NotInteger as e:
                self.report.append(Fallback(op, label, str(e)))
                return None

        def _call_tir(self, kc: KernelCall, out_shape=None):
            """Emit ``kc``; returns the output expression (not yet bound). ``out_shape``:
            the shape the call's output takes instead of ``kc.out_shape`` (the same
            elements, row-major). An input of another shape than the kernel's parameter,
            and such an output, are views inside the kernel (``tir_util.view_params``),
            not reshapes between calls."""
            from tvm_armq.schedules.tir_util import view_params

            args, views = [], {}
            for i, item in enumerate(kc.inputs):
                x, shape = item if isinstance(item, tuple) else (item, None)
                if isinstance(x, KernelCall):  # a kernel's output is this one's input
                    key = (id(x), shape)  # emitted once however many kernels read it
                    if key not in self.emitted:
                        self.emitted[key] = (x, self.builder_.emit(self._call_tir(x, shape)))
                    args.append(self.emitted[key][1])
                    continue
                shape = shape_of(x) if shape is None else shape
                args.append(self.visit_expr(x))
                if shape_of(x) != tuple(shape):
                    views[i] = shape_of(x)
            out_shape = tuple(kc.out_shape) if out_shape is None else tuple(out_shape)
            if out_shape != tuple(kc.out_shape):  # the output is the last parameter
                last = len(kc.func.params) - 1
                assert tuple(int(d) for d in kc.func.params[last].shape) == tuple(kc.out_shape)
                views[last] = out_shape
            # te.create_prim_func names every func "main"; the module names them instead
            func = view_params(kc.func, views).without_attr("global_symbol")
            # a GEMM names itself; a kernel of the layer's (row sums, a concatenation's
            # requantized part) has no record of its own
            if kc.record is not None and "tvm_armq.kernel" not in (func.attrs or {}):
                func = func.with_attrs({"tvm_armq.kernel": kc.record.kernel,
                                        "tvm_armq.layer_op": kc.record.op})
            gv = self.builder_.add_func(func, f"tvm_armq_{kc.name}")
            args += [relax.const(c) for c in kc.consts]
            args += [self.builder_.emit(self._call_tir(c)) for c in kc.after]
            return relax.op.call_tir(gv, args, relax.TensorType(out_shape, kc.out_dtype))

        def _emit(self, made):
            if isinstance(made, ConcatCall):
                from tvm_armq.schedules import int8_ops as ops

                parts = [self.builder_.emit(self._call_tir(p)) if p.func is not None
                         else relax.const(p.inputs[0]) if isinstance(p.inputs[0], np.ndarray)
                         else self.visit_expr(p.inputs[0]) for p in made.parts]
                self.report.append(made.record)
                dtype = dtype_of(parts[0])
                func = ops.concat_func([p.out_shape for p in made.parts], made.axis,
                                              dtype)
                gv = self.builder_.add_func(func.without_attr("global_symbol"),
                                            "tvm_armq_concat")
                return relax.op.call_tir(gv, parts,
                                         relax.TensorType(made.record.out_shape, dtype))
            out = self._call_tir(made, made.record.out_shape)
            self.report.append(made.record)
            return out

    return Rewriter

    return Rewriter


def quantized_to_integer(target, *, tuned_schedule=None, report: list | None = None,
                         schedule: bool = True, variants=None):
    """The pass: every matched quantized layer of every Relax function becomes a tvm_armq
    kernel for ``target``. ``report`` (if given) receives one ``Lowered`` or ``Fallback``
    record per quantized layer.

    A GEMM layer (conv2d / dense) is one unscheduled func and its plan
    (``schedules.gemm_plan``); ``tuned_schedule(func, plan)``, if given, returns a tuned
    schedule of it or None, and the plan's default schedule runs where it gives none (the
    tuner's ``tuning.database_schedule`` replays a database; its task extraction records
    the layers). ``schedule=False`` leaves the kernels unscheduled: for ``inspect`` and
    task extraction, never for a build. A portable target (``targets.portable``) builds
    every GEMM layer once per level into ``variants`` (a ``portable.Variants``, linked
    into the library after the build: ``build.compile_tflite`` does it) behind a
    dispatcher; without ``variants`` (``inspect``) its layers are planned for the
    baseline level.
    """
    import tvm

    opts = Options(target, tuned_schedule, schedule, variants)

    @tvm.transform.module_pass(opt_level=0, name="tvm_armq.QuantizedToInteger")
    def run(mod, _ctx):
        from .hybrid import report_unlowered

        rewriter_cls = _lowering_rewriter()
        out = rewrite_functions(mod, lambda m, f: rewriter_cls(m, f, opts), report)
        if report is not None:
            report_unlowered(out, report)
        return out

    return run
