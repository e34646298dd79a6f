"""The GEMM micro-kernels tvm_armq can tensorize, their families, and the one table that
picks a kernel for a target.

Every int8/bf16 matrix product in tvm_armq is cut into the same micro-kernel:

    C[mr, nr] += A[mr, kr] · B[nr, kr]^T          (math: mr x kr · kr x nr → mr x nr)

with A and B packed so that one block of each is contiguous:

    A_packed[M/mr, K/kr, mr, kr]      B_packed[N/nr, K/kr, nr, kr]

(K is zero-padded to a multiple of kr when it is packed, so a K tail costs nothing here),
and C is any row-major [mr, nr] window (row stride free). What differs between kernels is
(mr, nr, kr), the operand types and the instruction that does the block.

Three kinds of record, all data:

    Kernel    one micro-kernel: its block, operand types, instruction, the forms it can be
              tensorized in (``BLOCK``, ``K_LOOP``, ``DIRECT``, ``INDIRECT``: see forms.py)
              and the cost facts the schedule's register model reads (``Cost``)
    Family    the kernels of one instruction sequence (one name without the block shape):
              they differ in rows (a one-row member runs GEMMs of one row and the last
              rows of a longer one) and in bytes of K; the members with one kr share the
              packed-B layout
    FAMILIES  the ONE ordered selection table, the portable reference at the bottom and
              i8mm / bf16 at the top (ruy's Path)

``select(target, a_dtype, b_dtype, rows, depth)`` is the one lookup: the top family the
target can run, then the member for the GEMM's rows and depth. ``require`` gives a clear
error instead of an LLVM crash when a target lacks a kernel's instruction. The TensorIntrins
of the forms (scalar desc, registration, tensorize) are ``forms.py``; the instruction
sequences are ``mmla.py``, ``dot.py`` and ``neon.py``; README.md next to this file has the
naming grammar and lane diagrams.
"""

from __future__ import annotations

import dataclasses
import re

from . import names

# ------------------------------------------------------------------ names
# gemm_<A><B><C>_<mr>x<nr>x<kr>_<isa> (names.py has the grammar); a family's name has no
# block shape: gemm_<A><B><C>_<isa>.
ISAS = names.ISAS
NAME_RE = re.compile(r"^gemm_(s8|u8|bf16)(s8|u8|bf16)(s32|u32|f32)_(\d+)x(\d+)x(\d+)_"
                     r"(ref|neon|dotprod|i8mm|bf16)$")

# TVM target feature -> the LLVM -mattr spelling that turns it on (for error messages).
FEATURE_MATTR = {"has_asimd": "+neon", "has_dotprod": "+dotprod",
                 "has_matmul_i8": "+i8mm", "has_bf16": "+bf16"}


def kernel_name(a_dtype: str, b_dtype: str, acc_dtype: str, mr: int, nr: int, kr: int,
                isa: str) -> str:
    """The name a GEMM micro-kernel with these properties must have."""
    return names.kernel_name("gemm", (a_dtype, b_dtype, acc_dtype), isa, (mr, nr, kr))


def family_name(a_dtype: str, b_dtype: str, acc_dtype: str, isa: str) -> str:
    """The name of the family of GEMM kernels with these properties: a kernel name without
    its block shape."""
    return names.kernel_name("gemm", (a_dtype, b_dtype, acc_dtype), isa)


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
GEMM_S8S8S32_4X4X4_DOTPROD = "gemm_s8s8s32_4x4x4_dotprod"
GEMM_U8U8S32_4X4X4_DOTPROD = "gemm_u8u8s32_4x4x4_dotprod"
GEMM_S8S8S32_1X4X4_DOTPROD = "gemm_s8s8s32_1x4x4_dotprod"
GEMM_U8U8S32_1X4X4_DOTPROD = "gemm_u8u8s32_1x4x4_dotprod"
GEMM_S8S8S32_2X2X8_I8MM = "gemm_s8s8s32_2x2x8_i8mm"
GEMM_U8U8S32_2X2X8_I8MM = "gemm_u8u8s32_2x2x8_i8mm"
GEMM_U8S8S32_2X2X8_I8MM = "gemm_u8s8s32_2x2x8_i8mm"
GEMM_BF16BF16F32_2X2X4_BF16 = "gemm_bf16bf16f32_2x2x4_bf16"

