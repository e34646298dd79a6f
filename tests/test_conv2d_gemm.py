"""conv2d as packed GEMM + fused requantization, bit-exact on the device at every ISA level.

The cases sweep the geometry the GEMM must get right (K below, at and above the
block; M and N remainders; 1x1/3x3/5x5 kernels; strides; dilation; asymmetric
padding) and the quantization (input zero points across the range, per-channel
scales, fused ReLU-style clamps). All cases of a level are compiled into one
module, uploaded once, and each is compared exactly with ``schedules.reference``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from armq_checks import assert_alive, assert_functions_use

from tvm_armq import build
from tvm_armq.tflite_layers import read_layer
from tvm_armq.intrinsics import kernels, requant
from tvm_armq.schedules import conv2d_gemm as cg
from tvm_armq.schedules import reference as ref

pytestmark = pytest.mark.device

REFERENCE = kernels.select({"kind": "c"}, "int8", "int8")  # no instruction: scalar loops


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: cg.Conv2DShape
    in_zp: int
    out_zp: int
    act_range: tuple[int, int] = (-128, 127)
    per_tensor: bool = False  # one scale for every output channel (else one per channel)


S = cg.Conv2DShape
CASES = [
    Case("k_below_block", S(1, 5, 5, 1, 4, 1, 1), in_zp=0, out_zp=0),  # K = 1 < kr
    Case("k_at_block", S(1, 4, 4, 4, 8, 1, 1), in_zp=-128, out_zp=5),  # K = kr, pointwise
    Case("k_above_block", S(1, 6, 6, 5, 8, 1, 1), in_zp=127, out_zp=-7),  # K = 5
    Case("m_n_remainders", S(1, 5, 3, 8, 11, 1, 1), in_zp=3, out_zp=0),  # M = 15, N = 11
    Case("3x3_same", S(1, 8, 8, 3, 16, 3, 3, padding=(1, 1, 1, 1)), in_zp=-5, out_zp=-128,
         act_range=(-128, 127)),
    Case("3x3_stride2_relu", S(2, 9, 9, 6, 7, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1)),
         in_zp=12, out_zp=-128, act_range=(-128, 127)),
    Case("3x3_dilation2", S(1, 9, 10, 4, 5, 3, 3, dilation=(2, 2), padding=(2, 2, 2, 2)),
         in_zp=-1, out_zp=3),
    Case("5x5_asym_pad_relu6", S(1, 7, 6, 3, 9, 5, 5, padding=(2, 1, 2, 3)), in_zp=-20,
         out_zp=-128, act_range=(-128, 40)),
    Case("1x7_strided_w", S(1, 4, 15, 3, 6, 1, 7, strides=(1, 2), padding=(0, 3, 0, 3)),
         in_zp=40, out_zp=1),
    Case("groups2_3x3", S(1, 6, 6, 8, 10, 3, 3, padding=(1, 1, 1, 1), groups=2), in_zp=-9,
         out_zp=2),
    Case("groups4_1x1", S(1, 5, 4, 12, 8, 1, 1, groups=4), in_zp=100, out_zp=-3),
    Case("dense_rows3", S.dense(3, 70, 13), in_zp=-128, out_zp=0),
    # Few channels (row-blocked K, read from flat image rows; cg % kr != 0 at every level):
    # an RGB stem; one channel, no padding, batch 2 (the last row's slack); a row of exactly
    # one copy vector; rows dilated; a wide row of 7 vectors and a partial one.
    Case("rgb_stem_s2", S(1, 17, 17, 3, 8, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1)),
         in_zp=-1, out_zp=4),
    Case("gray_valid_batch2", S(2, 7, 9, 1, 6, 3, 3), in_zp=77, out_zp=-9),
    Case("gray_row_one_vector", S(1, 5, 16, 1, 4, 3, 3, padding=(1, 1, 1, 1)), in_zp=-128,
         out_zp=0),
    Case("rgb_dilated_rows", S(1, 9, 8, 3, 5, 3, 3, dilation=(2, 1), padding=(2, 1, 2, 1)),
         in_zp=25, out_zp=-2),
    Case("6ch_5x3_wide_row", S(1, 6, 21, 6, 12, 5, 3, padding=(2, 1, 2, 1)), in_zp=-60,
         out_zp=11, act_range=(-128, 90)),
    # 7x7 kernels: a ResNet-style RGB stem (stride 2, SAME: row-blocked K), and 8 channels
    # (K = 392 packed densely, whole K blocks at every level)
    Case("7x7_rgb_stem_s2", S(1, 15, 14, 3, 8, 7, 7, strides=(2, 2), padding=(3, 3, 3, 3)),
         in_zp=-11, out_zp=6),
    Case("7x7_same_c8", S(1, 9, 8, 8, 12, 7, 7, padding=(3, 3, 3, 3)), in_zp=50, out_zp=-20),
    # one scale for the whole layer (per-tensor quantization)
    Case("per_tensor_3x3", S(1, 6, 7, 8, 12, 3, 3, padding=(1, 1, 1, 1)), in_zp=-30,
         out_zp=10, per_tensor=True),
    Case("per_tensor_dense", S.dense(5, 40, 24), in_zp=0, out_zp=-128, per_tensor=True),
]
# Macro tiles of several micro-tiles, K unrolling: the knobs must not change any result.
KNOBS = {"reference": cg.GemmKnobs(), "best": cg.GemmKnobs(m_tiles=2, n_tiles=2, k_unroll=2)}


def _tile(kernel):
    return (kernel.mr, kernel.nr, kernel.kr)


def _case_data(case: Case, seed: int, kernel, zero_shifts: bool = False):
    """(args of the func, expected output). ``zero_shifts``: every other channel gets the
    scale 1/2 exactly (multiplier 2**30, shift 0)."""
    s, rng = case.shape, np.random.default_rng(seed)
    data = rng.integers(-128, 127, (s.batch, s.in_h, s.in_w, s.in_c), endpoint=True,
                        dtype=np.int8)
    weight = rng.integers(-127, 127, (s.kh, s.kw, s.group_in_c, s.out_c), endpoint=True,
                          dtype=np.int8)
    bias = rng.integers(-20000, 20000, s.out_c).astype(np.int32)
    # Scales chosen so outputs spread over the int8 range, not saturate.
    acc = ref.conv2d_nhwc(data, weight, bias, in_zp=case.in_zp, strides=s.strides,
                          dilation=s.dilation, padding=s.padding, groups=s.groups)
    spread = np.maximum(np.abs(acc).reshape(-1, s.out_c).max(axis=0), 1)
    if case.per_tensor:  # the layer's scale, repeated for the epilogue's per-channel inputs
        scales = np.full(s.out_c, rng.uniform(60, 160) / spread.max())
    else:
        scales = rng.uniform(60, 160, s.out_c) / spread
    mult, shift = requant.quantize_multipliers(scales)
    if zero_shifts:
        mult[::2], shift[::2] = 1 << 30, 0
    lo, hi = case.act_range
    expected = ref.requantize(acc, mult, shift, case.out_zp, lo, hi, "int8")
    args = [data, cg.pack_weights(weight, _tile(kernel), s.groups),
            cg.fold_bias(weight, bias, case.in_zp),
            mult.astype(np.int32), shift.astype(np.int32)]
    return args, expected


def _funcs(cases, kernel, target, knobs) -> dict:
    """name -> the scheduled conv2d_gemm of each case."""
    funcs = {}
    for c in cases:
        f = cg.conv2d_gemm_func(c.shape, _tile(kernel), in_zp=c.in_zp, out_zp=c.out_zp,
                                act_range=c.act_range)
        funcs[c.name] = cg.schedule_conv2d_gemm(f, kernel, target, knobs)
    return funcs


def _out_shape(shape: cg.Conv2DShape) -> tuple[int, int, int]:
    """The conv2d_gemm output buffer: [pixels, groups, channels per group]."""
    return (shape.gemm_m, shape.groups, shape.gemm_n)


def test_reference_matches_itself_on_known_values():
    """A hand-checkable conv: the NumPy reference is the yardstick, so check it first."""
    data = np.array([[[[1], [2]], [[3], [4]]]], np.int8)  # 1x2x2x1
    weight = np.ones((2, 2, 1, 1), np.int8)
    acc = ref.conv2d_nhwc(data, weight, [10], in_zp=1)
    assert acc.tolist() == [[[[10 + 0 + 1 + 2 + 3]]]]
    padded = ref.conv2d_nhwc(data, weight, [0], in_zp=1, padding=(1, 1, 0, 0))
    assert padded[0, 0, 0, 0] == 0 and padded[0, 1, 1, 0] == 6  # zp padding adds nothing


def test_packing_layout():
    w = np.arange(1 * 2 * 3 * 5, dtype=np.int8).reshape(1, 2, 3, 5)  # K = 6, N = 5
    packed = cg.pack_weights(w, (4, 4, 4))[0]  # (mr, nr, kr); one group
    assert packed.shape == (2, 2, 4, 4)
    flat = w.reshape(6, 5)
    for n in range(5):
        for k in range(6):
            assert packed[n // 4, k // 4, n % 4, k % 4] == flat[k, n]
    assert not packed[1, :, 1:, :].any() and not packed[:, 1, :, 2:].any()  # zero padding
    grouped = cg.pack_weights(w[:, :, :, :4], (4, 2, 4), groups=2)  # 2 groups of 2 outputs
    assert grouped.shape == (2, 1, 2, 2, 4)
    assert grouped[1, 0, 0, 1, 2] == w.reshape(6, 5)[2, 3]  # group 1, its output 1 = n 3


def test_row_blocked_packing_layout():
    """Few channels: each kernel row's kw * cg bytes start a new K block (module docstring)."""
    w = np.arange(3 * 2 * 3 * 5, dtype=np.int8).reshape(3, 2, 3, 5)  # rows of 6 bytes
    s = cg.Conv2DShape(1, 6, 6, 3, 5, 3, 2)
    assert s.kernel_row_k(4, "int8") == 8 and s.packed_k(4, "int8") == 24  # dense: 18 -> 20
    assert s.kernel_row_k(16, "uint8") == 16 and s.packed_k(16, "uint8") == 48
    assert cg.Conv2DShape(1, 6, 6, 4, 5, 3, 2).kernel_row_k(4, "int8") is None  # whole blocks
    assert cg.Conv2DShape(1, 6, 6, 6, 4, 3, 2, groups=2).kernel_row_k(4, "int8") is None
    assert s.kernel_row_k(4, "float32") is None and s.packed_k(4, "float32") == 20
    packed = cg.pack_weights(w, (4, 4, 4))[0]
    assert packed.shape == (2, 6, 4, 4)
    for ky in range(3):
        for r in range(8):
            k = ky * 8 + r
            want = w[ky].reshape(6, 5)[r] if r < 6 else np.zeros(5, np.int8)
            for n in range(5):
                assert packed[n // 4, k // 4, n % 4, k % 4] == want[n]


@pytest.mark.parametrize("path", ["reference", "best"])
def test_conv2d_gemm_on_device(run_funcs, level, path, tmp_path, report):
    """Every case, bit-exact, with the scalar reference kernel and with the best micro-kernel
    of the level (neon: smull+sadalp, dotprod: sdot, i8mm: smmla), whose instruction the
    compiled module must contain."""
    target = build.resolve_target(level)
    kernel = REFERENCE if path == "reference" else kernels.select(target, "int8", "int8")
    data = [_case_data(case, i, kernel) for i, case in enumerate(CASES)]
    asm, outs = run_funcs(level, _funcs(CASES, kernel, target, KNOBS[path]),
                          [(case.name, args, _out_shape(case.shape), np.int8)
                           for case, (args, _) in zip(CASES, data)], tmp_path / "conv.so")
    if path == "best":
        assert_functions_use(asm, [case.name for case in CASES], kernel.instructions,
                             f"{kernel.name} at {level}")
    else:  # the scalar reference: plain C loops, no instruction of its own to look for
        assert kernel.instructions == (), kernel.name
    for case, (_, expected), out in zip(CASES, data, outs):
        got = out.reshape(expected.shape)
        assert len(np.unique(expected)) > 8, "the case must exercise the output range"
        np.testing.assert_array_equal(got, expected, err_msg=f"{case.name} at {level}")
    report(f"conv2d_gemm {kernel.name:28s} {level:8s} {len(CASES)} cases bit-exact")


def test_best_kernel_per_level():
    names = {lvl: kernels.select(build.resolve_target(lvl), "int8", "int8").name
             for lvl in ("neon", "dotprod", "i8mm")}
    assert names == {"neon": "gemm_s8s8s32_4x4x16_neon",
                     "dotprod": "gemm_s8s8s32_4x4x4_dotprod",
                     "i8mm": "gemm_s8s8s32_2x2x8_i8mm"}


# --------------------------------------------------------------------- TFLite itself
TFLITE_MODELS = ("conv2d_1x1", "conv2d_3x3", "conv2d_3x3_s2", "conv2d_3x3_d2",
                 "conv2d_grouped", "fully_connected")
FC_SEEDS = range(300)  # inputs of the FULLY_CONNECTED model: its rounding rule shows


def _tflite_case(path):
    """Shape, arguments builder and quantization of a zoo model's layer, from the file."""
    layer = read_layer(path)
    if layer.op == "FULLY_CONNECTED":
        rows, k = layer.input_shape
        shape = S.dense(rows, k, layer.weight.shape[0])
    else:
        _, h, w, c = layer.input_shape
        _, kh, kw, _ = layer.weight.shape
        shape = S(1, h, w, c, layer.weight.shape[0], kh, kw, strides=layer.strides,
                  dilation=layer.dilation, padding=layer.padding, groups=layer.groups)
    mult, shift = requant.quantize_multipliers(layer.real_scales())
    return layer, shape, mult.astype(np.int32), shift.astype(np.int32)


def test_conv2d_matches_tflite(run_funcs, level, zoo_model, tmp_path, report):
    """The zoo's CONV_2D (1x1, 3x3, strided, dilated, grouped) and FULLY_CONNECTED models
    through the best kernel of the level equal TFLite's reference kernels, bit for bit."""
    from tvm_armq.tflite_model import TFLiteModel

    target = build.resolve_target(level)
    kernel = kernels.select(target, "int8", "int8")
    funcs, runs = {}, []
    for name in TFLITE_MODELS:
        path = zoo_model(name)
        layer, shape, mult, shift = _tflite_case(path)
        # TFLite's FULLY_CONNECTED rounds its requantization once, CONV_2D twice
        # (integrate.requant_rounding); 16 FC outputs need many inputs before the two
        # rules part (4 of 4800 outputs over FC_SEEDS, test_integrate's rounding test)
        dense = layer.op == "FULLY_CONNECTED"
        f = cg.conv2d_gemm_func(shape, _tile(kernel), in_zp=layer.in_zp, out_zp=layer.out_zp,
                                act_range=layer.act_range,
                                rounding="single" if dense else "double")
        funcs[name] = cg.schedule_conv2d_gemm(f, kernel, target, KNOBS["best"])
        w = layer.weight_hwio()
        params = [cg.pack_weights(w, _tile(kernel), shape.groups),
                  cg.fold_bias(w, layer.bias, layer.in_zp), mult, shift]
        model = TFLiteModel.load(path)
        for seed in FC_SEEDS if dense else range(2):
            x = model.random_inputs(seed=seed)
            (y,) = model.reference_outputs(x)
            runs.append((name, seed, [x[0].reshape(shape.batch, shape.in_h, shape.in_w,
                                                   shape.in_c)] + params, shape, y))
    _, outs = run_funcs(level, funcs, [(name, args, _out_shape(shape), np.int8)
                                       for name, _, args, shape, _ in runs],
                        tmp_path / "tflite_convs.so")
    for (name, seed, _, _, y), out in zip(runs, outs):
        if seed < 2:  # 16 FC outputs of one input vary too little for the share test
            assert_alive(y, f"{name} seed {seed}")  # the zoo layer's output really varies
        np.testing.assert_array_equal(out.reshape(y.shape), y,
                                      err_msg=f"{name} seed {seed} at {level}")
    report(f"conv2d_gemm vs TFLite {kernel.name:28s} {level:8s} "
           f"{', '.join(TFLITE_MODELS)} bit-exact")


# ------------------------------------------------------------- the design space
# (7 output columns: no whole micro-tiles along a row, so dotprod packs A too; the design
# space of a direct-read layer is checked by test_direct_read_on_device)
SAMPLED_CASE = Case("sampled_3x3", S(1, 8, 7, 8, 16, 3, 3, padding=(1, 1, 1, 1)), in_zp=-3,
                    out_zp=4)
SEEDS = range(1, 7)


def _check_sampled(run_funcs, level, case, kernel, data_seed, lib, check_trace=None) -> int:
    """Sample the design space of ``case`` (built with ``kernel``) once per seed of SEEDS,
    each candidate's outputs merged as ``tuning.schedule_from_database`` merges them;
    ``check_trace(trace)`` sees each trace. The traces must differ, and every candidate
    must run the kernel's instructions and be bit-exact. Returns the distinct schedules."""
    from tvm import s_tir

    target = build.resolve_target(level)
    func = cg.conv2d_gemm_func(case.shape, _tile(kernel), kernel=kernel, in_zp=case.in_zp,
                               out_zp=case.out_zp, act_range=case.act_range)
    assert func.attrs[cg.ATTR_OP] == "conv2d_gemm" and func.attrs[cg.ATTR_KERNEL] == kernel.name
    funcs, decisions = {}, set()
    for seed in SEEDS:
        sch = s_tir.Schedule(func, seed=seed)
        cg.sample_conv2d_gemm(sch, kernel, target)
        if check_trace is not None:
            check_trace(sch.trace)
        decisions.add(tuple(tuple(int(x) for x in d) for d in sch.trace.decisions.values()))
        funcs[f"seed{seed}"] = cg.merge_outputs(sch.mod["main"])
    assert len(decisions) > 1, f"{len(SEEDS)} seeds sampled one and the same schedule"
    args, expected = _case_data(case, data_seed, kernel)
    asm, outs = run_funcs(level, funcs, [(name, args, _out_shape(case.shape), np.int8)
                                         for name in funcs], lib)
    assert_functions_use(asm, funcs, kernel.instructions, f"{case.name} at {level}")
    for name, out in zip(funcs, outs):
        np.testing.assert_array_equal(out.reshape(expected.shape), expected,
                                      err_msg=f"{name} at {level}")
    return len(decisions)


def test_sample_conv2d_gemm_on_device(run_funcs, level, tmp_path, report):
    """``sample_conv2d_gemm`` with several seeds: the traces differ (the knobs are sampled),
    each candidate is tensorized with the level's kernel, and every one is bit-exact."""
    kernel = kernels.select(build.resolve_target(level), "int8", "int8")

    def check_trace(trace):
        kinds = [inst.kind.name for inst in trace.insts]
        # m_tiles, n_tiles and k_unroll; no k_unroll where the kernel takes the whole K loop
        knobs = 2 if kernels.has_k_loop(kernel) else 3
        assert kinds.count("SamplePerfectTile") == knobs and "Tensorize" in kinds, kinds

    distinct = _check_sampled(run_funcs, level, SAMPLED_CASE, kernel, 0,
                              tmp_path / "sampled.so", check_trace)
    report(f"conv2d_gemm sampled {kernel.name:28s} {level:8s} {distinct} distinct "
           f"schedules of {len(SEEDS)} seeds bit-exact")


def test_sample_conv2d_gemm_with_row_tail_on_device(run_funcs, level, tmp_path, report):
    """The design space of a 7x7 pointwise layer: the main GEMM's knobs are sampled, its row
    tail (neon, dotprod) keeps its default knobs, and each candidate, its outputs merged
    as ``tuning.schedule_from_database`` merges them, is bit-exact."""
    target = build.resolve_target(level)
    c = Case("sampled_7x7_tail", S(1, 7, 7, 48, 24, 1, 1), in_zp=9, out_zp=-6)
    kernel = kernels.select(target, "int8", "int8", rows=c.shape.gemm_m, depth=c.shape.gemm_k)
    assert (cg.tail_kernel(c.shape, kernel) is not None) == (level != "i8mm")
    distinct = _check_sampled(run_funcs, level, c, kernel, 1, tmp_path / "sampled_tail.so")
    report(f"conv2d_gemm sampled with row tail {kernel.name:28s} {level:8s} "
           f"{distinct} distinct schedules of {len(SEEDS)} seeds bit-exact")


def test_default_knobs_are_honoured_and_fit_the_registers():
    """default_knobs picks tile counts that divide the block counts (so the schedule uses
    them as given), whole int32x4 output rows, and a K loop that fits the register file;
    neon's whole-K kernel keeps one micro-tile per K loop."""
    shapes = [S(1, 112, 112, 16, 96, 1, 1), S(1, 14, 14, 512, 512, 1, 1),
              S(1, 7, 7, 160, 960, 1, 1), S(1, 224, 224, 3, 32, 3, 3, strides=(2, 2)),
              S.dense(1, 1280, 1000), CASES[3].shape]
    for level in ("neon", "dotprod", "i8mm"):
        kernel = kernels.select(build.resolve_target(level), "int8", "int8")
        for shape in shapes:
            knobs = cg.default_knobs(shape, kernel, parallel=False)
            mb, nb = -(-shape.gemm_m // kernel.mr), -(-shape.gemm_n // kernel.nr)
            assert mb % knobs.m_tiles == 0 and nb % knobs.n_tiles == 0, (level, shape, knobs)
            acc, operands = cg._registers(kernel, knobs.m_tiles, knobs.n_tiles)
            assert acc + operands <= cg.NEON_REGISTERS - cg.SCRATCH_REGISTERS, (level, knobs)
            assert not knobs.parallel
            if shape.gemm_n % cg.EPILOGUE_LANES == 0:
                assert knobs.n_tiles * kernel.nr % cg.EPILOGUE_LANES == 0, (level, knobs)
    assert cg.default_knobs(CASES[0].shape, REFERENCE) == cg.GemmKnobs()


def test_default_knobs_follow_the_measured_rules():
    """neon's whole-K kernel: one micro-tile per macro tile once K spans two blocks (short
    K loops are unrolled, and several tiles' partial sums spill); sdot by element on a
    packed layer (M = 35: no direct read, and 3 rows left over are padded, not a tail)
    takes the 16-channel row from LONG_K_BLOCKS K blocks, the 8-channel one below;
    one-row GEMMs fill ONE_ROW_CHANNELS, as a layer's row tail does."""
    neon = kernels.select(build.resolve_target("neon"), "int8", "int8")
    dot = kernels.select(build.resolve_target("dotprod"), "int8", "int8")
    for k in (24, 32, 512):
        knobs = cg.default_knobs(S(1, 7, 7, k, 1024, 1, 1), neon)
        assert (knobs.m_tiles, knobs.n_tiles) == (1, 1), (k, knobs)
    long_k = S(1, 5, 7, 4 * cg.LONG_K_BLOCKS, 960, 1, 1)
    short_k = dataclasses.replace(long_k, in_c=4 * cg.LONG_K_BLOCKS - 4)
    assert cg.tail_kernel(long_k, dot) is None and not cg.reads_input_directly(long_k, dot)
    assert cg.default_knobs(long_k, dot).n_tiles * dot.nr == cg.STORE_CHANNELS
    assert cg.default_knobs(short_k, dot).n_tiles * dot.nr < cg.STORE_CHANNELS
    one_row = kernels.select(build.resolve_target("dotprod"), "int8", "int8", rows=1)
    logits = S.dense(1, 1024, 1000)
    assert cg.default_knobs(logits, one_row).n_tiles * one_row.nr == cg.ONE_ROW_CHANNELS


# Pointwise layers whose GEMM reads the input in place at dotprod (built with direct=True
# whatever K, so small K exercises the intrinsic too): K in whole 16-byte row loads (16,
# 48, 144, 512) and with a tail of 1-3 K steps (40, 28, 72), N remainders, several
# images; M always a multiple of mr.
DIRECT_CASES = [
    Case("direct_k16", S(1, 4, 6, 16, 20, 1, 1), in_zp=-128, out_zp=3),
    Case("direct_k48_n_rem", S(1, 2, 6, 48, 11, 1, 1), in_zp=7, out_zp=-5),
    Case("direct_k144", S(1, 4, 4, 144, 36, 1, 1), in_zp=-3, out_zp=0),
    Case("direct_k512", S(1, 2, 2, 512, 64, 1, 1), in_zp=127, out_zp=-128,
         act_range=(-128, 60)),
    Case("direct_k40_tail", S(2, 2, 3, 40, 24, 1, 1), in_zp=-20, out_zp=1),
    Case("direct_k28_tail", S(1, 4, 3, 28, 8, 1, 1), in_zp=50, out_zp=-1),
    Case("direct_k72_tail", S(1, 2, 4, 72, 12, 1, 1), in_zp=-7, out_zp=2),
    Case("direct_dense", S.dense(8, 96, 16), in_zp=-128, out_zp=0),
    # kh x kw convolutions read in place (``direct_window``: one run of kw * C input bytes
    # per kernel row, micro-tiles along output rows): padded (the bordered copy) and not,
    # strided, rows dilated, runs with a K tail (20, 24 bytes), one kernel row (1x7),
    # 1x1 with stride 2, several images, a 7x7 kernel (seven runs of 112 bytes).
    Case("direct_3x3_c16_same", S(1, 8, 8, 16, 20, 3, 3, padding=(1, 1, 1, 1)), in_zp=-9,
         out_zp=4),
    Case("direct_3x3_s2_c32", S(1, 9, 16, 32, 8, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1)),
         in_zp=100, out_zp=-100, act_range=(-100, 127)),
    Case("direct_5x5_c4_valid_b2", S(2, 9, 12, 4, 12, 5, 5), in_zp=-128, out_zp=0),
    Case("direct_1x7_c8", S(1, 4, 12, 8, 16, 1, 7, padding=(0, 3, 0, 3)), in_zp=3, out_zp=7),
    Case("direct_3x3_rows_dilated", S(1, 10, 8, 16, 8, 3, 3, dilation=(2, 1),
                                     padding=(2, 1, 2, 1)), in_zp=-40, out_zp=-3),
    Case("direct_1x1_s2_c24", S(1, 8, 16, 24, 8, 1, 1, strides=(2, 2)), in_zp=60, out_zp=9),
    Case("direct_1x1_s2_c32", S(1, 8, 16, 32, 12, 1, 1, strides=(2, 2)), in_zp=-60,
         out_zp=2),
    Case("direct_7x7_c16_same", S(1, 7, 8, 16, 8, 7, 7, padding=(3, 3, 3, 3)), in_zp=-2,
         out_zp=-9),
]
# neon's kernel takes K in blocks of 16 (kr): the runs of A must be two or more of them,
# which 9 cases are; dotprod's (kr = 4) takes every case.
DIRECT_LEVELS = {"neon": 9, "dotprod": len(DIRECT_CASES)}
DIRECT_KNOBS = {"default": None, "tiles": cg.GemmKnobs(m_tiles=2, n_tiles=2, k_unroll=2)}


@pytest.mark.parametrize("level", list(DIRECT_LEVELS))
def test_direct_read_on_device(run_funcs, level, tmp_path, report):
    """At neon (smull/sadalp) and dotprod (sdot by element), a GEMM that reads its input in
    place (no A_packed stage; pointwise and kh x kw layers) is bit-exact, with default
    knobs and with 2 x 2 tiles; from DIRECT_MIN_K, conv2d_gemm_func builds that form by
    itself; a candidate of the tuner's design space (sample_conv2d_gemm) is tensorized and
    bit-exact too."""
    from tvm import s_tir, te

    target = build.resolve_target(level)
    kernel = kernels.select(target, "int8", "int8")
    cases = [c for c in DIRECT_CASES if cg.can_read_input_directly(c.shape, kernel)]
    assert len(cases) == DIRECT_LEVELS[level], [c.name for c in cases]
    funcs = {}
    for c in cases:
        quant = dict(in_zp=c.in_zp, out_zp=c.out_zp, act_range=c.act_range)
        if cg.reads_input_directly(c.shape, kernel):
            f = cg.conv2d_gemm_func(c.shape, _tile(kernel), kernel=kernel, **quant)
        else:
            f = te.create_prim_func(list(cg.conv2d_gemm_te(c.shape, _tile(kernel),
                                                           direct=True, **quant)))
        assert "A_packed" not in f.script(), c.name
        for tag, knobs in DIRECT_KNOBS.items():
            knobs = knobs or cg.default_knobs(c.shape, kernel)
            funcs[f"{c.name}_{tag}"] = cg.schedule_conv2d_gemm(f, kernel, target, knobs)
        # the design space of a direct-read layer: m_tiles sampled, n_tiles fixed
        sch = s_tir.Schedule(f, seed=3)
        cg.sample_conv2d_gemm(sch, kernel, target)
        kinds = [inst.kind.name for inst in sch.trace.insts]
        assert kinds.count("SamplePerfectTile") == 1 and "Tensorize" in kinds, kinds
        funcs[f"{c.name}_sampled"] = sch.mod["main"]
    tags = list(DIRECT_KNOBS) + ["sampled"]
    data = [_case_data(c, 100 + i, kernel) for i, c in enumerate(cases)]
    calls = [(f"{c.name}_{tag}", args, _out_shape(c.shape), np.int8)
             for c, (args, _) in zip(cases, data) for tag in tags]
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "direct.so")
    assert_functions_use(asm, funcs, kernel.instructions, f"direct read at {level}")
    expected = [exp for _, exp in data for _ in tags]
    for (name, *_), out, exp in zip(calls, outs, expected):
        np.testing.assert_array_equal(out.reshape(exp.shape), exp, err_msg=f"{name} at {level}")
    report(f"conv2d_gemm direct read {kernel.name:28s} {level:8s} {len(cases)} "
           f"cases x {len(tags)} schedules bit-exact")


