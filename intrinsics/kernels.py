"""The GEMM micro-kernels tvm_armq can tensorize, and how to pick one for a target.

Every int8/bf16 matrix product in tvm_armq is cut into the same micro-kernel:

    C[mr, nr] += A[mr, kr] · B[nr, kr]^T          (math: mr x kr · kr x nr → mr x nr)

with A and B packed so that one block of each is contiguous:

    A_packed[M/mr, K/kr, mr, kr]      B_packed[N/nr, K/kr, nr, kr]

(K is zero-padded to a multiple of kr when it is packed, so a K tail costs nothing here),
and C is any row-major [mr, nr] window (row stride free). What differs between kernels is
(mr, nr, kr), the operand types and the instruction that does the block.

This module holds one frozen ``Kernel`` record per micro-kernel, the ONE ordered selection
table ``TABLE`` (from the portable scalar reference at the bottom up to i8mm at the top),
``select(target, a_dtype, b_dtype)`` (the best kernel the target can run), ``require``
(a clear error instead of an LLVM crash when a target lacks a kernel's instruction) and
``desc(kernel)``, the scalar TVMScript reference every kernel's ``TensorIntrin`` is matched
against. The instruction sequences (the ``impl`` half) live in ``mmla.py``, ``dot.py`` and
``neon.py``; see README.md next to this file for the naming grammar and lane diagrams.

Registration is explicit and idempotent: ``register(kernel)`` / ``register_all()`` (or
``tensorize(...)``, which registers what it uses). Importing this module loads no TVM.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import subprocess
import sys

# ------------------------------------------------------------------ names
# gemm_<A><B><C>_<mr>x<nr>x<kr>_<isa>; <isa> names the target feature the kernel needs.
_SHORT = {"int8": "s8", "uint8": "u8", "int32": "s32", "uint32": "u32",
          "bfloat16": "bf16", "float32": "f32"}
ISAS = ("ref", "neon", "dotprod", "i8mm", "bf16")
NAME_RE = re.compile(r"^gemm_(s8|u8|bf16)(s8|u8|bf16)(s32|u32|f32)_(\d+)x(\d+)x(\d+)_"
                     r"(ref|neon|dotprod|i8mm|bf16)$")

# TVM target feature -> the LLVM -mattr spelling that turns it on (for error messages).
FEATURE_MATTR = {"has_asimd": "+neon", "has_dotprod": "+dotprod",
                 "has_matmul_i8": "+i8mm", "has_bf16": "+bf16"}


def kernel_name(a_dtype: str, b_dtype: str, acc_dtype: str, mr: int, nr: int, kr: int,
                isa: str) -> str:
    """The name a kernel with these properties must have (the grammar in README.md)."""
    if isa not in ISAS:
        raise ValueError(f"unknown isa suffix {isa!r}: expected one of {', '.join(ISAS)}")
    return (f"gemm_{_SHORT[a_dtype]}{_SHORT[b_dtype]}{_SHORT[acc_dtype]}"
            f"_{mr}x{nr}x{kr}_{isa}")


# Module constants: the one spelling of every kernel name (record .name and TensorIntrin).
GEMM_S8S8S32_1X1X1_REF = "gemm_s8s8s32_1x1x1_ref"
GEMM_U8U8S32_1X1X1_REF = "gemm_u8u8s32_1x1x1_ref"
GEMM_U8S8S32_1X1X1_REF = "gemm_u8s8s32_1x1x1_ref"
GEMM_S8U8S32_1X1X1_REF = "gemm_s8u8s32_1x1x1_ref"
GEMM_BF16BF16F32_1X1X1_REF = "gemm_bf16bf16f32_1x1x1_ref"
GEMM_S8S8S32_4X4X16_NEON = "gemm_s8s8s32_4x4x16_neon"
GEMM_U8U8S32_4X4X16_NEON = "gemm_u8u8s32_4x4x16_neon"
GEMM_S8S8S32_4X4X8_NEON = "gemm_s8s8s32_4x4x8_neon"
GEMM_U8U8S32_4X4X8_NEON = "gemm_u8u8s32_4x4x8_neon"
GEMM_S8S8S32_1X4X16_NEON = "gemm_s8s8s32_1x4x16_neon"
GEMM_U8U8S32_1X4X16_NEON = "gemm_u8u8s32_1x4x16_neon"
GEMM_S8S8S32_4X4X16_DOTPROD = "gemm_s8s8s32_4x4x16_dotprod"
GEMM_U8U8S32_4X4X16_DOTPROD = "gemm_u8u8s32_4x4x16_dotprod"
GEMM_S8S8S32_4X4X4_DOTPROD = "gemm_s8s8s32_4x4x4_dotprod"
GEMM_U8U8S32_4X4X4_DOTPROD = "gemm_u8u8s32_4x4x4_dotprod"
GEMM_S8S8S32_1X4X4_DOTPROD = "gemm_s8s8s32_1x4x4_dotprod"
GEMM_U8U8S32_1X4X4_DOTPROD = "gemm_u8u8s32_1x4x4_dotprod"
GEMM_U8S8S32_4X4X16_I8MM = "gemm_u8s8s32_4x4x16_i8mm"
GEMM_U8S8S32_4X4X4_I8MM = "gemm_u8s8s32_4x4x4_i8mm"
GEMM_S8S8S32_2X2X8_I8MM = "gemm_s8s8s32_2x2x8_i8mm"
GEMM_U8U8S32_2X2X8_I8MM = "gemm_u8u8s32_2x2x8_i8mm"
GEMM_U8S8S32_2X2X8_I8MM = "gemm_u8s8s32_2x2x8_i8mm"
GEMM_BF16BF16F32_2X2X4_BF16 = "gemm_bf16bf16f32_2x2x4_bf16"


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One micro-kernel: C[mr, nr] += A[mr, kr] · B[nr, kr]^T on packed A and B.

    ``features`` are TVM target feature names (``target.features.<name>``) the target must
    have; ``instructions`` the mnemonics the emitted assembly contains; ``form`` how the
    instruction is used ("matrix", "by_element", "by_vector", "widening" or "scalar");
    ``module`` the file in this package whose ``impl(kernel)`` builds the instruction
    sequence (None: the scalar reference, which is never tensorized).
    """

    name: str
    mr: int
    nr: int
    kr: int
    a_dtype: str
    b_dtype: str
    acc_dtype: str
    isa: str
    features: tuple[str, ...]
    instructions: tuple[str, ...]
    form: str
    module: str | None
    summary: str

    def __post_init__(self):
        want = kernel_name(self.a_dtype, self.b_dtype, self.acc_dtype, self.mr, self.nr,
                           self.kr, self.isa)
        if self.name != want:
            raise ValueError(f"kernel {self.name!r} breaks the naming grammar: its "
                             f"properties spell {want!r}")
        unknown = [f for f in self.features if f not in FEATURE_MATTR]
        if unknown:
            raise ValueError(f"kernel {self.name}: unknown target features {unknown}")

    @property
    def intrin(self) -> str | None:
        """The registered TensorIntrin name (the kernel name), None for the reference."""
        return None if self.module is None else self.name

    @property
    def a_layout(self) -> str:
        return f"[M/{self.mr}, K/{self.kr}, {self.mr}, {self.kr}]"

    @property
    def b_layout(self) -> str:
        return f"[N/{self.nr}, K/{self.kr}, {self.nr}, {self.kr}]"

    def a_packed_shape(self, m: int, k: int) -> tuple[int, int, int, int]:
        """Shape of packed A for an M x K operand (M a multiple of mr; K padded up to kr)."""
        if m % self.mr:
            raise ValueError(f"{self.name}: M={m} is not a multiple of mr={self.mr}")
        return (m // self.mr, -(-k // self.kr), self.mr, self.kr)

    def b_packed_shape(self, n: int, k: int) -> tuple[int, int, int, int]:
        """Shape of packed B for an N x K operand (N a multiple of nr; K padded up to kr)."""
        if n % self.nr:
            raise ValueError(f"{self.name}: N={n} is not a multiple of nr={self.nr}")
        return (n // self.nr, -(-k // self.kr), self.nr, self.kr)


def _ref(a, b, acc, name):
    return Kernel(name, 1, 1, 1, a, b, acc, "ref", (), (), "scalar", None,
                  "portable scalar loops, no tensorize (any target)")


# ONE ordered table, from the bottom rung (portable reference) to the top (i8mm / bf16).
# ``select`` walks it from the top and returns the first kernel the target can run.
TABLE: tuple[Kernel, ...] = (
    _ref("int8", "int8", "int32", GEMM_S8S8S32_1X1X1_REF),
    _ref("uint8", "uint8", "int32", GEMM_U8U8S32_1X1X1_REF),
    _ref("uint8", "int8", "int32", GEMM_U8S8S32_1X1X1_REF),
    _ref("int8", "uint8", "int32", GEMM_S8U8S32_1X1X1_REF),
    _ref("bfloat16", "bfloat16", "float32", GEMM_BF16BF16F32_1X1X1_REF),
    # Armv8.0 widening kernels over 8 bytes of K, below the 16-byte ones so that the walk
    # meets those first: for a GEMM whose K is 1-8 past a multiple of 16 (``select`` with
    # depth: K = 24 is three blocks of 8, against two of 16, 32 with 8 bytes of padding)
    # (its block form widens one product per (i, j): saddlp; the whole-K form sadalp)
    Kernel(GEMM_S8S8S32_4X4X8_NEON, 4, 4, 8, "int8", "int8", "int32", "neon",
           ("has_asimd",), ("smull", "saddlp", "addp"), "widening", "neon",
           "8 bytes of K: smull + saddlp/sadalp + addp (Armv8.0)"),
    Kernel(GEMM_U8U8S32_4X4X8_NEON, 4, 4, 8, "uint8", "uint8", "int32", "neon",
           ("has_asimd",), ("umull", "uaddlp", "addp"), "widening", "neon",
           "8 bytes of K: umull + uaddlp/uadalp + addp (Armv8.0)"),
    # Armv8.0: widening multiply, pairwise accumulate long, pairwise add (neon.py). The
    # block form multiplies the halves of a 16-byte row with smull/smull2; the whole-K
    # form (impl_k_loop) uses smull on 8-byte halves, so smull2 is not listed.
    Kernel(GEMM_S8S8S32_4X4X16_NEON, 4, 4, 16, "int8", "int8", "int32", "neon",
           ("has_asimd",), ("smull", "sadalp", "addp"), "widening", "neon",
           "smull/smull2 + saddlp/sadalp + addp (Armv8.0)"),
    Kernel(GEMM_U8U8S32_4X4X16_NEON, 4, 4, 16, "uint8", "uint8", "int32", "neon",
           ("has_asimd",), ("umull", "uadalp", "addp"), "widening", "neon",
           "umull/umull2 + uaddlp/uadalp + addp (Armv8.0)"),
    # ... and its one-row form, for a GEMM of one row (``select`` with rows = 1)
    Kernel(GEMM_S8S8S32_1X4X16_NEON, 1, 4, 16, "int8", "int8", "int32", "neon",
           ("has_asimd",), ("smull", "sadalp", "addp"), "widening", "neon",
           "one row: smull/smull2 + saddlp/sadalp + addp (Armv8.0)"),
    Kernel(GEMM_U8U8S32_1X4X16_NEON, 1, 4, 16, "uint8", "uint8", "int32", "neon",
           ("has_asimd",), ("umull", "uadalp", "addp"), "widening", "neon",
           "one row: umull/umull2 + uaddlp/uadalp + addp (Armv8.0)"),
    # Armv8.2 dot product, by vector: the drop-in for the neon kernel's 4x4x16 block (dot.py)
    Kernel(GEMM_S8S8S32_4X4X16_DOTPROD, 4, 4, 16, "int8", "int8", "int32", "dotprod",
           ("has_dotprod",), ("sdot", "addp"), "by_vector", "dot",
           "sdot (by vector) + addp"),
    Kernel(GEMM_U8U8S32_4X4X16_DOTPROD, 4, 4, 16, "uint8", "uint8", "int32", "dotprod",
           ("has_dotprod",), ("udot", "addp"), "by_vector", "dot",
           "udot (by vector) + addp"),
    # Armv8.2 dot product, by element: one instruction per row of C (dot.py)
    Kernel(GEMM_S8S8S32_4X4X4_DOTPROD, 4, 4, 4, "int8", "int8", "int32", "dotprod",
           ("has_dotprod",), ("sdot",), "by_element", "dot", "sdot (by element)"),
    Kernel(GEMM_U8U8S32_4X4X4_DOTPROD, 4, 4, 4, "uint8", "uint8", "int32", "dotprod",
           ("has_dotprod",), ("udot",), "by_element", "dot", "udot (by element)"),
    Kernel(GEMM_S8S8S32_1X4X4_DOTPROD, 1, 4, 4, "int8", "int8", "int32", "dotprod",
           ("has_dotprod",), ("sdot",), "by_element", "dot", "one row: sdot (by element)"),
    Kernel(GEMM_U8U8S32_1X4X4_DOTPROD, 1, 4, 4, "uint8", "uint8", "int32", "dotprod",
           ("has_dotprod",), ("udot",), "by_element", "dot", "one row: udot (by element)"),
    # Armv8.6 int8 matrix multiply extension: mixed-sign dot products (dot.py)
    Kernel(GEMM_U8S8S32_4X4X16_I8MM, 4, 4, 16, "uint8", "int8", "int32", "i8mm",
           ("has_matmul_i8",), ("usdot", "addp"), "by_vector", "dot",
           "usdot (by vector) + addp"),
    Kernel(GEMM_U8S8S32_4X4X4_I8MM, 4, 4, 4, "uint8", "int8", "int32", "i8mm",
           ("has_matmul_i8",), ("sudot",), "by_element", "dot",
           "sudot (by element: the unsigned operand is the indexed one)"),
    # Armv8.6 int8 matrix multiply-accumulate (mmla.py)
    Kernel(GEMM_S8S8S32_2X2X8_I8MM, 2, 2, 8, "int8", "int8", "int32", "i8mm",
           ("has_matmul_i8",), ("smmla",), "matrix", "mmla", "smmla"),
    Kernel(GEMM_U8U8S32_2X2X8_I8MM, 2, 2, 8, "uint8", "uint8", "int32", "i8mm",
           ("has_matmul_i8",), ("ummla",), "matrix", "mmla", "ummla"),
    Kernel(GEMM_U8S8S32_2X2X8_I8MM, 2, 2, 8, "uint8", "int8", "int32", "i8mm",
           ("has_matmul_i8",), ("usmmla",), "matrix", "mmla", "usmmla"),
    # Armv8.6 BFloat16 extension (mmla.py)
    Kernel(GEMM_BF16BF16F32_2X2X4_BF16, 2, 2, 4, "bfloat16", "bfloat16", "float32", "bf16",
           ("has_bf16",), ("bfmmla",), "matrix", "mmla", "bfmmla"),
)
KERNELS: dict[str, Kernel] = {k.name: k for k in TABLE}
assert len(KERNELS) == len(TABLE), "kernel names must be unique"


def get(name: str) -> Kernel:
    """The kernel called ``name``."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"no micro-kernel {name!r}; known: {', '.join(KERNELS)}") from None


# --------------------------------------------------------------- targets
class MissingTargetFeature(ValueError):
    """A kernel was asked for on a target that lacks the instruction it is built on."""


def as_target(target):
    """A ``tvm.target.Target`` from a Target, a JSON dict, an ISA level or core preset name
    (``neon``, ``dotprod``, ``i8mm``, ``cortex-a76``, ...), or a target string."""
    import tvm

    from tvm_armq import targets

    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and not target.lstrip().startswith("{"):
        try:
            return tvm.target.Target(targets.target(target))
        except targets.UnknownIsaError:
            pass
    return tvm.target.Target(target)


def target_has(target, feature: str) -> bool:
    """Whether ``target`` has TVM target feature ``feature`` (``has_dotprod``, ...).

    TVM 0.27 derives ``target.features`` from LLVM for has_asimd/has_dotprod/has_matmul_i8
    but has no ``has_bf16``; for that one an explicit ``+bf16``/``-bf16`` in ``mattr``
    decides, else LLVM is asked whether the target's cpu/attributes imply FEAT_BF16 (as
    ``+v8.6a`` or ``mcpu=neoverse-n2`` do).
    """
    target = as_target(target)
    value = getattr(target.features, feature, None)
    if value is not None:
        return bool(value)
    if feature != "has_bf16" or not getattr(target.features, "is_aarch64", False):
        return False
    mattr = [str(m) for m in target.attrs.get("mattr", [])]
    if "-bf16" in mattr:
        return False
    if "+bf16" in mattr:
        return True
    try:
        from tvm.target.codegen import target_has_features

        return bool(target_has_features("bf16", target))
    except Exception:  # noqa: BLE001 - no LLVM to ask: only the explicit mattr counts
        return False


def missing_features(kernel: Kernel, target) -> list[str]:
    return [f for f in kernel.features if not target_has(target, f)]


def require(kernel: Kernel, target) -> Kernel:
    """``kernel`` if ``target`` can run it; otherwise a ``MissingTargetFeature`` that names
    the kernel, the missing feature(s) and the target."""
    target = as_target(target)
    missing = missing_features(kernel, target)
    if missing:
        need = ", ".join(f"{f} ({FEATURE_MATTR[f]})" for f in missing)
        best = select(target, kernel.a_dtype, kernel.b_dtype)
        raise MissingTargetFeature(
            f"kernel {kernel.name} ({kernel.summary}) needs target feature {need}, which "
            f"target {target} does not have; the best kernel for it is {best.name} "
            f"(kernels.select)")
    return kernel


def _dtype(d) -> str:
    return str(d)


def is_one_row(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a one-row (GEMV) kernel: mr = 1, for GEMMs of one row only."""
    return kernel.mr == 1 and kernel.intrin is not None


def select(target, a_dtype, b_dtype, rows: int | None = None,
           depth: int | None = None) -> Kernel:
    """The best kernel in ``TABLE`` for ``a_dtype`` x ``b_dtype`` whose features ``target``
    has (the scalar reference when no instruction fits).

    ``rows`` is the GEMM's M where known. A one-row GEMM (rows = 1: a dense layer on one
    input vector, a 1x1 convolution on a 1x1 image) takes the best one-row kernel
    (``is_one_row``), ranked above every multi-row kernel, whose rows after the first
    would only multiply padding (3 of 4 rows at neon and dotprod, 1 of 2 with smmla).
    Any other GEMM never takes a one-row kernel: it would reload each block of B once
    per row of A instead of once per mr rows.

    ``depth`` is the GEMM's K where known. Among the chosen kernel's twins over fewer
    bytes of K (the same instruction and rows, a smaller kr: neon's 4x4x8) a GEMM of
    known depth takes the one that pads K the least, the larger kr on a tie: K = 24 is
    three blocks of 8 rather than two of 16 with a third of them padding."""
    target = as_target(target)
    a, b = _dtype(a_dtype), _dtype(b_dtype)
    fits = [k for k in reversed(TABLE)
            if (k.a_dtype, k.b_dtype) == (a, b) and not missing_features(k, target)]
    if not fits:
        pairs = sorted({(k.a_dtype, k.b_dtype) for k in TABLE})
        raise ValueError(f"no micro-kernel multiplies {a} by {b}; supported pairs: {pairs}")
    one_row = [k for k in fits if is_one_row(k)]
    if rows == 1 and one_row:
        return one_row[0]
    best = next(k for k in fits if not is_one_row(k))
    if depth is None or best.intrin is None:
        return best
    twins = [k for k in fits if _same_but(k, best, "kr")]
    return min(twins, key=lambda k: (-(-depth // k.kr) * k.kr, -k.kr))


def one_row_twin(kernel: Kernel) -> Kernel | None:
    """The one-row kernel (``is_one_row``) that is ``kernel``'s instruction sequence on a
    single row of A, or None: the same dtypes, instruction, nr and kr, so it reads the
    same packed B. ``schedules.conv2d_gemm`` runs a GEMM's last M % mr rows through it
    rather than padding them up to a whole micro-tile."""
    twins = [k for k in TABLE if is_one_row(k) and _same_but(k, kernel, "mr")]
    return twins[0] if twins and not is_one_row(kernel) else None


def _same_but(a: Kernel, b: Kernel, field: str) -> bool:
    """Whether two kernels are one instruction sequence over a different ``field`` ("kr":
    other bytes of K, "mr": other rows): they differ only in it (and so in name, summary
    and the mnemonics a block shows)."""
    def rest(k):
        return {f: v for f, v in dataclasses.asdict(k).items()
                if f not in ("name", field, "summary", "instructions")}

    return rest(a) == rest(b)


# ------------------------------------------------------------- desc / impl
def _intrin_func(kernel: Kernel, name: str, a_shape, b_shape, c_shape, body):
    """A PrimFunc with a TensorIntrin's signature (a, b, c): A and B packed operands of
    the given shapes, C the accumulators, any strides but a unit innermost one; its root
    block reads all of C, A and B and writes all of C, and ``body(A, B, C)`` fills it.
    The block, whole-K and direct-read forms differ only in these shapes."""
    from tvm.script import tirx as T
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder.tirx import prim_func as ir_prim_func

    def whole(buf, shape):
        return buf[tuple(slice(0, d) for d in shape)]

    with IRBuilder() as ib:
        with ir_prim_func():
            T.func_name(name)
            a = T.arg("a", T.handle())
            b = T.arg("b", T.handle())
            c = T.arg("c", T.handle())
            A = T.match_buffer(a, a_shape, kernel.a_dtype, offset_factor=1)
            B = T.match_buffer(b, b_shape, kernel.b_dtype, offset_factor=1)
            C = T.match_buffer(c, c_shape, kernel.acc_dtype, offset_factor=1,
                               strides=[T.int32() for _ in c_shape[1:]] + [1])
            with T.sblock("root"):
                T.reads(whole(C, c_shape), whole(A, a_shape), whole(B, b_shape))
                T.writes(whole(C, c_shape))
                body(A, B, C)
    return ib.get()


def _block_func(kernel: Kernel, name: str, body):
    """A PrimFunc with the signature of the block form: A[mr, kr], B[nr, kr], C[mr, nr]."""
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    return _intrin_func(kernel, name, (mr, kr), (nr, kr), (mr, nr), body)


def _bind_iters(T, spatial, reduce) -> tuple[list, list]:
    """In a desc's block: iters bound to the loop variables of ``spatial`` ((var, extent)
    pairs) and ``reduce`` (vars), in that order, returned as (spatial iters, reduce iters).
    A spatial loop of extent 1 (one row, one micro-tile) gets the constant 0 and no iter:
    blockize drops such an iter from the GEMM's block, so the pattern must not bind one."""
    kept = [var for var, extent in spatial if extent > 1]
    bound = iter(T.axis.remap("S" * len(kept) + "R" * len(reduce), kept + list(reduce)))
    return ([next(bound) if extent > 1 else 0 for _, extent in spatial],
            [next(bound) for _ in reduce])


def desc(kernel: Kernel):
    """The scalar reference of ``kernel`` as a PrimFunc (the TensorIntrin desc):
    C[i, j] += acc(A[i, k]) * acc(B[j, k]) over i < mr, j < nr, k < kr."""
    from tvm.script import tirx as T

    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    c_dt = kernel.acc_dtype

    def body(A, B, C):
        with T.grid(mr, nr, kr) as (i, j, k):
            with T.sblock("update"):
                (vi, vj), (vk,) = _bind_iters(T, [(i, mr), (j, nr)], [k])
                T.reads(C[vi, vj], A[vi, vk], B[vj, vk])
                T.writes(C[vi, vj])
                product = T.Cast(c_dt, A[vi, vk]) * T.Cast(c_dt, B[vj, vk])
                T.buffer_store(C, C[vi, vj] + product, [vi, vj])

    return _block_func(kernel, kernel.name + "_desc", body)


def build_impl(kernel: Kernel, emit):
    """An impl PrimFunc with the same signature as ``desc(kernel)``: ``emit(A, B, C)`` adds
    the instruction sequence (IRBuilder statements) inside the root block."""
    return _block_func(kernel, kernel.name, emit)


def check_shape(kernel: Kernel, mr: int | tuple[int, ...], nr: int, kr: int) -> None:
    """Raise unless ``kernel`` has the block shape its instruction sequence computes
    (``mr``: one row count, or the row counts it can do)."""
    rows = mr if isinstance(mr, tuple) else (mr,)
    if kernel.mr not in rows or (kernel.nr, kernel.kr) != (nr, kr):
        want = "|".join(str(r) for r in rows)
        raise ValueError(f"{kernel.name}: its instruction computes a {want}x{nr}x{kr} block, "
                         f"the record says {kernel.mr}x{kernel.nr}x{kernel.kr}")


def impl(kernel: Kernel):
    """The impl PrimFunc of ``kernel`` (from the module that implements its instruction)."""
    if kernel.module is None:
        raise ValueError(f"{kernel.name} is the scalar reference: it has no instruction "
                         "sequence and is never tensorized (leave its loops as they are)")
    module = importlib.import_module(f".{kernel.module}", __package__)
    return module.impl(kernel)


def register(kernel: Kernel) -> str:
    """Register ``kernel``'s TensorIntrin (once) and return its name."""
    from tvm.s_tir import TensorIntrin

    if kernel.intrin is None:
        raise ValueError(f"{kernel.name} is the scalar reference: there is no TensorIntrin")
    if TensorIntrin.get(kernel.intrin, allow_missing=True) is None:
        TensorIntrin.register(kernel.intrin, desc(kernel), impl(kernel))
    return kernel.intrin


# ------------------------------------------------------- whole-K intrinsics
# Some kernels reduce inside the block: the Armv8.0 widening kernel ends every block with
# a pairwise-add tree that turns per-(row, column) partial-sum vectors into a row of C.
# Tensorized block by block, that tree runs on every K step. Their modules therefore also
# offer ``impl_k_loop(kernel, k_blocks)``: the instruction sequence of a whole K loop of
# ``k_blocks`` blocks, which keeps the partial sums in registers across K and reduces
# once. Its TensorIntrin is registered per K-block count (``k_loop_name``), on demand.

def has_k_loop(kernel: Kernel) -> bool:
    """Whether ``kernel``'s module offers a whole-K instruction sequence (``impl_k_loop``)."""
    if kernel.module is None:
        return False
    return hasattr(importlib.import_module(f".{kernel.module}", __package__), "impl_k_loop")


def k_loop_name(kernel: Kernel, k_blocks: int) -> str:
    """The TensorIntrin name of ``kernel`` over a K loop of ``k_blocks`` blocks."""
    return f"{kernel.name}__k{k_blocks}"


def _k_loop_func(kernel: Kernel, k_blocks: int, name: str, body):
    """A PrimFunc with the signature of the whole-K form: ``k_blocks`` blocks of A and B."""
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    return _intrin_func(kernel, name, (k_blocks, mr, kr), (k_blocks, nr, kr), (mr, nr), body)


def desc_k_loop(kernel: Kernel, k_blocks: int):
    """The scalar reference of ``kernel`` over a whole K loop: A and B are ``k_blocks``
    consecutive packed blocks, C[i, j] += sum over kb, k of A[kb, i, k] * B[kb, j, k]."""
    from tvm.script import tirx as T

    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    c_dt = kernel.acc_dtype

    def body(A, B, C):
        with T.grid(k_blocks, mr, nr, kr) as (kb, i, j, k):
            with T.sblock("update"):  # block iters in the GEMM block's order
                (vi, vj), (vb, vk) = _bind_iters(T, [(i, mr), (j, nr)], [kb, k])
                T.reads(C[vi, vj], A[vb, vi, vk], B[vb, vj, vk])
                T.writes(C[vi, vj])
                product = T.Cast(c_dt, A[vb, vi, vk]) * T.Cast(c_dt, B[vb, vj, vk])
                T.buffer_store(C, C[vi, vj] + product, [vi, vj])

    return _k_loop_func(kernel, k_blocks, k_loop_name(kernel, k_blocks) + "_desc", body)


def build_impl_k_loop(kernel: Kernel, k_blocks: int, emit):
    """An impl PrimFunc with the signature of ``desc_k_loop(kernel, k_blocks)``;
    ``emit(A, B, C)`` adds the instruction sequence."""
    return _k_loop_func(kernel, k_blocks, k_loop_name(kernel, k_blocks), emit)


def register_k_loop(kernel: Kernel, k_blocks: int) -> str:
    """Register ``kernel``'s whole-K TensorIntrin for ``k_blocks`` blocks (once); its name."""
    from tvm.s_tir import TensorIntrin

    if not has_k_loop(kernel):
        raise ValueError(f"{kernel.name} has no whole-K instruction sequence (impl_k_loop)")
    name = k_loop_name(kernel, k_blocks)
    if TensorIntrin.get(name, allow_missing=True) is None:
        module = importlib.import_module(f".{kernel.module}", __package__)
        TensorIntrin.register(name, desc_k_loop(kernel, k_blocks),
                              module.impl_k_loop(kernel, k_blocks))
    return name


# ---------------------------------------------------- direct-read intrinsics
# A 1x1 stride-1 convolution's A is the input itself: row m of A is pixel m's channels,
# contiguous, and consecutive pixels are in_c bytes apart. A by-element dot-product kernel
# needs no interleaved A block for it: one 16-byte load of a row holds four K steps, and
# the lane index of ``sdot Vc.4s, Vb.16b, Va.4b[t]`` picks K step t of that row. So its
# module may offer ``impl_direct(kernel, k, n_tiles)``: a whole-K instruction sequence for
# C[n_tiles, mr, nr] (n_tiles micro-tiles side by side, sharing every A load) whose A is
# the mr x k row-major window of the input, read where it lies (no pack). Its
# TensorIntrin is registered per (k, n_tiles) (``direct_name``), on demand.

def has_direct(kernel: Kernel) -> bool:
    """Whether ``kernel``'s module offers a direct-read instruction sequence for it."""
    if kernel.module is None:
        return False
    module = importlib.import_module(f".{kernel.module}", __package__)
    return getattr(module, "supports_direct", lambda k: False)(kernel)


@dataclasses.dataclass(frozen=True)
class DirectWindow:
    """Where a direct-read GEMM finds its mr rows of A in place, as flat element offsets
    into the input (NHWC is contiguous, so any pixel's channels start at a flat offset).

    Row i of A (one output pixel) is ``segments`` runs of ``segment`` contiguous
    elements; run s of row i starts at ``i * row_stride + s * segment_stride`` from the
    window's origin, and K = segments * segment:

        pointwise conv / dense   one run of K; rows K apart (consecutive pixels)
        kh x kw conv (columns    one run per kernel row: its kw taps are adjacent
        not dilated, stride sw)  pixels, kw * C contiguous elements; runs dh rows of the
                                 (padded) image apart; rows sw * C apart, the mr output
                                 pixels being consecutive in one output row
    """

    segment: int
    segments: int = 1
    segment_stride: int = 0
    row_stride: int | None = None  # None: the rows are consecutive runs (pointwise)

    @classmethod
    def pointwise(cls, k: int) -> "DirectWindow":
        return cls(k)

    @property
    def k(self) -> int:
        return self.segment * self.segments

    @property
    def stride(self) -> int:
        """Elements from one row's start to the next's."""
        return self.segment if self.row_stride is None else self.row_stride

    def extent(self, mr: int) -> int:
        """Elements from the window's first to one past its last."""
        return (mr - 1) * self.stride + (self.segments - 1) * self.segment_stride + self.segment

    @property
    def tag(self) -> str:
        """The window's part of a TensorIntrin name."""
        if self.segments == 1 and self.row_stride is None:
            return f"k{self.segment}"
        return f"k{self.segment}x{self.segments}_s{self.segment_stride}_r{self.stride}"


def direct_name(kernel: Kernel, window: DirectWindow, n_tiles: int) -> str:
    """The TensorIntrin name of ``kernel``'s direct-read form for ``window`` and n_tiles."""
    return f"{kernel.name}__direct_{window.tag}_n{n_tiles}"


def _direct_func(kernel: Kernel, window: DirectWindow, n_tiles: int, name: str, body):
    """A PrimFunc with the signature of the direct-read form. A: the flat window of the
    input holding the mr rows (``DirectWindow``), so the GEMM may index the NHWC input by
    flat offset. B: n_tiles packed column blocks over the whole K loop. C: n_tiles
    row-major [mr, nr] windows."""
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    return _intrin_func(kernel, name, (window.extent(mr),), (n_tiles, window.k // kr, nr, kr),
                        (n_tiles, mr, nr), body)


def desc_direct(kernel: Kernel, window: DirectWindow, n_tiles: int):
    """The scalar reference of the direct-read form (``window``: ``DirectWindow``):

        C[t, i, j] += sum over s, kb, kk of A[i * row_stride + s * segment_stride
                                              + kb * kr + kk] * B[t, s * blocks + kb, j, kk]

    (blocks = segment / kr; a single-segment window has no s loop). The loops and block
    iters are in the GEMM block's order (``conv2d_gemm.direct_gemm_te``)."""
    from tvm.script import tirx as T

    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    blocks, c_dt = window.segment // kr, kernel.acc_dtype
    segmented = window.segments > 1

    def body(A, B, C):
        extents = [n_tiles] + ([window.segments] if segmented else []) + [blocks, mr, nr, kr]
        with T.grid(*extents) as loops:
            t, rest = loops[0], loops[1:]
            seg, (kb, i, j, kk) = (rest[0], rest[1:]) if segmented else (None, rest)
            with T.sblock("update"):
                (vt, vi, vj), reduced = _bind_iters(
                    T, [(t, n_tiles), (i, mr), (j, nr)], ([seg] if segmented else []) + [kb, kk])
                vs, vb, vk = reduced if segmented else (0, *reduced)
                a_at = vi * window.stride + vs * window.segment_stride + vb * kr + vk
                b_at = (vt, vs * blocks + vb, vj, vk)
                T.reads(C[vt, vi, vj], A[a_at], B[b_at])
                T.writes(C[vt, vi, vj])
                product = T.Cast(c_dt, A[a_at]) * T.Cast(c_dt, B[b_at])
                T.buffer_store(C, C[vt, vi, vj] + product, [vt, vi, vj])

    return _direct_func(kernel, window, n_tiles, direct_name(kernel, window, n_tiles) + "_desc",
                        body)


def build_impl_direct(kernel: Kernel, window: DirectWindow, n_tiles: int, emit):
    """An impl PrimFunc with the signature of ``desc_direct(kernel, window, n_tiles)``;
    ``emit(A, B, C)`` adds the instruction sequence."""
    return _direct_func(kernel, window, n_tiles, direct_name(kernel, window, n_tiles), emit)


def for_each_run(window: DirectWindow, run) -> None:
    """In an impl being built: ``run(r)`` for every run r of ``window``'s rows, r a
    constant for a single run, else the variable of a serial loop over the runs."""
    from tvm.script import tirx as T

    if window.segments == 1:
        run(0)
    else:
        with T.serial(window.segments) as r:
            run(r)


def register_direct(kernel: Kernel, window: DirectWindow, n_tiles: int) -> str:
    """Register ``kernel``'s direct-read TensorIntrin for ``window`` and n_tiles (once);
    its name."""
    from tvm.s_tir import TensorIntrin

    if not has_direct(kernel):
        raise ValueError(f"{kernel.name} has no direct-read instruction sequence")
    if window.segment % kernel.kr:
        raise ValueError(f"{kernel.name}: the direct-read form needs each run of A "
                         f"({window.segment} elements) to be a multiple of kr "
                         f"({kernel.kr}): A is not padded")
    name = direct_name(kernel, window, n_tiles)
    if TensorIntrin.get(name, allow_missing=True) is None:
        module = importlib.import_module(f".{kernel.module}", __package__)
        TensorIntrin.register(name, desc_direct(kernel, window, n_tiles),
                              module.impl_direct(kernel, window, n_tiles))
    return name


_K_LOOP_RE = re.compile(r"^(?P<kernel>gemm_[a-z0-9_]+?)__k(?P<blocks>\d+)$")
_DIRECT_RE = re.compile(r"^(?P<kernel>gemm_[a-z0-9_]+?)__direct_k(?P<segment>\d+)"
                        r"(?:x(?P<segments>\d+)_s(?P<stride>\d+)_r(?P<row>\d+))?"
                        r"_n(?P<n_tiles>\d+)$")


def register_named(name: str) -> str:
    """Register the TensorIntrin called ``name`` (a kernel's, its whole-K form's or its
    direct-read form's: the names carry their parameters), for replaying a schedule
    trace that refers to it by name in a process that has not built it yet."""
    from tvm.s_tir import TensorIntrin

    if TensorIntrin.get(name, allow_missing=True) is not None:
        return name
    if NAME_RE.match(name):
        return register(get(name))
    m = _K_LOOP_RE.match(name)
    if m:
        return register_k_loop(get(m["kernel"]), int(m["blocks"]))
    m = _DIRECT_RE.match(name)
    if m:
        window = (DirectWindow.pointwise(int(m["segment"])) if m["segments"] is None
                  else DirectWindow(int(m["segment"]), int(m["segments"]), int(m["stride"]),
                                    int(m["row"])))
        return register_direct(get(m["kernel"]), window, int(m["n_tiles"]))
    raise ValueError(f"{name!r} is not the name of a tvm_armq TensorIntrin")


def register_all() -> list[str]:
    """Register the TensorIntrin of every tensorizable kernel in ``TABLE``."""
    return [register(k) for k in TABLE if k.intrin is not None]


# --------------------------------------------------------------- tensorize
class TensorizeUnavailable(RuntimeError):
    """``Schedule.tensorize`` would crash the process in this Python environment."""


@functools.lru_cache(maxsize=None)
def _ir_serialization_works() -> bool:
    # Schedule.tensorize deep-copies the intrinsic through TVM's JSON serializer. With
    # apache-tvm-ffi 0.1.15.x under apache-tvm 0.27.0.post1 that serializer segfaults on
    # any IR node, which would kill the calling process; probe it in a child process.
    code = "import tvm; tvm.ir.save_json(tvm.ir.PrimType('int32'))"
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return res.returncode == 0


def tensorize(sch, loop, kernel: Kernel, target, *, k_blocks: int | None = None,
              direct: tuple[DirectWindow, int] | None = None) -> None:
    """Tensorize the block loop nest under ``loop`` with ``kernel`` for ``target``.

    ``loop`` is the outermost of the (mr, nr, kr) loops of a block computing
    ``C[.., ..] += acc(A_packed[.., .., i, k]) * acc(B_packed[.., .., j, k])`` without an
    init (``decompose_reduction`` first). With ``k_blocks``, ``loop`` is instead the K-block
    loop of extent ``k_blocks`` right above them (kb, i, j, k) and the whole-K intrinsic
    is used (``has_k_loop``). With ``direct`` = (window, n_tiles), ``loop`` is the
    micro-tile column loop of extent n_tiles above ([s,] kb, i, j, kk) of a GEMM that reads
    A from the input (``has_direct``; ``window``: ``DirectWindow``), and the direct-read
    intrinsic is used. Raises
    ``MissingTargetFeature`` when the target cannot run the kernel, before anything reaches LLVM.
    """
    require(kernel, target)
    if kernel.intrin is None:
        raise ValueError(f"{kernel.name} is the scalar reference: nothing to tensorize")
    if not _ir_serialization_works():
        try:
            from importlib.metadata import version

            ffi = version("apache-tvm-ffi")
        except Exception:  # noqa: BLE001
            ffi = "?"
        raise TensorizeUnavailable(
            f"Schedule.tensorize would crash this process: TVM's IR serialization "
            f"(tvm.ir.save_json, which tensorize uses to copy the intrinsic) segfaults with "
            f"apache-tvm-ffi {ffi} under apache-tvm 0.27.0.post1. Install a matching FFI: "
            f"pip install 'apache-tvm-ffi<0.1.15' (0.1.14.post1 works)")
    if direct is not None:
        sch.tensorize(loop, register_direct(kernel, *direct))
    else:
        sch.tensorize(loop, register(kernel) if k_blocks is None
                      else register_k_loop(kernel, k_blocks))