# ------------------------------------------------------------------ forms
# How a kernel's instruction sequence can be tensorized (forms.py builds each):
BLOCK = "block"    # one mr x nr x kr block per call, the K loop outside (every kernel)
K_LOOP = "k_loop"  # a whole K loop of blocks per call: a kernel that reduces inside its
#                    block (widening: a pairwise-add tree per row of C) keeps its partial
#                    sums in registers across K and reduces once
DIRECT = "direct"  # a whole K loop with A read in place from the input, unpacked (an
#                    implicit GEMM: no im2col copy), n_tiles micro-tiles side by side
INDIRECT = "indirect"  # DIRECT's instructions with each row of A at its own output pixel
#                    (micro-tiles may cross output rows): not tensorized, lowered by
#                    indirect.py from a marked block
FORMS = (BLOCK, K_LOOP, DIRECT, INDIRECT)

# The ways an instruction does a block (``Kernel.usage``).
USAGES = ("scalar", "widening", "by_element", "matrix")


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one micro-tile of a kernel costs, the facts the GEMM schedule's register and
    instruction model reads (``schedules/gemm_plan.py``).

    ``macs``: MAC instructions in one K block of one micro-tile. ``accumulators``: NEON
    registers one micro-tile keeps live across K: one row of C per int32x4 register, or,
    for a kernel that reduces inside its block (widening), one vector of partial sums per
    (row, column) of C. ``direct_operands``: the operand registers of the direct-read K
    loop (A rows and B blocks in flight; 0 without that form).

    Two measured preferences of the instruction (``scripts/bench_layers.py``; the figures
    are at the constants of ``gemm_plan.py`` that they qualify):
    ``spills_over_long_k``: a macro tile whose epilogue spills is still the better one once
    K has ``gemm_plan.LONG_K_BLOCKS`` blocks (by-element sdot); ``direct_at_any_k``: a
    pointwise GEMM reads A in place whatever K, the pack (an interleaving copy) costing more
    than the passes over A (widening smull/sadalp); ``by_pixel_max_passes``: the most
    column passes over A at which a GEMM reads A by pixel (INDIRECT) rather than packing
    it, None for any number (the pack is paid once, while each pass computes mr row
    pointers per micro-tile and walks them, an add each per K step: 4 more instructions
    in the widening kernel's 76, whose one micro-tile per pass pays them alone);
    ``reads_in_place``: whether the plan uses the DIRECT / INDIRECT forms at all where the
    layer allows (False: they exist and are tested, and packing is faster).
    """

    macs: int = 0
    accumulators: int = 0
    direct_operands: int = 0
    spills_over_long_k: bool = False
    direct_at_any_k: bool = False
    by_pixel_max_passes: int | None = None
    reads_in_place: bool = True


_LANES = 4  # int32 lanes of a 128-bit register
# ``Cost.by_pixel_max_passes``, measured with scripts/bench_layers.py (armperf 3, packed
# -> by pixel, tflite / tvm_armq). neon (widening, one micro-tile per pass): DenseNet's
# 3x3 128 -> 32 at 14 x 14 and 7 x 7 (8 column passes) 1.014 -> 1.023 and 0.980 -> 0.986;
# ResNet-50's 3x3 256 -> 256 at 14 x 14 (64 passes) 1.015 -> 1.006, 512 -> 512 at 7 x 7
# (128) 0.968 -> 0.964, its stride-2 1x1s (64, 128) 1.007 -> 0.981 and 0.965 -> 0.949.
# dotprod (by element, 4 micro-tiles per pass): DenseNet's (2 passes) 0.823 -> 1.010 and
# 0.844 -> 1.019; ResNet-50's 3x3s (16, 32) 0.983 -> 1.009 and 0.991 -> 1.005, its
# stride-2 1x1s into 256 and 512 channels (16, 32) 0.987 -> 0.992 and 0.993 -> 0.994,
# into 1024 and 2048 (64, 128) 0.998 -> 0.982 and 1.001 -> 0.990.
WIDENING_BY_PIXEL_MAX_PASSES = 16
BY_ELEMENT_BY_PIXEL_MAX_PASSES = 32


def _cost(usage: str, mr: int, nr: int, kr: int, forms: tuple[str, ...]) -> Cost:
    """The ``Cost`` of a kernel that does its block the ``usage`` way."""
    rows_of_c = -(-mr * nr // _LANES)
    if usage == "widening":  # smull (+ smull2 for 16 bytes) per (row, column) of C
        return Cost(macs=mr * nr * (kr // 8), accumulators=mr * nr,
                    direct_operands=mr + nr if DIRECT in forms else 0, direct_at_any_k=True,
                    by_pixel_max_passes=WIDENING_BY_PIXEL_MAX_PASSES)
    if usage == "by_element":  # one sdot per row of C; direct: mr A rows + one B block
        return Cost(macs=mr, accumulators=rows_of_c,
                    direct_operands=mr + 1 if DIRECT in forms else 0, spills_over_long_k=True,
                    by_pixel_max_passes=BY_ELEMENT_BY_PIXEL_MAX_PASSES)
    if usage == "matrix":  # one smmla / bfmmla per block; direct: 2 A rows, 2 zipped, 1 B
        # Read in place, one K loop covers one row pair (2 x n_tiles * 2 outputs), so no
        # second pair shares its B loads; the packed loop's 2 x 4 tiles of 2 x 2 do.
        # Measured at i8mm (armperf 3, packed -> in place, tflite / tvm_armq): v1.pw3
        # 1.774 -> 1.589, v1.pw7-11 1.904 -> 1.668, r50.s4.3x3 1.912 -> 1.675 (by
        # pixel), d121.b3.3x3 1.669 -> 1.639 (by pixel): the plan packs.
        return Cost(macs=1, accumulators=rows_of_c,
                    direct_operands=2 * mr + 1 if DIRECT in forms else 0,
                    reads_in_place=False)
    return Cost()  # the scalar reference: never tensorized, never costed


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One micro-kernel: C[mr, nr] += A[mr, kr] · B[nr, kr]^T on packed A and B.

    ``features`` are TVM target feature names (``target.features.<name>``) the target must
    have; ``instructions`` the mnemonics the emitted assembly contains; ``usage`` how the
    instruction does the block (``USAGES``); ``module`` the file in this package whose
    ``IMPLEMENTS`` builds the instruction sequences (None: the scalar reference, which is
    never tensorized); ``forms`` the forms it can be tensorized in (``FORMS``); ``cost``
    what a micro-tile costs (``Cost``, derived from the usage and block).
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
    usage: str
    module: str | None
    summary: str
    forms: tuple[str, ...] = (BLOCK,)
    cost: Cost = dataclasses.field(default=None)  # type: ignore[assignment]

    def __post_init__(self):
        want = kernel_name(self.a_dtype, self.b_dtype, self.acc_dtype, self.mr, self.nr,
                           self.kr, self.isa)
        if self.name != want:
            raise ValueError(f"kernel {self.name!r} breaks the naming grammar: its "
                             f"properties spell {want!r}")
        unknown = [f for f in self.features if f not in FEATURE_MATTR]
        if unknown:
            raise ValueError(f"kernel {self.name}: unknown target features {unknown}")
        if self.usage not in USAGES or any(f not in FORMS for f in self.forms):
            raise ValueError(f"kernel {self.name}: usage {self.usage!r} / forms {self.forms}")
        if self.module is None and self.forms:
            raise ValueError(f"kernel {self.name}: the reference has no forms to tensorize")
        if self.cost is None:
            object.__setattr__(self, "cost", _cost(self.usage, self.mr, self.nr, self.kr,
                                                   self.forms))

    @property
    def intrin(self) -> str | None:
        """The registered TensorIntrin name of the block form (the kernel name), None for
        the reference."""
        return None if self.module is None else self.name

    @property
    def one_row(self) -> bool:
        """A one-row (GEMV) kernel: mr = 1 and tensorized, for GEMMs of one row and the
        last rows of a longer GEMM only (the reference's 1x1 block is not one)."""
        return self.mr == 1 and self.module is not None

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


def _padded(depth: int, kr: int) -> int:
    return -(-depth // kr) * kr


@dataclasses.dataclass(frozen=True)
class Family:
    """The kernels of one instruction sequence (KleidiAI's per-family interface): the same
    operand types, instruction, ISA and nr; they differ only in rows (mr) and bytes of K
    (kr). Members with one kr pack B the same way, so a one-row member can finish the last
    rows of its multi-row sibling's GEMM on that GEMM's packed B.

    ``kernels``: the members, the main one first (the most rows, the deepest K).
    ``kernel_for(rows, depth)`` maps a GEMM's M and K to its member; ``tail_for(kernel)``
    is the member that runs a GEMM's last M % mr rows.
    """

    name: str
    kernels: tuple[Kernel, ...]

    def __post_init__(self):
        main = self.kernels[0]
        want = family_name(main.a_dtype, main.b_dtype, main.acc_dtype, main.isa)
        if self.name != want:
            raise ValueError(f"family {self.name!r} breaks the naming grammar: {want!r}")
        for k in self.kernels:
            same = ((k.a_dtype, k.b_dtype, k.acc_dtype, k.isa, k.usage, k.module, k.nr)
                    == (main.a_dtype, main.b_dtype, main.acc_dtype, main.isa, main.usage,
                        main.module, main.nr))
            if not same:
                raise ValueError(f"family {self.name}: {k.name} is another instruction "
                                 f"sequence than {main.name}")

    @property
    def main(self) -> Kernel:
        return self.kernels[0]

    @property
    def one_row(self) -> Kernel | None:
        """The member for GEMMs of one row, if the family has one."""
        return next((k for k in self.kernels if k.one_row), None)

    def kernel_for(self, rows: int | None = None, depth: int | None = None) -> Kernel:
        """The member for a GEMM of ``rows`` x ``depth`` (either None: unknown).

        One row takes the one-row member where there is one: a multi-row block would
        multiply padding rows. Any other GEMM takes the multi-row member that pads K the
        least, the larger kr on a tie (K = 24 is three 8-byte blocks, not two 16-byte ones
        of which a third is padding)."""
        if rows == 1 and self.one_row is not None:
            return self.one_row
        rows_kernels = [k for k in self.kernels if not k.one_row]
        if depth is None:
            return rows_kernels[0]
        return min(rows_kernels, key=lambda k: (_padded(depth, k.kr), -k.kr))

    def tail_for(self, kernel: Kernel) -> Kernel | None:
        """The one-row member that runs the last M % mr rows of a GEMM of ``kernel``'s
        (same kr, so it reads the same packed B), or None."""
        if kernel.one_row:
            return None
        return next((k for k in self.kernels if k.one_row and k.kr == kernel.kr), None)


def _ref(a: str, b: str, acc: str) -> Family:
    name = kernel_name(a, b, acc, 1, 1, 1, "ref")
    kernel = Kernel(name, 1, 1, 1, a, b, acc, "ref", (), (), "scalar", None,
                    "portable scalar loops, no tensorize (any target)", forms=())
    return Family(family_name(a, b, acc, "ref"), (kernel,))


def _with_indirect(forms: tuple[str, ...], mr: int) -> tuple[str, ...]:
    """A kernel with a DIRECT form also has the INDIRECT one (the same instructions, each
    row at its own pixel) when it has rows to place: a one-row kernel's single row is
    always where the affine window puts it."""
    return forms + (INDIRECT,) if DIRECT in forms and mr > 1 else forms


def _widening(dtype: str) -> Family:
    """The Armv8.0 widening kernels of one signedness (neon.py): smull (umull) + saddlp /
    sadalp (uaddlp / uadalp) + addp."""
    s, u = dtype == "int8", dtype == "uint8"
    assert s or u
    mull, addlp, adalp = ("smull", "saddlp", "sadalp") if s else ("umull", "uaddlp", "uadalp")
    # the int8 kernels also read A in place (the device tests cover the int8 convolutions)
    forms = (BLOCK, K_LOOP, DIRECT) if s else (BLOCK, K_LOOP)

    def kernel(mr, kr, summary):
        return Kernel(kernel_name(dtype, dtype, "int32", mr, 4, kr, "neon"), mr, 4, kr,
                      dtype, dtype, "int32", "neon", ("has_asimd",),
                      (mull, adalp if kr == 16 else addlp, "addp"), "widening", "neon",
                      summary, _with_indirect(forms, mr))

    # The block form multiplies the halves of a 16-byte row with smull/smull2; the whole-K
    # form works on 8-byte halves with smull alone, so smull2 is not listed.
    return Family(family_name(dtype, dtype, "int32", "neon"), (
        kernel(4, 16, f"{mull}/{mull}2 + {addlp}/{adalp} + addp (Armv8.0)"),
        # one row: for a GEMM of one row (select with rows = 1) and a GEMM's row tail
        kernel(1, 16, f"one row: {mull}/{mull}2 + {addlp}/{adalp} + addp (Armv8.0)"),
        # 8 bytes of K: for a GEMM whose K is 1-8 past a multiple of 16 (select with depth:
        # K = 24 is three blocks of 8, against two of 16 with 8 bytes of padding); its
        # block form widens one product per (i, j) with saddlp, the whole-K form sadalp
        kernel(4, 8, f"8 bytes of K: {mull} + {addlp}/{adalp} + addp (Armv8.0)"),
    ))


def _by_element(dtype: str) -> Family:
    """The Armv8.2 dot product by element (dot.py): one sdot (udot) per row of C."""
    mnemonic = "sdot" if dtype == "int8" else "udot"
    forms = (BLOCK, DIRECT) if dtype == "int8" else (BLOCK,)

    def kernel(mr, summary):
        return Kernel(kernel_name(dtype, dtype, "int32", mr, 4, 4, "dotprod"), mr, 4, 4,
                      dtype, dtype, "int32", "dotprod", ("has_dotprod",), (mnemonic,),
                      "by_element", "dot", summary, _with_indirect(forms, mr))

    return Family(family_name(dtype, dtype, "int32", "dotprod"), (
        kernel(4, f"{mnemonic} (by element)"),
        kernel(1, f"one row: {mnemonic} (by element)"),
    ))


def _mmla(a: str, b: str, acc: str, isa: str, kr: int, mnemonic: str) -> Family:
    """An Armv8.6 matrix multiply-accumulate (mmla.py): one instruction per 2 x 2 block."""
    feature = "has_bf16" if isa == "bf16" else "has_matmul_i8"
    # int8 x int8 reads A in place too (two zips interleave two input rows); bf16's A is
    # converted from float32 as it is packed, so it always packs
    forms = _with_indirect((BLOCK, DIRECT), 2) if (a, b) == ("int8", "int8") else (BLOCK,)
    kernel = Kernel(kernel_name(a, b, acc, 2, 2, kr, isa), 2, 2, kr, a, b, acc, isa,
                    (feature,), (mnemonic,), "matrix", "mmla", mnemonic, forms)
    return Family(family_name(a, b, acc, isa), (kernel,))


# ONE ordered table, from the bottom rung (portable reference) to the top (i8mm / bf16).
# ``select`` walks it from the top and takes the first family the target can run.
FAMILIES: tuple[Family, ...] = (
    _ref("int8", "int8", "int32"),
    _ref("uint8", "uint8", "int32"),
    _ref("uint8", "int8", "int32"),
    _ref("int8", "uint8", "int32"),
    _ref("bfloat16", "bfloat16", "float32"),
    _widening("int8"),
    _widening("uint8"),
    _by_element("int8"),
    _by_element("uint8"),
    _mmla("int8", "int8", "int32", "i8mm", 8, "smmla"),
    _mmla("uint8", "uint8", "int32", "i8mm", 8, "ummla"),
    _mmla("uint8", "int8", "int32", "i8mm", 8, "usmmla"),
    _mmla("bfloat16", "bfloat16", "float32", "bf16", 4, "bfmmla"),
)
# Every kernel of the table, family by family.
TABLE: tuple[Kernel, ...] = tuple(k for f in FAMILIES for k in f.kernels)
KERNELS: dict[str, Kernel] = {k.name: k for k in TABLE}
assert len(KERNELS) == len(TABLE), "kernel names must be unique"
_FAMILY_OF = {k.name: f for f in FAMILIES for k in f.kernels}
assert len({f.name for f in FAMILIES}) == len(FAMILIES), "family names must be unique"


def get(name: str) -> Kernel:
    """The kernel called ``name``."""
    try:
        return KERNELS[name]
    except KeyError:
        raise KeyError(f"no micro-kernel {name!r}; known: {', '.join(KERNELS)}") from None


def family_of(kernel: Kernel) -> Family:
    """The family ``kernel`` belongs to."""
    return _FAMILY_OF[kernel.name]


# --------------------------------------------------------------- targets
class MissingTargetFeature(ValueError):
    """A kernel was asked for on a target that lacks the instruction it is built on."""


def _target(target):
    """``target`` as a ``tvm.target.Target`` (a Target, or what its constructor takes: a
    JSON dict or target string; ISA level names are ``tvm_armq.targets.resolve``'s)."""
    import tvm

    return target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)


def target_has(target, feature: str) -> bool:
    """Whether ``target`` has TVM target feature ``feature`` (``has_dotprod``, ...).

    TVM 0.27 derives ``target.features`` from LLVM for has_asimd/has_dotprod/has_matmul_i8
    but has no ``has_bf16``; for that one an explicit ``+bf16``/``-bf16`` in ``mattr``
    decides, else LLVM is asked whether the target's cpu/attributes imply FEAT_BF16 (as
    ``+v8.6a`` or ``mcpu=neoverse-n2`` do).
    """
    target = _target(target)
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
    target = _target(target)
    missing = missing_features(kernel, target)
    if missing:
        need = ", ".join(f"{f} ({FEATURE_MATTR[f]})" for f in missing)
        best = select(target, kernel.a_dtype, kernel.b_dtype)
        raise MissingTargetFeature(
            f"kernel {kernel.name} ({kernel.summary}) needs target feature {need}, which "
            f"target {target} does not have; the best kernel for it is {best.name} "
            f"(kernels.select)")
    return kernel


def select_family(target, a_dtype, b_dtype, rows: int | None = None) -> Family:
    """The top family of ``FAMILIES`` for ``a_dtype`` x ``b_dtype`` whose features
    ``target`` has (the reference when no instruction fits). For a GEMM of one row
    (``rows`` = 1) the top family with a one-row member: a one-row kernel beats every
    multi-row one there, whose rows after the first would only multiply padding."""
    target = _target(target)
    a, b = str(a_dtype), str(b_dtype)
    fits = [f for f in reversed(FAMILIES) if (f.main.a_dtype, f.main.b_dtype) == (a, b)
            and not missing_features(f.main, target)]
    if not fits:
        pairs = sorted({(k.a_dtype, k.b_dtype) for k in TABLE})
        raise ValueError(f"no micro-kernel multiplies {a} by {b}; supported pairs: {pairs}")
    if rows == 1:
        return next((f for f in fits if f.one_row is not None), fits[0])
    return fits[0]


def select(target, a_dtype, b_dtype, rows: int | None = None,
           depth: int | None = None) -> Kernel:
    """The kernel for a GEMM of ``a_dtype`` x ``b_dtype`` on ``target``: the member of
    ``select_family`` for its ``rows`` (M) and ``depth`` (K), either None if unknown
    (``Family.kernel_for``). At i8mm a one-row int8 GEMM thus takes sdot's one-row
    kernel (smmla has none); a GEMM of more rows never takes a one-row kernel, which
    would reload each block of B once per row of A instead of once per mr rows."""
    return select_family(target, a_dtype, b_dtype, rows).kernel_for(rows, depth)