def test_direct_read_only_where_it_applies():
    """Direct read needs a kernel with a direct form (sdot by element, smull/sadalp; not
    smmla, whose A block interleaves two rows), K >= DIRECT_MIN_K and an ungrouped layer:
    pointwise with M % mr == 0 (M before a row tail) and K % kr == 0, or kh x kw with
    C % kr == 0, columns not dilated and out_w % mr == 0; every other layer and kernel
    keeps the A pack."""
    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    assert cg.reads_input_directly(S(1, 14, 14, 512, 512, 1, 1), dot)
    assert cg.reads_input_directly(S(1, 14, 14, cg.DIRECT_MIN_K, 8, 1, 1), dot)
    # below DIRECT_MIN_K: in place where A is read by few column passes (16 channels each)
    passes = cg.STORE_CHANNELS * (cg.DIRECT_MAX_PASSES + 1)
    small_k = S(1, 14, 14, cg.DIRECT_MIN_K - dot.kr, passes, 1, 1)
    assert cg.can_read_input_directly(small_k, dot) and not cg.reads_input_directly(small_k, dot)
    few_passes = dataclasses.replace(small_k, out_c=passes - cg.STORE_CHANNELS)
    assert cg.reads_input_directly(few_passes, dot)
    # the widening kernel (neon) reads in place from two K blocks, over any number of passes
    neon = kernels.get(kernels.GEMM_S8S8S32_4X4X16_NEON)
    assert cg.reads_input_directly(dataclasses.replace(small_k, in_c=2 * neon.kr), neon)
    packed = cg.conv2d_gemm_func(small_k, _tile(dot), kernel=dot, in_zp=0, out_zp=0,
                                 act_range=(-128, 127))
    assert "A_packed" in packed.script()
    assert not cg.reads_input_directly(S(1, 5, 7, 160, 960, 1, 1), dot)  # M = 35: padded
    # M = 49: 48 rows read in place, the row tail too (by the one-row twin)
    assert cg.gemm_rows(S(1, 7, 7, 160, 960, 1, 1), dot) == 48
    assert cg.reads_input_directly(S(1, 7, 7, 160, 960, 1, 1), dot)
    assert not cg.reads_input_directly(S(1, 4, 4, 6, 8, 1, 1), dot)  # K = 6
    # a 3x3 conv below DIRECT_MIN_K packs, however few its passes (K = 36, N = 8: one)
    assert not cg.reads_input_directly(S(1, 4, 4, 4, 8, 3, 3, padding=(1, 1, 1, 1)), dot)
    conv = S(1, 8, 8, 16, 8, 3, 3, padding=(1, 1, 1, 1))
    assert cg.reads_input_directly(conv, dot)
    assert cg.direct_window(conv, _tile(dot)) == kernels.DirectWindow(48, 3, 10 * 16, 16)
    assert not cg.reads_input_directly(dataclasses.replace(conv, in_w=7), dot)  # out_w 7
    assert not cg.reads_input_directly(dataclasses.replace(conv, in_c=18), dot)  # C % kr
    assert not cg.reads_input_directly(dataclasses.replace(conv, dilation=(1, 2)), dot)
    assert not cg.reads_input_directly(dataclasses.replace(conv, in_c=32, groups=2), dot)
    assert not cg.reads_input_directly(S(1, 4, 4, 8, 8, 1, 1, groups=2), dot)
    neon = kernels.select(build.resolve_target("neon"), "int8", "int8")
    assert cg.reads_input_directly(S(1, 14, 14, 512, 512, 1, 1), neon)
    assert not cg.reads_input_directly(S(1, 14, 14, 72, 16, 1, 1), neon)  # K % 16
    assert cg.reads_input_directly(conv, neon)  # runs of 3 x 16 bytes: whole blocks of 16
    assert not cg.reads_input_directly(dataclasses.replace(conv, in_c=24), neon)  # C % 16
    i8mm = kernels.select(build.resolve_target("i8mm"), "int8", "int8")
    assert not cg.reads_input_directly(S(1, 14, 14, 512, 512, 1, 1), i8mm)
    assert not cg.reads_input_directly(S(1, 14, 14, 512, 512, 1, 1), REFERENCE)


