"""Quantized BATCH_MATMUL (``schedules.batch_matmul``): attention's Q.K^T and P.V, both
operands int8 tensors made at run time, on the level's GEMM micro-kernel.

Three layers of evidence:

1. Host: the NumPy ``reference`` equals TFLite's ``BUILTIN_REF`` BATCH_MATMUL on single-op
   models (adj_x / adj_y, broadcast batch, odd sizes, zero points at both ends), and the
   plain definition (``schedule=False``), compiled for the host, equals the reference.
2. Device, the kernel alone, at every level: the scheduled func (both operands packed at
   run time, the zero-point sums, the fused requantization) on Q.K^T and P.V shapes with
   odd rows, columns and depths, K no multiple of kr, adjoints, broadcast batches, one-row
   products, extreme zero points and a multiplier sweep; every output equal to the
   reference and alive, the level's multiply instruction in the code, and the kernel the
   func names (``kernel_name``) the selection table's. A dotprod or i8mm kernel dies with
   SIGILL on the neon CPU.
3. Device, one level: a single-op model through ``compile_tflite`` equals TFLite.
"""

from __future__ import annotations

import signal
import subprocess
import textwrap

import numpy as np
import pytest
from armq_checks import assert_alive, assert_exact, assert_functions_use, tier

from tvm_armq import targets
from tvm_armq.intrinsics import kernels
from tvm_armq.schedules import batch_matmul as bm
from tvm_armq.targets import LEVELS

# the level's multiply-accumulate instruction, as the kernel's assembly must show it
MAC_INSTRUCTION = {"neon": "smull", "dotprod": "sdot", "i8mm": "smmla"}
# the output's spread in output units: far from the clamp, many distinct values
LIVE_SPREAD = 40.0


# ----------------------------------------------------------------------------- cases
def _data(rng, shape, zp: int, spread: int, extremes: bool = False) -> np.ndarray:
    """int8 values within ``spread`` of ``zp`` (clipped to the range); ``extremes``: most
    of them at -128 or 127, sums and products at their limits."""
    x = np.clip(zp + rng.integers(-spread, spread, shape, endpoint=True), -128, 127)
    if extremes:
        ends = rng.random(x.shape) < 0.8
        x[ends] = rng.choice(np.array([-128, 127]), int(ends.sum()))
    return x.astype(np.int8)


def _case(name, lhs, rhs, adj_x=False, adj_y=False, zps=(3, -5), spread=127,
          extremes=False, gain=1.0, seed=0):
    """(name, shape, params, lhs, rhs): the output scale chosen so that the exact
    products spread over about +-LIVE_SPREAD output units (times ``gain``: the multiplier
    sweep), a random output zero point near the middle."""
    rng = np.random.default_rng(seed)
    shape = bm.BatchMatmulShape(lhs, rhs, adj_x, adj_y)
    za, zb = zps
    a, b = _data(rng, lhs, za, spread, extremes), _data(rng, rhs, zb, spread, extremes)
    s_a, s_b = 0.02, 0.03
    acc = np.matmul(bm._operand(a.astype(np.int64), adj_x) - za,
                    bm._operand(b.astype(np.int64), adj_y) - zb)
    s_out = float(np.float32(s_a * s_b * max(acc.std(), 1.0) / (LIVE_SPREAD * gain)))
    out_zp = int(rng.integers(-20, 20))
    p = bm.batch_matmul_params((s_a, za), (s_b, zb), (s_out, out_zp))
    return name, shape, p, a, b


