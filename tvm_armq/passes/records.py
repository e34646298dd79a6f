"""The records the integer pass (``passes/integer.py``) and its op families share: where a
layer ends (``Root``), what a family returns (``KernelCall``, ``ConcatCall``), one op
family (``OpFamily``), and how kernels are built (``Options``).

An op family is a module of ``passes/`` with one ``FAMILY`` record: the Relax ops a layer
of the family ends in (``roots``), a ``match`` that recognizes the family's float chain
under that root without raising (returns what it found, or None), and a ``lower`` that
reads the layer's integers out of the chain and builds its kernel call (raising
``graph.NotInteger`` with the reason when TFLite's arithmetic cannot be reproduced: the
layer then stays float, and the pass reports why).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..report import Lowered


@dataclasses.dataclass(frozen=True)
class Root:
    """A quantized layer's end as the pass meets it. ``call``: the Relax call visited;
    ``kind``: the op the families' ``roots`` name (``relax.quantize`` for a quantize with
    or without the fused ``clip`` after it; ``relax.image.resize2d`` or ``relax.astype``
    for the two int8 ops the frontend leaves unquantized); ``quantize`` / ``clip``: the
    layer's (None where it has none); ``core``: the call under the quantize and its float
    activation (None if that is not an op's call); ``label``: the Relax variable of the
    layer's output (``op12_conv_2d``)."""

    call: object
    kind: str
    label: str
    quantize: object = None
    clip: object = None
    core: object = None

    @property
    def op(self) -> str:
        """The core op's short name (``conv2d``, ``add``, ``softmax``), else the root's."""
        call = self.core if self.core is not None else self.call
        return call.op.name.replace("relax.", "").replace("nn.", "")


@dataclasses.dataclass(frozen=True)
class OpFamily:
    """One family of quantized ops the pass makes integer (see the module docstring).
    ``report_op(root, match)`` names the layer's op in a ``Fallback`` record. A family
    whose kernel runs a whole chain of layers names, with ``absorbs(graph, match)``, the
    variables of the chain's inner layers that nothing else reads: the pass leaves those
    to be removed with the float chain instead of lowering them one by one."""

    name: str
    roots: tuple
    match: Callable
    lower: Callable
    report_op: Callable = lambda root, match: root.op
    absorbs: Callable = lambda graph, match: ()


@dataclasses.dataclass
class KernelCall:
    """One ``call_tir`` for the pass to emit."""

    func: object
    name: str
    inputs: list            # in order: graph variables, or (variable, shape the func takes),
                            # or (KernelCall, shape its output takes) whose output it is
    consts: list            # NumPy arrays after the inputs
    out_shape: tuple
    record: Lowered
    out_dtype: str = "int8"
    after: list = dataclasses.field(default_factory=list)  # _KernelCalls after the consts


@dataclasses.dataclass
class ConcatCall:
    """A concatenation: each input as it is (``func`` None) or requantized, then a copy."""

    parts: list             # _KernelCalls, one per input
    axis: int
    record: Lowered


@dataclasses.dataclass(frozen=True)
class Options:
    """How the pass builds kernels: for ``target``; a GEMM layer's func scheduled by
    ``tuned_schedule(func, plan)`` where that gives one (a tuned schedule), else as its
    plan says; ``schedule`` False leaves every kernel unscheduled (``quantized_to_integer``)."""

    target: object
    tuned_schedule: object = None
    schedule: bool = True
    variants: object = None  # portable.Variants of a portable build: per-level GEMMs