def _check_selected(run_funcs, level, cases, knobs_by_tag, seed, lib, select):
    """Build every case with the kernel ``select(case)`` picks for it, scheduled with each of
    ``knobs_by_tag`` (None: the default knobs), run them in one module (``lib``, a path of
    its own) and compare each output exactly. Returns (names of the cases read in place, the kernels used)."""
    target = build.resolve_target(level)
    funcs, direct, data, used = {}, [], [], []
    for i, c in enumerate(cases):
        kernel = select(c)
        used.append(kernel)
        f = cg.conv2d_gemm_func(c.shape, _tile(kernel), kernel=kernel, in_zp=c.in_zp,
                                out_zp=c.out_zp, act_range=c.act_range)
        if cg.reads_input_directly(c.shape, kernel):
            direct.append(c.name)
        for tag, knobs in knobs_by_tag.items():
            knobs = knobs or cg.default_knobs(c.shape, kernel)
            funcs[f"{c.name}_{tag}"] = cg.schedule_conv2d_gemm(f, kernel, target, knobs)
        data.append(_case_data(c, seed + i, kernel))
    calls = [(f"{c.name}_{tag}", args, _out_shape(c.shape), np.int8)
             for c, (args, _) in zip(cases, data) for tag in knobs_by_tag]
    asm, outs = run_funcs(level, funcs, calls, lib)
    for c, kernel in zip(cases, used):
        assert_functions_use(asm, [f"{c.name}_{tag}" for tag in knobs_by_tag],
                             kernel.instructions, f"{kernel.name} at {level}")
    expected = [exp for _, exp in data for _ in knobs_by_tag]
    for (name, *_), out, exp in zip(calls, outs, expected):
        np.testing.assert_array_equal(out.reshape(exp.shape), exp, err_msg=f"{name} at {level}")
    return direct, used