# (fast tier?, case) -- the fast tier: one case of each kind, at every level
CASES = [
    (True, lambda: _case("qk_bert", (1, 4, 32, 16), (1, 4, 16, 32), zps=(1, -1))),
    (True, lambda: _case("qk_adj_y_odd", (1, 2, 17, 18), (1, 2, 17, 18), adj_y=True,
                         zps=(-7, 12), seed=1)),
    (True, lambda: _case("pv_odd", (1, 3, 17, 17), (1, 3, 17, 18), zps=(-128, 6), seed=2)),
    (True, lambda: _case("adj_x_broadcast", (2, 1, 13, 9), (3, 13, 7), adj_x=True,
                         zps=(9, 0), seed=3)),
    (True, lambda: _case("one_row", (1, 2, 1, 20), (1, 2, 20, 33), zps=(0, 4), seed=4)),
    (True, lambda: _case("zp_extremes", (1, 2, 9, 21), (1, 2, 21, 11), zps=(-128, 127),
                         extremes=True, seed=5)),
    (False, lambda: _case("zp_extremes_swapped", (1, 2, 9, 21), (1, 2, 21, 11),
                          zps=(127, -128), extremes=True, seed=6)),
    (False, lambda: _case("adj_xy", (1, 3, 24, 19), (1, 3, 11, 24), adj_x=True, adj_y=True,
                          zps=(2, -3), seed=7)),
    (False, lambda: _case("pv_65", (1, 2, 65, 65), (1, 2, 65, 48), zps=(-128, -2), seed=8)),
    (False, lambda: _case("qk_65", (1, 2, 65, 48), (1, 2, 48, 65), zps=(4, 1), seed=9)),
    # ViT's attention (65 tokens, 4 heads of 16): Q.K^T's N = 65 cropped from whole
    # micro-tile columns at every level, its K of 16 one or a few K blocks
    (False, lambda: _case("vit_qk", (1, 4, 65, 16), (1, 4, 16, 65), zps=(6, -9), seed=14)),
    (False, lambda: _case("vit_pv", (1, 4, 65, 65), (1, 4, 65, 16), zps=(-128, 3),
                          seed=15)),
    (False, lambda: _case("rank2", (5, 40), (40, 6), zps=(-1, 2), seed=10)),
    (False, lambda: _case("broadcast_lhs", (1, 9, 16), (4, 16, 10), zps=(5, 5), seed=11)),
    (False, lambda: _case("vit_tiny_qk", (1, 3, 197, 64), (1, 3, 197, 64), adj_y=True,
                          zps=(-3, 2), seed=12)),
    (False, lambda: _case("vit_tiny_pv", (1, 3, 197, 197), (1, 3, 197, 64),
                          zps=(-128, 1), seed=13)),
] + [
    # the multiplier sweep: the operands' spread from the whole range down to +-2, so the
    # real multiplier goes from about 1e-3 to above 1 (a left shift)
    (False, lambda s=s, i=i: _case(f"multiplier_{i}", (1, 2, 16, 64), (1, 2, 64, 16),
                                   zps=(-2, 3), spread=s, seed=20 + i))
    for i, s in enumerate([127, 40, 8, 3, 2])
]


def _tflite_model(shape: bm.BatchMatmulShape, p: bm.BatchMatmulParams, scales) -> bytes:
    """A single-op BATCH_MATMUL .tflite of ``shape`` with ``p``'s zero points and the
    given (lhs, rhs, out) scales."""
    import tflite

    from tvm_armq.frontend.writer import single_op_model

    def options(b):
        tflite.BatchMatMulOptionsStart(b)
        tflite.BatchMatMulOptionsAddAdjX(b, shape.adj_x)
        tflite.BatchMatMulOptionsAddAdjY(b, shape.adj_y)
        return tflite.BatchMatMulOptionsEnd(b)

    s_a, s_b, s_out = scales
    tensors = [dict(shape=shape.lhs, dtype="int8", q=(s_a, p.lhs_zp)),
               dict(shape=shape.rhs, dtype="int8", q=(s_b, p.rhs_zp)),
               dict(shape=shape.out, dtype="int8", q=(s_out, p.out_zp))]
    return single_op_model(tflite.BuiltinOperator.BATCH_MATMUL, tensors, [0, 1], [2],
                           (tflite.BuiltinOptions.BatchMatMulOptions, options), version=4)


# ----------------------------------------------------------------------------- host
TFLITE_CASES = ["qk_bert", "qk_adj_y_odd", "pv_odd", "adj_x_broadcast", "zp_extremes",
                "adj_xy", "multiplier_4"]


def _by_name(name):
    return next(make() for _, make in CASES if make()[0] == name)


@pytest.mark.parametrize("name", TFLITE_CASES)
def test_reference_equals_tflite(name):
    from tvm_armq.frontend.model import TFLiteModel

    _, shape, p, a, b = _by_name(name)
    scales = _case_scales(shape, p, a, b)
    model = TFLiteModel.load(_tflite_model(shape, p, scales))
    want = model.reference_outputs([a, b])[0]
    assert_alive(want, name)
    np.testing.assert_array_equal(bm.reference(a, b, shape, p), want, err_msg=name)


def _case_scales(shape, p, a, b):
    """Scales that give ``p``'s multiplier as TFLite's Prepare computes it: the lhs and
    rhs scales of ``_case`` and the output scale it derived."""
    s_a, s_b = 0.02, 0.03
    for s_out in _out_scale_candidates(shape, p, a, b, s_a, s_b):
        if bm.batch_matmul_params((s_a, p.lhs_zp), (s_b, p.rhs_zp),
                                  (s_out, p.out_zp)).multiplier == p.multiplier:
            return s_a, s_b, s_out
    raise AssertionError("no output scale reproduces the case's multiplier")


