"""How ``import tvm_armq`` changes what ``tvm.compile`` makes of a quantized model.

TVM 0.27 compiles a Relax module for a CPU target with the pipeline registered as
"default" in ``tvm.relax.pipeline`` (``tvm.compile`` looks it up by that name on every
call). ``install()`` wraps that entry: for an aarch64 LLVM target the wrapped pipeline
first runs ``passes.integer.quantized_to_integer`` (QDQ conv2d / depthwise / dense become
tvm_armq kernel calls, the weights re-laid as constants), puts the float32 exp / tanh
ops left (a dynamic-range model's) on vectorizable code (``passes.float_math``), makes the
kernel calls one
function (``passes.call_sequence``) and then runs TVM's own pipeline, unchanged. For any
other target it is TVM's pipeline and nothing else, so x86, CUDA or a C-source build
compile exactly as they would without tvm_armq.

``install()`` also extends TVM's TFLite frontend (``frontend/converters.py``): quantized
ops that only move int8 bytes (PAD, SHAPE, STRIDED_SLICE, ...) import, a RESHAPE to a
computed shape folds to its static one, and each operator's result is named after it.

This is the Relax-era place of what the Relay design did with a conv2d strategy and an
alter-op-layout hook: dispatch and the compile-time weight transform both happen in the
pass, before legalization, where the quantization parameters are still visible.
"""

from __future__ import annotations

_MARK = "_tvm_armq_wrapped"


def applies_to(target) -> bool:
    """True for the targets tvm_armq compiles: LLVM for aarch64."""
    if target is None or target.kind.name != "llvm":
        return False
    return bool(getattr(target.features, "is_aarch64", False))


def stock_pipeline():
    """TVM's own "default" Relax pipeline (what ``tvm.compile`` runs without tvm_armq)."""
    from tvm.relax import pipeline

    entry = pipeline.PIPELINE_MAP["default"]
    return getattr(entry, _MARK, entry)()


def install() -> None:
    """Put the QDQ-to-integer pass in front of ``tvm.compile``'s default pipeline, the
    INDIRECT form's lowering in front of TVM's TIR pipelines (``intrinsics.indirect``),
    the flat views' rewrite (``passes.views``) and the kernels' CPU scopes
    (``passes.call_sequence``) at their end, and extend TVM's TFLite frontend (all
    idempotent)."""
    import tvm
    from tvm.relax import pipeline

    from .frontend import converters
    from .intrinsics import indirect
    from .passes import call_sequence, views
    from .targets import portable_levels

    converters.extend()
    indirect.install()
    views.install()
    call_sequence.install()
    original = pipeline.PIPELINE_MAP["default"]
    if hasattr(original, _MARK):
        return

    def default_with_tvm_armq(**kwargs):
        base = original(**kwargs)

        @tvm.transform.module_pass(opt_level=0, name="tvm_armq.default_pipeline")
        def run(mod, _ctx):
            target = tvm.target.Target.current(allow_none=True)
            if applies_to(target) and portable_levels(target) is not None:
                raise ValueError(
                    "a portable target links a kernel per ISA level into the library after "
                    "the build, which tvm.compile does not do: compile the model with "
                    "tvm_armq.compile_tflite(model, 'portable')")
            if applies_to(target):
                from .passes import call_sequence
                from .passes.float_math import vectorized_float_math
                from .passes.integer import quantized_to_integer

                mod = vectorized_float_math()(quantized_to_integer(target)(mod))
                mod = call_sequence.as_one_function(mod, target, serial_twins=True)
                return call_sequence.keep_internal()(base(mod))
            return base(mod)

        return run

    setattr(default_with_tvm_armq, _MARK, original)
    pipeline.PIPELINE_MAP["default"] = default_with_tvm_armq