# GEMMs of one row (M = 1: a dense layer on one vector, a conv whose output is one pixel)
# take the level's one-row kernel (kernels.select with rows = 1). Cases: read in place
# with whole 16-byte row loads and with a K tail (dotprod: K = 200 is 50 steps of 4), the
# widest K loop (30 column blocks: 10 tiles at dotprod, 5 at neon), K below DIRECT_MIN_K
# over more than DIRECT_MAX_PASSES column passes and K no multiple of kr (packed A), a
# 1x1 conv on a 1x1 image, a 3x3 VALID conv whose output is one pixel (kernel rows read
# in place), a clamp.
ONE_ROW_CASES = [
    Case("one_row_k256_n120", S.dense(1, 256, 120), in_zp=-128, out_zp=3),
    Case("one_row_k200_n40_tail", S.dense(1, 200, 40), in_zp=17, out_zp=-9),
    Case("one_row_k36_packed", S.dense(1, 36, 210), in_zp=-3, out_zp=0),
    Case("one_row_k70_n13", S.dense(1, 70, 13), in_zp=127, out_zp=-128,
         act_range=(-128, 50)),
    Case("one_row_1x1_on_1x1", S(1, 1, 1, 96, 24, 1, 1), in_zp=5, out_zp=2),
    Case("one_row_3x3_valid_c16", S(1, 3, 3, 16, 12, 3, 3), in_zp=-60, out_zp=7),
]
ONE_ROW_KNOBS = {"default": None, "tiles": cg.GemmKnobs(n_tiles=2, k_unroll=2)}