def _out_scale_candidates(shape, p, a, b, s_a, s_b):
    acc = np.matmul(bm._operand(a.astype(np.int64), shape.adj_x) - p.lhs_zp,
                    bm._operand(b.astype(np.int64), shape.adj_y) - p.rhs_zp)
    for gain in (1.0, 0.5, 2.0):
        yield float(np.float32(s_a * s_b * max(acc.std(), 1.0) / (LIVE_SPREAD * gain)))


def test_definition_equals_reference_on_the_host():
    """``schedule=False`` is the readable definition: compiled for the host (its
    requantization lowered to 64-bit TIR there), it equals ``reference``."""
    import tvm

    for _, make in CASES[:6]:
        name, shape, p, a, b = make()
        f = bm.batch_matmul_func(shape, p, schedule=False)
        lib = tvm.compile(tvm.IRModule({"main": f}), target="llvm")
        out = tvm.runtime.tensor(np.zeros(shape.out, np.int8))
        lib["main"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.testing.assert_array_equal(out.numpy(), bm.reference(a, b, shape, p), err_msg=name)


def test_kernel_names_follow_the_selection_table():
    shape = bm.BatchMatmulShape((1, 4, 32, 16), (1, 4, 16, 32))
    names = {level: bm.kernel_name(shape, targets.resolve(level)) for level in LEVELS}
    assert names == {"neon": "gemm_s8s8s32_4x4x16_neon", "dotprod": "gemm_s8s8s32_4x4x4_dotprod",
                     "i8mm": "gemm_s8s8s32_2x2x8_i8mm"}
    one_row = bm.BatchMatmulShape((1, 2, 1, 20), (1, 2, 20, 33))
    assert bm.kernel_name(one_row, targets.resolve("i8mm")) == "gemm_s8s8s32_1x4x4_dotprod"
    # a portable target runs its baseline level's kernel; None is any aarch64 (neon)
    portable = targets.resolve(targets.target("portable"))
    assert bm.kernel_name(shape, portable) == names["neon"]
    assert bm.kernel_name(shape, None) == names["neon"]
    for level in LEVELS:
        k = kernels.select(targets.resolve(level), "int8", "int8", rows=32, depth=16)
        assert names[level] == k.name


@pytest.mark.parametrize("level", LEVELS)
def test_ragged_columns_are_cropped_from_whole_tiles(level):
    """N no multiple of nr: the epilogue writes whole micro-tile columns to a scratch
    (``OUTPUT_TILES``) and a copy crops it, so no requantization carries the last tile's
    column predicate; N a multiple of nr writes the output directly. A macro-tile row is
    whole int32x4 registers (at i8mm, N = 18: nine column blocks padded to ten)."""
    from tvm_armq.intrinsics.qmuls import NEON_INT32_LANES

    target = targets.resolve(level)
    _, ragged, p, *_ = _by_name("qk_adj_y_odd")  # N = 18
    _, whole, q, *_ = _by_name("qk_bert")  # N = 32
    for shape, params, crops in ((ragged, p, True), (whole, q, False)):
        lay = bm.packed_layout(shape, bm.kernel_for(shape, target))
        assert lay.crops == crops and lay.nb * lay.kernel.nr >= shape.cols
        assert lay.mb % lay.m_tiles == 0 and lay.nb % lay.n_tiles == 0
        assert lay.n_tiles * lay.kernel.nr % NEON_INT32_LANES == 0, (level, lay)
        text = bm.batch_matmul_func(shape, params, target=target).script()
        assert (f'T.sblock("{bm.OUTPUT_TILES}")' in text) == crops, (level, shape)



def test_every_level_computes_its_kernels_register_tile():
    """``REGISTER_TILE``: each row is some level's (every row reachable), and a product
    of several macro tiles each way computes exactly that tile, with M and N padded to
    whole macro tiles (ViT-Tiny's Q.K^T: 197 rows and columns)."""
    shape = bm.BatchMatmulShape((1, 3, 197, 64), (1, 3, 64, 197))
    usages = set()
    for level in LEVELS:
        lay = bm.packed_layout(shape, bm.kernel_for(shape, targets.resolve(level)))
        usages.add(lay.kernel.usage)
        assert (lay.m_tiles, lay.n_tiles) == bm.REGISTER_TILE[lay.kernel.usage], level
        assert lay.mb % lay.m_tiles == 0 and lay.nb % lay.n_tiles == 0, (level, lay)
        assert (lay.mb - lay.m_tiles) * lay.kernel.mr < shape.rows <= lay.mb * lay.kernel.mr
    assert usages == set(bm.REGISTER_TILE)
    # a product of one micro-tile row computes one, not a padded macro tile
    one_row = bm.BatchMatmulShape((1, 2, 1, 20), (1, 2, 20, 33))
    lay = bm.packed_layout(one_row, bm.kernel_for(one_row, targets.resolve("dotprod")))
    assert lay.m_tiles == lay.mb == 1

@pytest.mark.parametrize("zps", [(3, -5), (0, 4), (9, 0), (0, 0)])
def test_the_tile_starts_at_the_zero_point_terms(zps):
    """The scheduled GEMM's accumulator starts at the zero-point terms (the sums of the
    operand whose partner's zero point is not 0, and K za zb) and the epilogue
    requantizes the tile alone."""
    import re

    from tvm_armq.intrinsics.qmuls import REQUANT_NARROW_OP

    _, shape, _, a, b = _case("qk_bert", (1, 4, 32, 16), (1, 4, 16, 32), zps=zps)
    p = bm.batch_matmul_params((0.02, zps[0]), (0.03, zps[1]), (0.5, 1))
    text = bm.batch_matmul_func(shape, p, target=targets.resolve("dotprod")).script()
    (start,) = re.findall(r"gemm\[[^\]]*\] = (.*)", text)
    assert ("A_sum" in start) == (zps[1] != 0) and ("B_sum" in start) == (zps[0] != 0)
    (requant,) = re.findall(REQUANT_NARROW_OP + r"\((.*?),", text)
    assert requant.startswith("gemm[") and "_sum" not in requant, requant


# ----------------------------------------------------------------------------- device
@pytest.mark.device
@pytest.mark.parametrize("fast", [tier(True, id="fast", fast=True),
                                  tier(False, id="rest", fast=False)])
def test_kernel_equals_reference_on_the_device(run_funcs, level, fast, tmp_path):
    cases = [make() for is_fast, make in CASES if is_fast == fast]
    target = targets.resolve(level)
    funcs, calls = {}, []
    for name, shape, p, a, b in cases:
        funcs[name] = bm.batch_matmul_func(shape, p, target=target)
        calls.append((name, [a, b], shape.out, "int8"))
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "bmm.so")
    for (name, shape, p, a, b), got in zip(cases, outs):
        want = bm.reference(a, b, shape, p)
        assert_alive(want, f"{name} at {level}")
        np.testing.assert_array_equal(got, want, err_msg=f"{name} at {level}")
    # every func of more than one row runs on the level's multiply instruction
    multi = [name for name, shape, *_ in cases if shape.rows > 1]
    assert_functions_use(asm, multi, [MAC_INSTRUCTION[level]], f"batch_matmul at {level}")


