"""The records a pass reports per quantized layer: ``Lowered`` (the kernel that runs it)
or ``Fallback`` (why it stays float). ``build.inspect``, the CLI and the compile report
print their ``line()``."""

from __future__ import annotations

import dataclasses

from .frontend.converters import layer_of


@dataclasses.dataclass(frozen=True)
class Lowered:
    """A layer the pass made integer: which kernel runs it."""

    op: str          # the layer's op: "conv2d", "dense", "add", "logistic", "concat", ...
    name: str        # the Relax variable of the layer's output
    in_shape: tuple
    out_shape: tuple
    kernel: str      # the kernel's name in the naming grammar (intrinsics/names.py)
    tuned: bool = False
    tail: str | None = None  # the kernel of the GEMM's last M % mr rows (gemm_plan.tail_kernel)
    variants: tuple = ()  # a portable build's kernel per level, lowest first (portable.py)

    def line(self) -> str:
        tag = " (tuned)" if self.tuned else ""
        tail = f" + {self.tail} for the last rows" if self.tail else ""
        kernel = (" | ".join(self.variants) + " (chosen at run time)" if self.variants
                  else self.kernel)
        return (f"{self.op:17s} {str(self.in_shape):20s} -> {str(self.out_shape):20s} "
                f"{kernel}{tail}{tag}")


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A quantized layer the pass left in float (QDQ), and why."""

    op: str
    name: str
    reason: str

    def line(self) -> str:
        where = self.name
        tflite_op = layer_of(self.name)
        # the TFLite operator the layer came from (frontend/converters.py)
        if tflite_op is not None:
            where = f"{tflite_op[1]} (TFLite operator {tflite_op[0]})"
        return f"{self.op:17s} {where:41s} stays float: {self.reason}"


# A dynamic-range model's float outputs against TFLite's: within this share of the
# output's largest magnitude. Its hybrid layers compute TFLite's floats to the bit; its
# float layers (softmax, LayerNorm, GELU, float BATCH_MATMUL, ...) are TVM's float code,
# which rounds differently (a few ulps per op, measured with ``diff``), and a hybrid layer
# can turn an ulp of its input into a step of its quantization grid (1/127 of a row's
# range, times one weight): on the zoo's dynamic-range nets the measured difference is
# below 1e-6 of the outputs' magnitude, far inside this bound.
FLOAT_RELATIVE_TOLERANCE = 1e-4


def dynamic_range(report: list) -> bool:
    """Whether a compile report has a hybrid (dynamic-range) layer."""
    return any(isinstance(r, Lowered) and r.op.endswith("_hybrid") for r in report)