def test_one_row_gemm_on_device(run_funcs, level, tmp_path, report):
    """A GEMM of one row runs the level's one-row kernel (neon: 1x4x16 smull/sadalp;
    dotprod and i8mm: 1x4x4 sdot by element, which beats smmla's half-empty 2-row blocks),
    bit-exact with default knobs (reading the input in place where it can) and with other
    tiles; a multi-row GEMM never gets it."""
    target = build.resolve_target(level)
    kernel = kernels.select(target, "int8", "int8", rows=1)
    assert kernels.is_one_row(kernel) and kernel.mr == 1, kernel.name
    assert kernel.name == {"neon": kernels.GEMM_S8S8S32_1X4X16_NEON}.get(
        level, kernels.GEMM_S8S8S32_1X4X4_DOTPROD)
    assert not kernels.is_one_row(kernels.select(target, "int8", "int8", rows=2))
    assert all(c.shape.gemm_m == 1 for c in ONE_ROW_CASES)
    direct, _ = _check_selected(run_funcs, level, ONE_ROW_CASES, ONE_ROW_KNOBS, 300,
                                tmp_path / "one_row.so", lambda c: kernel)
    # neon reads in place only where K is whole 16-byte blocks (K = 256, 96, 3x3x16)
    assert len(direct) == (3 if level == "neon" else 4), direct
    report(f"conv2d_gemm one row {kernel.name:28s} {level:8s} {len(ONE_ROW_CASES)} cases x "
           f"{len(ONE_ROW_KNOBS)} schedules bit-exact ({len(direct)} read in place)")


