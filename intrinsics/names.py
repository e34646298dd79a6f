"""The naming grammar: one string names a kernel everywhere — its module constant, its
record, its registered TensorIntrin, the compile report and the logs.

    <op>_<types>[_<shape>]_<isa>[_<variant>]

    op       what it computes: gemm, depthwise, add, multiply, lut, requantize, concat, ...
    types    the element types, short (s8 int8, u8 uint8, s32 int32, u32 uint32, bf16
             bfloat16, f32 float32): a GEMM's or depthwise's A, B and accumulator
             (s8s8s32); an elementwise kernel's one type (s8)
    shape    the block, numbers joined by x: a GEMM micro-kernel's mr x nr x kr (4x4x16),
             a depthwise kernel's kh x kw (3x3); elementwise kernels have none
    isa      the target feature the code needs: ref (none: scalar loops), neon, dotprod,
             i8mm, bf16 (the feature of the instruction, not an ISA level)
    variant  what tells two kernels of one op, types, shape and isa apart (depthwise
             ``pairs16``: int8 products summed in pairs in int16 before widening)

A GEMM family (``kernels.Family``) is named as its kernels without the shape
(``gemm_s8s8s32_neon``). The TensorIntrin of a GEMM kernel's K-loop or direct form is the
kernel's name and the form's parameters after a double underscore (``forms.k_loop_name``,
``forms.direct_name``).
"""

from __future__ import annotations

import re

SHORT_DTYPE = {"int8": "s8", "uint8": "u8", "int32": "s32", "uint32": "u32",
               "bfloat16": "bf16", "float32": "f32"}
ISAS = ("ref", "neon", "dotprod", "i8mm", "bf16")
NAME_RE = re.compile(r"^(?P<op>[a-z][a-z0-9]*(?:_[a-z][a-z0-9]*)*?)"
                     r"_(?P<types>(?:s8|u8|s32|u32|bf16|f32)+)"
                     r"(?:_(?P<shape>\d+(?:x\d+)+))?"
                     r"_(?P<isa>ref|neon|dotprod|i8mm|bf16)"
                     r"(?:_(?P<variant>[a-z0-9]+))?$")


def kernel_name(op: str, dtypes, isa: str, shape=(), variant: str | None = None) -> str:
    """The name of a kernel: ``op`` over element types ``dtypes`` (TVM dtype strings) with
    block ``shape`` (numbers; none for elementwise) for ``isa``, and its ``variant``."""
    if isa not in ISAS:
        raise ValueError(f"unknown isa suffix {isa!r}: expected one of {', '.join(ISAS)}")
    parts = [op, "".join(SHORT_DTYPE[str(d)] for d in dtypes)]
    if shape:
        parts.append("x".join(str(int(n)) for n in shape))
    parts.append(isa)
    if variant:
        parts.append(variant)
    name = "_".join(parts)
    if not NAME_RE.match(name):
        raise ValueError(f"{name!r} breaks the naming grammar")
    return name


def elementwise_name(op: str, dtype: str = "int8", variant: str | None = None) -> str:
    """The name of an elementwise (or data movement) kernel: NEON code, vectorized by LLVM,
    on every level (``add_s8_neon``)."""
    return kernel_name(op, (dtype,), "neon", variant=variant)