@pytest.mark.device
@pytest.mark.parametrize("lvl", ["dotprod", "i8mm"])
def test_a_kernel_the_level_lacks_dies_with_sigill(lvl, tmp_path):
    """The dotprod and i8mm kernels compiled for their level die with SIGILL on the neon
    CPU (a Cortex-A72) and run on their own."""
    import tvm

    from tvm_armq import device, export

    name, shape, p, a, b = CASES[0][1]()
    f = bm.batch_matmul_func(shape, p, target=targets.resolve(lvl))
    lib = export.export_aarch64(tvm.compile(tvm.IRModule({"bmm": f.with_attr(
        "global_symbol", "bmm")}), target=targets.resolve(lvl)), tmp_path / "bmm.so")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    want = bm.reference(a, b, shape, p)
    script = textwrap.dedent(f"""
        import numpy as np, tvm
        f = tvm.runtime.load_module({str(lib)!r})["bmm"]
        a, b = np.load({str(tmp_path / 'a.npy')!r}), np.load({str(tmp_path / 'b.npy')!r})
        out = tvm.runtime.tensor(np.zeros({shape.out!r}, np.int8))
        f(tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.save({str(tmp_path / 'out.npy')!r}, out.numpy())
    """)
    device.provision()
    for cpu in ("neon", lvl):
        res = subprocess.run(device.guest_command(cpu, "-c", script),
                             env=device.guest_env(cpu), capture_output=True, text=True,
                             timeout=300)
        if cpu == "neon":
            assert res.returncode == -signal.SIGILL, (res.returncode, res.stderr[-2000:])
        else:
            assert res.returncode == 0, res.stderr[-2000:]
            np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


@pytest.mark.device
@pytest.mark.parametrize("name", [tier("pv_odd", id="pv_odd", fast=True),
                                  tier("adj_x_broadcast", id="adj_x_broadcast", fast=False)])
def test_single_op_model_equals_tflite(compiled_models, name):
    """The pass lowers the op to this kernel (no float fallback) and the compiled model
    equals TFLite's reference kernels."""
    from tvm_armq.report import Lowered

    _, shape, p, a, b = _by_name(name)
    model = _tflite_model(shape, p, _case_scales(shape, p, a, b))
    level = "dotprod"
    report, runs = compiled_models(level, name, model, seeds=(0,))
    assert [r.op for r in report if isinstance(r, Lowered)] == ["batch_matmul"], report
    for got, want in runs:
        assert_exact(got, want, f"{name} at {level}")