# neon GEMMs whose K is 1-8 past a multiple of 16 take the 8-byte kernel (kernels.select
# with the depth): packed (K = 40 with M and N remainders), one K block (K = 8), read in
# place (pointwise K = 24 and 72, a 3x3 conv over 8 channels: runs of 24 bytes).
DEPTH_CASES = [
    Case("k24_pointwise", S(1, 4, 6, 24, 20, 1, 1), in_zp=-128, out_zp=5),
    Case("k40_dense_rem", S.dense(6, 40, 13), in_zp=33, out_zp=-2),
    Case("k8_one_block", S(1, 3, 4, 8, 8, 1, 1), in_zp=-7, out_zp=0),
    Case("k72_direct", S(1, 2, 4, 72, 12, 1, 1), in_zp=90, out_zp=-30, act_range=(-100, 127)),
    Case("3x3_c8_direct", S(1, 6, 8, 8, 12, 3, 3, padding=(1, 1, 1, 1)), in_zp=-1, out_zp=4),
]
DEPTH_KNOBS = {"default": None, "tiles": cg.GemmKnobs(m_tiles=2, n_tiles=2, k_unroll=2)}


def test_neon_8_byte_kernel_on_device(run_funcs, tmp_path, report):
    """neon's 4x4x8 smull/sadalp kernel, which select gives GEMMs whose K is 1-8 past a
    multiple of 16: block, whole-K and direct-read forms, bit-exact."""
    target = build.resolve_target("neon")

    def select(c):
        return kernels.select(target, "int8", "int8", rows=c.shape.gemm_m, depth=c.shape.gemm_k)

    direct, used = _check_selected(run_funcs, "neon", DEPTH_CASES, DEPTH_KNOBS, 500,
                                   tmp_path / "neon_k8.so", select)
    names = [k.name for k in used]
    assert names == [kernels.GEMM_S8S8S32_4X4X8_NEON] * len(DEPTH_CASES), names
    assert direct == ["k24_pointwise", "k72_direct", "3x3_c8_direct"], direct
    report(f"conv2d_gemm {names[0]:28s} neon     {len(DEPTH_CASES)} cases x "
           f"{len(DEPTH_KNOBS)} schedules bit-exact ({len(direct)} read in place)")


