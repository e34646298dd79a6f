"""The GEMM micro-kernel tensor intrinsics run exactly on the level that has their instruction.

For every kernel of ``intrinsics/kernels.py`` a small GEMM over packed A and B (K aligned to
the block, and K with a tail that packing zero-pads, as the GEMM schedules' packing stage
does) is tensorized with
``tvm.s_tir.Schedule.tensorize``, compiled for the LOWEST ISA level whose target has the
kernel's features, run on that level's device and compared exactly with NumPy (int8: exact
integer products; bf16: a NumPy model of BFMMLA's rounding). The emitted assembly must
contain the kernel's instruction in the kernel's own function. All kernels of a level are
functions of one IRModule: one compile, one upload, one session per level.

The selection table: each level gets its own kernel, and asking for a kernel on a target
that lacks its instruction is a clear ``MissingTargetFeature``, not an LLVM crash.
"""

from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest

from tvm_armq import export, targets
from tvm_armq.intrinsics import forms, kernels, registry
from tvm_armq.targets import LEVELS

pytestmark = pytest.mark.device


def lowest_level(kernel) -> str:
    """The most portable ISA level whose target has every feature ``kernel`` needs."""
    for name, lvl in LEVELS.items():
        if not kernels.missing_features(kernel, lvl.target()):
            return name
    raise AssertionError(f"no ISA level runs {kernel.name}")


KERNELS_AT = {name: [k for k in kernels.TABLE if lowest_level(k) == name] for name in LEVELS}
TENSORIZED = [k for k in kernels.TABLE if k.intrin is not None]
REFERENCES = [k for k in kernels.TABLE if k.intrin is None]