# GEMMs whose last M % mr rows run through the kernel's one-row twin (cg.tail_kernel: a
# pointwise layer or dense, at most half a micro-tile left over): a 7x7 layer read in
# place (K = 64 at dotprod, main rows and tail), one packed (K = 32), two tail rows
# (dense M = 6, batch 2 of 5x5: M = 50), one tail row with a K remainder (dotprod:
# K = 20 is 5 blocks of 4; neon pads 20 to 32), and M = 7, whose 3 rows are padded.
TAIL_CASES = [
    Case("tail_7x7_k64_direct", S(1, 7, 7, 64, 40, 1, 1), in_zp=-128, out_zp=3),
    Case("tail_7x7_k32_packed", S(1, 7, 7, 32, 24, 1, 1), in_zp=17, out_zp=-9,
         act_range=(-128, 60)),
    Case("tail_dense_rows6", S.dense(6, 48, 20), in_zp=5, out_zp=0),
    Case("tail_batch2_rows50", S(2, 5, 5, 16, 12, 1, 1), in_zp=-40, out_zp=-128),
    Case("tail_rows9_k20", S(1, 3, 3, 20, 8, 1, 1), in_zp=100, out_zp=1),
    Case("no_tail_rows7", S.dense(7, 64, 16), in_zp=-2, out_zp=2),
]
TAIL_KNOBS = {"default": None, "tiles": cg.GemmKnobs(m_tiles=2, n_tiles=2, k_unroll=2)}


def test_row_tail_on_device(run_funcs, level, tmp_path, report):
    """The last M % mr rows of a GEMM through the one-row twin (neon 1x4x16, dotprod
    1x4x4, reading the same packed B), with their own epilogue writing the last rows of
    the one output: bit-exact with default and other knobs of the main GEMM. smmla has no
    one-row twin, so at i8mm the rows are padded as before."""
    target = build.resolve_target(level)

    def select(c):
        return kernels.select(target, "int8", "int8", rows=c.shape.gemm_m, depth=c.shape.gemm_k)

    tails = [c.name for c in TAIL_CASES if cg.tail_kernel(c.shape, select(c)) is not None]
    want = {"neon": [c.name for c in TAIL_CASES[:4]],
            "dotprod": [c.name for c in TAIL_CASES[:5]], "i8mm": []}[level]
    assert tails == want, tails
    for c in TAIL_CASES:
        twin = cg.tail_kernel(c.shape, select(c))
        assert twin is None or (twin.mr, twin.nr, twin.kr) == (1, select(c).nr, select(c).kr)
    _, used = _check_selected(run_funcs, level, TAIL_CASES, TAIL_KNOBS, 700,
                              tmp_path / "row_tail.so", select)
    report(f"conv2d_gemm row tails {used[0].name:28s} {level:8s} {len(TAIL_CASES)} cases x "
           f"{len(TAIL_KNOBS)} schedules bit-exact ({len(tails)} with a tail)")


def test_merge_outputs_joins_the_tail_into_one_output():
    """A func with a row tail has outputs ``output`` and ``output_tail`` while it is
    scheduled and one ``output`` of all M rows after (``output_tail`` a view of its last
    rows); a func without a tail is left as it is."""
    kernel = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    quant = dict(in_zp=0, out_zp=0, act_range=(-128, 127))
    shape = S(1, 7, 7, 32, 8, 1, 1)
    f = cg.conv2d_gemm_func(shape, _tile(kernel), kernel=kernel, **quant)
    names = [p.name for p in f.params]
    assert names[-2:] == ["output", "output_tail"], names
    assert [int(d) for d in f.params[-2].shape] == [48, 1, 8]
    assert [int(d) for d in f.params[-1].shape] == [1, 1, 8]
    merged = cg.merge_outputs(f)
    assert [p.name for p in merged.params] == names[:-1]
    assert [int(d) for d in merged.params[-1].shape] == [49, 1, 8]
    assert "match_buffer(output[48, 0, 0:8], (1, 1, 8)" in merged.script()
    plain = cg.conv2d_gemm_func(S(1, 4, 4, 32, 8, 1, 1), _tile(kernel), kernel=kernel, **quant)
    assert cg.merge_outputs(plain).same_as(plain)


# Layers built for their largest shift (max_shift, as the compiler does: real scales are
# below 1/2, every shift <= -1): a dense-K 3x3, a row-blocked RGB stem, a pointwise layer
# (direct read at dotprod) and one whose scales include 1/2..1 (shift 0: max_shift 0).
BOUNDED_CASES = [CASES[4], CASES[12], DIRECT_CASES[3], CASES[3]]


def test_bounded_shift_epilogue_on_device(run_funcs, level, tmp_path, report):
    """``max_shift`` = the layer's largest shift: bit-exact at every level, and the
    epilogue's per-channel left shift (ushl) is gone from the module. (The shorter rounding
    fixup of max_shift <= -1 is counted in the depthwise kernel's loop, test_depthwise.)"""
    import re

    target = build.resolve_target(level)
    kernel = kernels.select(target, "int8", "int8")
    funcs, calls, expected, bounds = {}, [], [], []
    for i, case in enumerate(BOUNDED_CASES):
        last = i == len(BOUNDED_CASES) - 1  # scale 1/2 on half the channels: shift 0
        args, exp = _case_data(case, 40 + i, kernel, zero_shifts=last)
        top = int(args[4].max())
        assert top == 0 if last else top <= -1
        bounds.append(top)
        f = cg.conv2d_gemm_func(case.shape, _tile(kernel), kernel=kernel, in_zp=case.in_zp,
                                out_zp=case.out_zp, act_range=case.act_range, max_shift=top)
        funcs[case.name] = cg.schedule_conv2d_gemm(f, kernel, target,
                                                   cg.default_knobs(case.shape, kernel))
        calls.append((case.name, args, _out_shape(case.shape), np.int8))
        expected.append(exp)
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "bounded.so")
    assert not re.search(r"\bushl\s+v\d+\.4s", asm), "a left shift in a max_shift <= 0 epilogue"
    for case, exp, out in zip(BOUNDED_CASES, expected, outs):
        np.testing.assert_array_equal(out.reshape(exp.shape), exp,
                                      err_msg=f"{case.name} at {level}")
    report(f"conv2d_gemm max_shift {kernel.name:28s} {level:8s} {len(BOUNDED_CASES)} cases "
           f"(max shifts {bounds}) bit-exact")