# ------------------------------------------------------------------ the GEMMs
def shapes(kernel) -> dict[str, tuple[int, int, int]]:
    """(M, N, K) per case: K a multiple of kr, and K with a tail of about half a block.
    A kernel with a whole-K form (``kernels.K_LOOP``) also gets "k_loop": that form
    over four K blocks, the last one a zero-padded tail."""
    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    cases = {"aligned": (2 * mr, 3 * nr, 3 * kr),
             "k_tail": (3 * mr, 2 * nr, 2 * kr + kr // 2 + 1)}
    if kernels.K_LOOP in kernel.forms:
        cases["k_loop"] = (2 * mr, 2 * nr, 3 * kr + kr // 2)
    return cases


def func_name(kernel, case: str) -> str:
    return f"{kernel.name}__{case}"


def gemm(kernel, m: int, n: int, k: int, k_inner_iters: bool = False):
    """C[M, N] = A[M, K] · B[N, K]^T over A and B packed in the kernel's layouts
    (A_packed[M/mr, K/kr, mr, kr], B_packed[N/nr, K/kr, nr, kr]): one block per (mo, no, ko).
    ``k_inner_iters`` declares the block's iterators in the order the whole-K intrinsic
    matches (mo, no, mi, ni, ko, ki; the loops stay mo, no, ko, mi, ni, ki), as the
    conv2d GEMM stage does.
    """
    from tvm.script import tirx as T

    mr, nr, kr = kernel.mr, kernel.nr, kernel.kr
    a_shape, b_shape = kernel.a_packed_shape(m, k), kernel.b_packed_shape(n, k)
    mo_, ko_, no_ = a_shape[0], a_shape[1], b_shape[0]
    a_dt, b_dt, c_dt = kernel.a_dtype, kernel.b_dtype, kernel.acc_dtype

    @T.prim_func(s_tir=True)
    def main(Ap: T.Buffer(a_shape, a_dt), Bp: T.Buffer(b_shape, b_dt),
             C: T.Buffer((m, n), c_dt)):
        T.func_attr({"tir.noalias": True})
        for mo, no, ko, mi, ni, ki in T.grid(mo_, no_, ko_, mr, nr, kr):
            with T.sblock("gemm"):
                if k_inner_iters:
                    vmo, vno, vmi, vni, vko, vki = T.axis.remap("SSSSRR",
                                                                [mo, no, mi, ni, ko, ki])
                else:
                    vmo, vno, vko, vmi, vni, vki = T.axis.remap("SSRSSR",
                                                                [mo, no, ko, mi, ni, ki])
                with T.init():
                    C[vmo * mr + vmi, vno * nr + vni] = T.Cast(c_dt, 0)
                C[vmo * mr + vmi, vno * nr + vni] = (
                    C[vmo * mr + vmi, vno * nr + vni]
                    + T.Cast(c_dt, Ap[vmo, vko, vmi, vki]) * T.Cast(c_dt, Bp[vno, vko, vni, vki]))

    return main


def pack(x: np.ndarray, rows: int, kr: int) -> np.ndarray:
    """[R, K] -> [R/rows, ceil(K/kr), rows, kr], the K tail zero-padded: what the GEMM
    schedules' packing stage hands the micro-kernel."""
    r, k = x.shape
    kp = -(-k // kr) * kr
    padded = np.zeros((r, kp), x.dtype)
    padded[:, :k] = x
    blocks = padded.reshape(r // rows, rows, kp // kr, kr).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(blocks)


def scheduled(kernel, case, m, n, k, target):
    """The GEMM with its (mr, nr, kr) block tensorized by ``kernel`` (reference: untouched);
    the "k_loop" case tensorizes the whole K loop with the kernel's whole-K form."""
    import tvm

    k_loop = case == "k_loop"
    sch = tvm.s_tir.Schedule(gemm(kernel, m, n, k, k_inner_iters=k_loop))
    if kernel.intrin is not None:
        block = sch.get_sblock("gemm")
        loops = sch.get_loops(block)  # mo, no, ko, mi, ni, ki
        sch.decompose_reduction(block, loops[2])
        if k_loop:
            registry.tensorize(sch, loops[2], kernel, target,
                              k_blocks=sch.get(loops[2]).extent.value)
        else:
            registry.tensorize(sch, loops[3], kernel, target)
    return sch.mod["main"]


class LevelBuild:
    """All kernels of one level: one IRModule, one compile, one upload, one session."""

    def __init__(self, level: str, devices, tmp_dir):
        import tvm

        target = LEVELS[level].target()
        funcs = {}
        for kernel in KERNELS_AT[level]:
            for case, (m, n, k) in shapes(kernel).items():
                name = func_name(kernel, case)
                funcs[name] = scheduled(kernel, case, m, n, k, target).with_attr(
                    "global_symbol", name)
        lib = tvm.compile(tvm.IRModule(funcs), target=target)
        self.asm = lib.mod.inspect_source("asm")
        path = export.export_aarch64(lib, tmp_dir / f"intrinsics_{level}.so")
        self.sess = devices.session(level)
        self.sess.upload(str(path))
        self.rmod = self.sess.load_module(path.name)
        self.dev = self.sess.cpu(0)

    def function_asm(self, name: str) -> str:
        """The assembly of the functions whose symbol mentions ``name``."""
        parts = re.split(r"\n(?=\t\.type\t)", self.asm)
        return "\n".join(p for p in parts if re.match(rf"\t\.type\t[^,\n]*{name}", p))

    def run(self, kernel, case: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        import tvm

        m, n = a.shape[0], b.shape[0]
        ap, bp = pack(a, kernel.mr, kernel.kr), pack(b, kernel.nr, kernel.kr)
        c = tvm.runtime.tensor(np.zeros((m, n), kernel.acc_dtype), self.dev)
        self.rmod[func_name(kernel, case)](tvm.runtime.tensor(ap, self.dev),
                                           tvm.runtime.tensor(bp, self.dev), c)
        return c.numpy()


@pytest.fixture(scope="module")
def level_build(devices, tmp_path_factory):
    built: dict[str, LevelBuild] = {}

    def get(level: str) -> LevelBuild:
        if level not in built:
            built[level] = LevelBuild(level, devices, tmp_path_factory.mktemp(level))
        return built[level]

    return get


# ------------------------------------------------------------------- operands
def _np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def int_operands(kernel, m, n, k, fill: str, seed: int = 0):
    """Random operands over the full range of their types, or every element at its type's
    extreme (int8: -128, uint8: 255) so that every product is the largest one."""
    rng = np.random.default_rng(seed)
    out = []
    for dtype, rows in ((kernel.a_dtype, m), (kernel.b_dtype, n)):
        info = np.iinfo(dtype)
        if fill == "extreme":
            value = info.min if info.min < 0 else info.max
            out.append(np.full((rows, k), value, dtype))
        else:
            out.append(rng.integers(info.min, info.max, (rows, k), dtype, endpoint=True))
    return out


def int_reference(a, b):
    exact = a.astype(np.int64) @ b.astype(np.int64).T
    assert np.abs(exact).max() < 2**31, "the test operands must not overflow int32"
    return exact.astype(np.int32)


# ---- BFMMLA's arithmetic (FPCR.EBF = 0, as Linux runs processes), modelled exactly:
# for each output element, for each pair (k, k+1) of a block in order:
#   acc = R(acc + R(R(a_k * b_k) + R(a_k+1 * b_k+1)))
# where R rounds to float32 with round-to-odd (an inexact result gets its last mantissa bit
# set; overflow goes to infinity) and flushes denormal results to zero; denormal inputs are
# flushed to zero as well. Python Fractions keep every intermediate exact before R.
_F32_MIN_NORMAL_EXP = -126
_F32_MAX_EXP = 127
_F32_MANTISSA = 23


def _round_odd_f32(x: Fraction) -> Fraction:
    if x == 0:
        return Fraction(0)
    sign, ax = (-1 if x < 0 else 1), abs(x)
    e = ax.numerator.bit_length() - ax.denominator.bit_length()
    if Fraction(2) ** e > ax:
        e -= 1  # now 2**e <= ax < 2**(e+1)
    if e < _F32_MIN_NORMAL_EXP:
        return Fraction(0)  # denormal result: flushed
    if e > _F32_MAX_EXP:
        return Fraction(sign) * Fraction(10**400)  # overflow: "infinity" (never in the test)
    ulp = Fraction(2) ** (e - _F32_MANTISSA)
    q, r = divmod(ax, ulp)
    q = int(q)
    if r:
        q |= 1
    return sign * q * ulp


def _ftz(x: Fraction) -> Fraction:
    return Fraction(0) if x and abs(x) < Fraction(2) ** _F32_MIN_NORMAL_EXP else x


def bfmmla_model(kernel, a, b) -> np.ndarray:
    """C = A · B^T as the tensorized GEMM computes it: C starts at 0 and each K block of kr
    (zero-padded) is one BFMMLA, whose two pairs are added in order."""
    m, k = a.shape
    n = b.shape[0]
    kp = -(-k // kernel.kr) * kernel.kr
    fa = [[_ftz(Fraction(float(v))) for v in row] + [Fraction(0)] * (kp - k) for row in a]
    fb = [[_ftz(Fraction(float(v))) for v in row] + [Fraction(0)] * (kp - k) for row in b]
    out = np.zeros((m, n), np.float32)
    for i in range(m):
        for j in range(n):
            acc = Fraction(0)
            for kk in range(0, kp, 2):
                p0 = _round_odd_f32(fa[i][kk] * fb[j][kk])
                p1 = _round_odd_f32(fa[i][kk + 1] * fb[j][kk + 1])
                acc = _round_odd_f32(acc + _round_odd_f32(p0 + p1))
            out[i, j] = float(acc)
    return out


def bf16_operands(kernel, m, n, k, fill: str, seed: int = 0):
    """bf16 operands: normal(0, 1) samples rounded to bfloat16 (round to nearest even, as
    ml_dtypes converts), or small integers (every product and sum exact)."""
    rng = np.random.default_rng(seed)
    bf16 = _np_dtype("bfloat16")
    if fill == "integers":
        return [rng.integers(-8, 8, (rows, k)).astype(np.float32).astype(bf16)
                for rows in (m, n)]
    return [rng.standard_normal((rows, k)).astype(np.float32).astype(bf16) for rows in (m, n)]


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("kernel", TENSORIZED + REFERENCES, ids=lambda k: k.name)
def test_kernel_is_exact_on_its_lowest_level(kernel, level_build):
    """Aligned K and K with a zero-padded tail, random and extreme operands, exact."""
    built = level_build(lowest_level(kernel))
    for case, (m, n, k) in shapes(kernel).items():
        if kernel.a_dtype == "bfloat16":
            fills = ("integers",) if kernel.intrin is None else ("normal", "integers")
            for seed, fill in enumerate(fills):
                a, b = bf16_operands(kernel, m, n, k, fill, seed)
                got = built.run(kernel, case, a, b)
                if fill == "integers":  # exact in any order and rounding
                    want = a.astype(np.float32) @ b.astype(np.float32).T
                else:
                    want = bfmmla_model(kernel, a, b)
                np.testing.assert_array_equal(got, want, err_msg=f"{case}, {fill}")
        else:
            for seed, fill in enumerate(("random", "extreme")):
                a, b = int_operands(kernel, m, n, k, fill, seed)
                np.testing.assert_array_equal(built.run(kernel, case, a, b),
                                              int_reference(a, b), err_msg=f"{case}, {fill}")


def test_all_minus_128_is_exact(level_build):
    """The int16 pair-sum trap: every product (-128) x (-128) = 16384, two of them 32768.
    Each signed int8 kernel is exact on it (the neon kernel widens before adding pairs)."""
    signed = [k for k in TENSORIZED if (k.a_dtype, k.b_dtype) == ("int8", "int8")]
    assert kernels.get(kernels.GEMM_S8S8S32_4X4X16_NEON) in signed
    for kernel in signed:
        built = level_build(lowest_level(kernel))
        for case in ("k_tail", "k_loop") if kernels.K_LOOP in kernel.forms else ("k_tail",):
            m, n, k = shapes(kernel)[case]
            a = np.full((m, k), -128, np.int8)
            b = np.full((n, k), -128, np.int8)
            got = built.run(kernel, case, a, b)
            assert (got == 16384 * k).all(), (kernel.name, case, got)


@pytest.mark.parametrize("kernel", TENSORIZED, ids=lambda k: k.name)
def test_assembly_has_the_instruction(kernel, level_build):
    """The kernel's own functions contain its instruction, in its form."""
    asm = level_build(lowest_level(kernel)).function_asm(func_name(kernel, "aligned"))
    assert asm, f"no assembly found for {kernel.name}"
    mnemonics = set(re.findall(r"^\t([a-z0-9]+)\t", asm, re.M))
    missing = [ins for ins in kernel.instructions if ins not in mnemonics]
    assert not missing, f"{kernel.name}: {missing} not in its assembly"
    main = kernel.instructions[0]
    if kernel.usage == "by_element" and kernel.one_row:
        # one row: the block's 4 bytes are loaded replicated (ld1r), then by vector
        assert re.search(r"\tld1r\t\{ v\d+\.4s \}", asm), kernel.name
        assert re.search(rf"\t{main}\tv\d+\.4s, v\d+\.16b, v\d+\.16b\n", asm), kernel.name
    elif kernel.usage == "by_element":
        assert re.search(rf"\t{main}\tv\d+\.4s, v\d+\.16b, v\d+\.4b\[\d\]", asm), kernel.name
    elif kernel.usage == "matrix":
        lanes = "8h" if kernel.a_dtype == "bfloat16" else "16b"
        assert re.search(rf"\t{main}\tv\d+\.4s, v\d+\.{lanes}, v\d+\.{lanes}\n", asm)


# ------------------------------------------------------------ the selection table
# Every (target, dtype pair, rows, depth) select is asked in the tests below and in the
# compiler: the levels and a non-Arm target, every pair of the table, a GEMM of one row and
# of many, and depths that do and do not favour a shallower kernel.
PAIRS = sorted({(k.a_dtype, k.b_dtype) for k in kernels.TABLE})
SELECT_TARGETS = ["neon", "dotprod", "i8mm", {"kind": "c"}]
SELECT_GEMMS = [(rows, depth) for rows in (None, 1, 2, 49) for depth in (None, 8, 24, 32, 1024)]


def _reached() -> set[str]:
    return {kernels.select(targets.resolve(t), a, b, rows=rows, depth=depth).name
            for t in SELECT_TARGETS for a, b in PAIRS for rows, depth in SELECT_GEMMS}


def test_every_kernel_of_the_table_is_selected_for_some_gemm():
    """No dead rows: each kernel of every family is what ``select`` gives some target,
    dtype pair, row count and depth (a row the lookup never reaches would be untested
    code)."""
    assert _reached() == set(kernels.KERNELS)


def test_families_group_one_instruction_sequence():
    """A family's members share types, instruction and nr; the tail of a multi-row member
    is the one-row member with its kr (the same packed B); the main member is first."""
    for family in kernels.FAMILIES:
        main = family.main
        assert family.kernels[0] is main and not main.one_row
        assert family.name == kernels.family_name(main.a_dtype, main.b_dtype,
                                                  main.acc_dtype, main.isa)
        for k in family.kernels:
            assert kernels.family_of(k) is family
            tail = family.tail_for(k)
            if tail is not None:
                assert tail.one_row and (tail.nr, tail.kr) == (k.nr, k.kr) and not k.one_row
    neon = kernels.get(kernels.GEMM_S8S8S32_4X4X16_NEON)
    assert kernels.family_of(neon).tail_for(neon).name == kernels.GEMM_S8S8S32_1X4X16_NEON
    eight = kernels.get(kernels.GEMM_S8S8S32_4X4X8_NEON)
    assert kernels.family_of(eight).tail_for(eight) is None  # no one-row 8-byte kernel
    smmla = kernels.get(kernels.GEMM_S8S8S32_2X2X8_I8MM)
    assert kernels.family_of(smmla).tail_for(smmla) is None


def test_forms_are_what_the_instruction_modules_implement():
    """A kernel's ``forms`` (data on the record) are among what its module's
    ``IMPLEMENTS`` builds; the reference has none."""
    for kernel in kernels.TABLE:
        if kernel.module is None:
            assert kernel.forms == ()
            continue
        assert kernels.BLOCK in kernel.forms
        have = registry.implementation(kernel).forms
        assert set(kernel.forms) <= set(have), (kernel.name, kernel.forms, have)
        if kernels.DIRECT in kernel.forms:
            assert kernel.cost.direct_operands > 0, kernel.name


def test_names_follow_the_grammar_and_are_the_intrinsic_names():
    from tvm.s_tir import TensorIntrin

    for kernel in kernels.TABLE:
        assert kernels.NAME_RE.match(kernel.name), kernel.name
        assert kernel.name == kernels.kernel_name(kernel.a_dtype, kernel.b_dtype,
                                                  kernel.acc_dtype, kernel.mr, kernel.nr,
                                                  kernel.kr, kernel.isa)
    for name in registry.register_all():
        assert TensorIntrin.get(name) is not None
        assert name == kernels.get(name).intrin
    assert kernels.TABLE[0].isa == "ref"  # the bottom rung answers for every target


def test_direct_read_forms_are_the_int8_kernels():
    """The direct-read intrinsic (A read in place, ``forms.desc_direct``) exists for the
    int8 x int8 kernels: by-element sdot, smull/sadalp (whose packed A block is 16
    consecutive bytes of a row anyway) and smmla (two zips interleave two input rows); not
    for the unsigned ones nor bfmmla (its A is converted as it is packed). It registers
    per (window, n_tiles) under its own name and rejects a run of A that is no multiple
    of kr (A is not padded). Its results on the device are checked by
    tests/test_conv2d_gemm.py (direct-read cases)."""
    from tvm.s_tir import TensorIntrin

    W = forms.DirectWindow
    direct = [k.name for k in kernels.TABLE if kernels.DIRECT in k.forms]
    assert sorted(direct) == sorted([kernels.GEMM_S8S8S32_4X4X4_DOTPROD,
                                     kernels.GEMM_S8S8S32_1X4X4_DOTPROD,
                                     kernels.GEMM_S8S8S32_4X4X16_NEON,
                                     kernels.GEMM_S8S8S32_4X4X8_NEON,
                                     kernels.GEMM_S8S8S32_1X4X16_NEON,
                                     kernels.GEMM_S8S8S32_2X2X8_I8MM]), direct
    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    conv = W(segment=48, segments=3, segment_stride=544, row_stride=16)  # 3x3, C = 16
    assert (conv.k, conv.stride, conv.extent(4)) == (144, 16, 3 * 16 + 2 * 544 + 48)
    assert W.pointwise(40).extent(4) == 160 and W.pointwise(40).tag == "k40"
    for window, n_tiles in ((W.pointwise(16), 1), (W.pointwise(40), 4), (W.pointwise(512), 2),
                            (conv, 1), (conv, 4), (W(56, 1, 0, 8), 2)):
        name = registry.register_direct(dot, window, n_tiles)
        assert name == forms.direct_name(dot, window, n_tiles) and TensorIntrin.get(name)
    assert forms.direct_name(dot, conv, 4).endswith("__direct_k48x3_s544_r16_n4")
    with pytest.raises(ValueError, match="multiple of kr"):
        registry.register_direct(dot, W.pointwise(18), 1)
    smmla = kernels.get(kernels.GEMM_S8S8S32_2X2X8_I8MM)
    assert TensorIntrin.get(registry.register_direct(smmla, conv, 8))
    with pytest.raises(ValueError, match="no direct form"):
        registry.register_direct(kernels.get(kernels.GEMM_U8U8S32_2X2X8_I8MM),
                                 W.pointwise(16), 1)


def test_indirect_form_names_and_refusals():
    """The INDIRECT form (rows of A at their own pixels, ``forms.DirectWindow.by_pixel``)
    belongs to the kernels with a DIRECT form and several rows; its name is a direct-read
    name ending in _p that parses back to (kernel, window, n_tiles); it has no desc and is
    never registered as a TensorIntrin (``indirect.py`` lowers it); marking a block for
    it needs a by-pixel window."""
    from tvm import s_tir

    from tvm_armq.intrinsics import indirect

    W = forms.DirectWindow
    by_pixel = [k.name for k in kernels.TABLE if kernels.INDIRECT in k.forms]
    assert sorted(by_pixel) == sorted([kernels.GEMM_S8S8S32_4X4X4_DOTPROD,
                                       kernels.GEMM_S8S8S32_4X4X16_NEON,
                                       kernels.GEMM_S8S8S32_4X4X8_NEON,
                                       kernels.GEMM_S8S8S32_2X2X8_I8MM]), by_pixel
    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    window = W.of_pixels(48, 3, 544)
    assert window.by_pixel and window.k == 144 and window.extent(1) == 2 * 544 + 48
    name = forms.direct_name(dot, window, 4)
    assert name.endswith("__direct_k48x3_s544_p_n4")
    assert registry.parse_direct_name(name) == (dot, window, 4)
    affine = W(48, 3, 544, 16)
    assert registry.parse_direct_name(forms.direct_name(dot, affine, 2)) == (dot, affine, 2)
    assert window.row_offsets(4, [0, 7, 9, 30]) == [0, 7, 9, 30]
    assert affine.row_offsets(4) == [0, 16, 32, 48]
    with pytest.raises(ValueError, match="needs 4 row offsets"):
        window.row_offsets(4)
    with pytest.raises(ValueError, match="no desc"):
        forms.desc_direct(dot, window, 1)
    with pytest.raises(ValueError, match="never registered"):
        registry.register_named(name)
    with pytest.raises(ValueError, match="not the name"):
        registry.parse_direct_name("gemm_s8s8s32_4x4x4_dotprod__k4")
    sch = s_tir.Schedule(forms.desc(dot))  # any func: the window is refused first
    with pytest.raises(ValueError, match="affine window is tensorized"):
        indirect.mark(sch, None, dot, affine, 1)


def test_indirect_lowering_replaces_the_marked_block():
    """``indirect.lower_func`` turns the marked block of a by-pixel GEMM into the kernel's
    instruction sequence: no mark and no scalar update block left, A bound as the whole
    flat input, the sdot calls in place; a func without marks comes back as it is. The
    lowering is in front of TVM's TIR pipelines once tvm_armq is imported (so tuning
    builds and model builds lower too), wrapped once however often it is installed."""
    from tvm.tirx import compilation_pipeline

    from tvm_armq import targets
    from tvm_armq.intrinsics import indirect
    from tvm_armq.schedules import gemm_compute, gemm_plan, gemm_schedule
    from tvm_armq.schedules.gemm_layout import Conv2DShape

    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    shape = Conv2DShape(1, 7, 7, 16, 8, 3, 3, padding=(1, 1, 1, 1))
    plan = gemm_plan.plan(shape, dot, parallel=False)
    assert plan.main.form == kernels.INDIRECT and plan.tail is not None  # 49 rows: 48 + 1
    func = gemm_compute.conv2d_gemm_func(plan, in_zp=1, out_zp=0, act_range=(-128, 127))
    scheduled = gemm_schedule.schedule_conv2d_gemm(func, plan, targets.resolve("dotprod"))
    text = scheduled.script()
    assert indirect.MARK in text and '"gemm_update"' in text and "A_packed" not in text
    lowered = indirect.lower_func(scheduled).script()
    assert indirect.MARK not in lowered and '"gemm_update"' not in lowered
    assert "llvm.aarch64.neon.sdot" in lowered
    assert "data_padded[0:1296]" in lowered  # the whole bordered 9 x 9 x 16 input, flat
    assert indirect.lower_func(func).same_as(func)
    indirect.install()
    for name in ("default", "s_tir"):
        assert hasattr(compilation_pipeline.PIPELINE_MAP[name], indirect._WRAPPED)


@pytest.mark.parametrize("level, a, b, want", [
    ("neon", "int8", "int8", kernels.GEMM_S8S8S32_4X4X16_NEON),
    ("dotprod", "int8", "int8", kernels.GEMM_S8S8S32_4X4X4_DOTPROD),
    ("i8mm", "int8", "int8", kernels.GEMM_S8S8S32_2X2X8_I8MM),
    ("neon", "uint8", "uint8", kernels.GEMM_U8U8S32_4X4X16_NEON),
    ("dotprod", "uint8", "uint8", kernels.GEMM_U8U8S32_4X4X4_DOTPROD),
    ("i8mm", "uint8", "uint8", kernels.GEMM_U8U8S32_2X2X8_I8MM),
    ("neon", "uint8", "int8", kernels.GEMM_U8S8S32_1X1X1_REF),
    ("dotprod", "uint8", "int8", kernels.GEMM_U8S8S32_1X1X1_REF),
    ("i8mm", "uint8", "int8", kernels.GEMM_U8S8S32_2X2X8_I8MM),
    ("i8mm", "int8", "uint8", kernels.GEMM_S8U8S32_1X1X1_REF),
    ("neon", "bfloat16", "bfloat16", kernels.GEMM_BF16BF16F32_1X1X1_REF),
    ("dotprod", "bfloat16", "bfloat16", kernels.GEMM_BF16BF16F32_1X1X1_REF),
    ("i8mm", "bfloat16", "bfloat16", kernels.GEMM_BF16BF16F32_2X2X4_BF16),
    ("cortex-a76", "int8", "int8", kernels.GEMM_S8S8S32_4X4X4_DOTPROD),
    ({"kind": "llvm", "mtriple": "x86_64-linux-gnu"}, "int8", "int8",
     kernels.GEMM_S8S8S32_1X1X1_REF),
])
def test_select_picks_the_best_kernel_the_target_has(level, a, b, want):
    level = targets.resolve(level)
    assert kernels.select(level, a, b).name == want
    for rows in (2, 3, 4, 49):  # only a GEMM of one row takes a one-row kernel
        assert kernels.select(level, a, b, rows=rows).name == want


def test_select_gives_neon_gemms_whose_k_is_8_past_16_the_8_byte_kernel():
    neon = targets.resolve("neon")
    for a in ("int8", "uint8"):
        sixteen, eight = (kernels.select(neon, a, a, depth=d) for d in (32, 24))
        assert (sixteen.kr, eight.kr) == (16, 8) and eight.mr == sixteen.mr == 4
        for depth, kr in ((8, 8), (16, 16), (40, 8), (48, 16), (72, 8), (27, 16), (1024, 16)):
            assert kernels.select(neon, a, a, depth=depth).kr == kr, (a, depth)
        assert kernels.select(neon, a, a).kr == 16  # K unknown: the 16-byte kernel
        assert kernels.select(neon, a, a, rows=1, depth=24).name == \
            kernels.select(neon, a, a, rows=1).name  # no one-row 8-byte twin
    for level in map(targets.resolve, ("dotprod", "i8mm")):  # no other depths there
        assert kernels.select(level, "int8", "int8", depth=24) == \
            kernels.select(level, "int8", "int8")


@pytest.mark.parametrize("level, a, want", [
    ("neon", "int8", kernels.GEMM_S8S8S32_1X4X16_NEON),
    ("neon", "uint8", kernels.GEMM_U8U8S32_1X4X16_NEON),
    ("dotprod", "int8", kernels.GEMM_S8S8S32_1X4X4_DOTPROD),
    ("dotprod", "uint8", kernels.GEMM_U8U8S32_1X4X4_DOTPROD),
    # i8mm: sdot's one row beats smmla's 2-row block, half of which would be padding
    ("i8mm", "int8", kernels.GEMM_S8S8S32_1X4X4_DOTPROD),
    ("i8mm", "uint8", kernels.GEMM_U8U8S32_1X4X4_DOTPROD),
])
def test_select_gives_a_gemm_of_one_row_the_one_row_kernel(level, a, want):
    level = targets.resolve(level)
    kernel = kernels.select(level, a, a, rows=1)
    assert kernel.name == want and kernel.mr == 1 and kernel.one_row
    # no one-row kernel for the pair: the multi-row one, whatever the rows
    assert kernels.select(level, "uint8", "int8", rows=1) == kernels.select(level, "uint8",
                                                                            "int8")
    assert kernels.select({"kind": "c"}, a, a, rows=1).isa == "ref"


def test_bf16_feature_without_explicit_mattr():
    """TVM 0.27 has no target.features.has_bf16: +bf16 in mattr, or LLVM's knowledge of
    the cpu, decides."""
    base = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    assert kernels.target_has({**base, "mcpu": "neoverse-n2"}, "has_bf16")
    assert kernels.target_has({**base, "mattr": ["+neon", "+bf16"]}, "has_bf16")
    assert not kernels.target_has({**base, "mattr": ["+v8.6a", "-bf16"]}, "has_bf16")
    assert not kernels.target_has(LEVELS["dotprod"].target(), "has_bf16")
    assert kernels.select({**base, "mcpu": "neoverse-n2"}, "bfloat16", "bfloat16").name == \
        kernels.GEMM_BF16BF16F32_2X2X4_BF16


@pytest.mark.parametrize("name, level, feature", [
    (kernels.GEMM_S8S8S32_2X2X8_I8MM, "dotprod", "has_matmul_i8"),
    (kernels.GEMM_U8S8S32_2X2X8_I8MM, "neon", "has_matmul_i8"),
    (kernels.GEMM_S8S8S32_4X4X4_DOTPROD, "neon", "has_dotprod"),
    (kernels.GEMM_BF16BF16F32_2X2X4_BF16, "dotprod", "has_bf16"),
])
def test_require_names_kernel_feature_and_target(name, level, feature):
    kernel = kernels.get(name)
    target = targets.resolve(level)
    with pytest.raises(kernels.MissingTargetFeature) as err:
        kernels.require(kernel, target)
    msg = str(err.value)
    assert name in msg and feature in msg and kernels.FEATURE_MATTR[feature] in msg
    assert str(target) in msg
    assert kernels.require(kernel, targets.resolve("i8mm")) is kernel


def test_tensorize_for_a_target_without_the_instruction_is_the_clear_error():
    """Not an LLVM crash at compile time: the error comes before the schedule changes."""
    import tvm

    kernel = kernels.get(kernels.GEMM_S8S8S32_2X2X8_I8MM)
    sch = tvm.s_tir.Schedule(gemm(kernel, *shapes(kernel)["aligned"]))
    block = sch.get_sblock("gemm")
    loops = sch.get_loops(block)
    sch.decompose_reduction(block, loops[2])
    with pytest.raises(kernels.MissingTargetFeature, match="has_matmul_i8"):
        registry.tensorize(sch, loops[3], kernel, LEVELS["neon"].target())


def test_register_named_reads_the_parameters_back_from_the_name():
    """A stored schedule names its intrinsics; ``register_named`` rebuilds each from its
    name alone (block form, whole-K form, both direct-read windows) and refuses others."""
    from tvm.s_tir import TensorIntrin

    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    neon = kernels.get(kernels.GEMM_S8S8S32_4X4X16_NEON)
    names = [dot.name, forms.k_loop_name(neon, 5),
             forms.direct_name(dot, forms.DirectWindow.pointwise(96), 3),
             forms.direct_name(dot, forms.DirectWindow(40, 5, 1200, 20), 2)]
    for name in names:
        assert registry.register_named(name) == name and TensorIntrin.get(name) is not None
    for bad in ("gemm_s8s8s32_4x4x4_dotprod__direct_k40_nX", "conv2d"):
        with pytest.raises(ValueError, match="not the name of a tvm_armq TensorIntrin"):
            registry.register_named(bad)


def test_registers_stay_under_the_stack_limit():
    """A micro-tile's registers are stack slots: one "global" buffer per tile, refused at
    TVM's 1 KiB limit, above which they would come from the runtime's workspace pool."""
    from tvm.script.ir_builder import IRBuilder
    from tvm.script.ir_builder import tirx as T

    with IRBuilder(), T.prim_func():
        accs = forms.registers(4, 64, "int32")  # 4 tiles of 4 x 16 int32: 256 bytes each
    assert len(accs) == 4 and not accs[0].same_as(accs[1])
    assert all(a.scope() == "global" and tuple(a.shape) == (64,) for a in accs)
    assert forms.STACK_ALLOCATION_LIMIT == 1024
    with pytest.raises(ValueError, match=r"256 int32 registers per micro-tile \(1024 bytes\)"):
        forms.registers(1, 256, "int32")
