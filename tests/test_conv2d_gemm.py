"""conv2d as packed GEMM + fused requantization, bit-exact on the device at every ISA level.

The sweep is generated from the selection table: every int8 kernel of
``intrinsics/kernels.py`` runs, on the lowest level that has its instruction, every case
it applies to (``applies``: a one-row kernel the GEMMs of one row and the row-tail
layers, the 8-byte neon kernel the depths it is for, every other kernel all cases), in
every form the plan can give that case (packed, with the block or whole-K form the K loop
calls for, and read in place wherever the layer and kernel allow). The cases sweep the
geometry the GEMM must get right (K below, at and above the block; M and N remainders;
1x1/3x3/5x5/7x7 kernels; strides; dilation; asymmetric padding; few channels) and the
quantization (input zero points across the range, per-channel and per-tensor scales,
fused ReLU-style clamps); tags say what a case is for, and tests pick cases by tag. All
functions of a level are compiled into one module, uploaded once, and each is compared
exactly with ``schedules.reference``. The fast tier runs each level's cover of the sweep
(``sweep(level, "cover")``: the entries that bring their kernel a read, form or purpose
no earlier one did, about a quarter of them); the exhaustive tier runs all of it.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from armq_checks import (assert_alive, assert_functions_use, assert_no_workspace_per_task,
                         tier)

from tvm_armq import targets
from tvm_armq.intrinsics import kernels, requant
from tvm_armq.intrinsics.forms import DirectWindow
from tvm_armq.schedules import gemm_compute, gemm_plan, gemm_schedule
from tvm_armq.schedules import reference as ref
from tvm_armq.schedules.gemm_layout import (DENSE_K_MIN_SAVED_MACS, ROWS, Conv2DShape,
                                            fold_bias, input_copy, pack_weights, rows_copy)
from tvm_armq.schedules.gemm_plan import GemmKnobs
from tvm_armq.schedules.tir_util import merge_outputs, view_params
from tvm_armq.targets import LEVELS
from tvm_armq.frontend.layers import read_layer

pytestmark = pytest.mark.device

REFERENCE = kernels.select(targets.resolve({"kind": "c"}), "int8", "int8")  # scalar loops

# What a case is for (``Case.tags``):
DIRECT = "direct"        # a layer a DIRECT form can read in place (sdot, smull/sadalp)
BY_PIXEL = "by_pixel"    # a layer whose micro-tiles cross output rows: the INDIRECT form
ONE_ROW = "one_row"      # a GEMM of one row (M = 1)
TAIL = "tail"            # a layer whose last M % 4 rows may be a row tail
DEPTH8 = "depth8"        # K 1-8 past a multiple of 16: neon's 8-byte kernel
BOUNDED = "bounded"      # also built for its largest shift (max_shift)
FEW_CHANNELS = "few_channels"  # in_c no multiple of kr: packed from the row copy


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: Conv2DShape
    in_zp: int
    out_zp: int
    act_range: tuple[int, int] = (-128, 127)
    per_tensor: bool = False  # one scale for every output channel (else one per channel)
    tags: frozenset = frozenset()


S = Conv2DShape


def _c(name, shape, in_zp, out_zp, *tags, act_range=(-128, 127), per_tensor=False):
    return Case(name, shape, in_zp, out_zp, act_range, per_tensor, frozenset(tags))


CASES = [
    _c("k_below_block", S(1, 5, 5, 1, 4, 1, 1), 0, 0),  # K = 1 < kr
    _c("k_at_block", S(1, 4, 4, 4, 8, 1, 1), -128, 5),  # K = kr, pointwise
    _c("k_above_block", S(1, 6, 6, 5, 8, 1, 1), 127, -7),  # K = 5
    _c("m_n_remainders", S(1, 5, 3, 8, 11, 1, 1), 3, 0, DEPTH8, BOUNDED),  # M = 15, N = 11
    _c("3x3_same", S(1, 8, 8, 3, 16, 3, 3, padding=(1, 1, 1, 1)), -5, -128, FEW_CHANNELS,
       BOUNDED),
    _c("3x3_stride2", S(2, 9, 9, 6, 7, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1)), 12,
       -128, FEW_CHANNELS),
    _c("3x3_dilation2", S(1, 9, 10, 4, 5, 3, 3, dilation=(2, 2), padding=(2, 2, 2, 2)), -1,
       3),
    # a bordered copy of 40 channels: two 16-byte vectors and an 8-byte one per pixel
    _c("1x3_same_c40", S(1, 4, 8, 40, 16, 1, 3, padding=(0, 1, 0, 1)), -9, 4),
    _c("5x5_asym_pad_relu6", S(1, 7, 6, 3, 9, 5, 5, padding=(2, 1, 2, 3)), -20, -128,
       FEW_CHANNELS, act_range=(-128, 40)),
    _c("1x7_strided_w", S(1, 4, 15, 3, 6, 1, 7, strides=(1, 2), padding=(0, 3, 0, 3)), 40,
       1, FEW_CHANNELS),
    _c("groups2_3x3", S(1, 6, 6, 8, 10, 3, 3, padding=(1, 1, 1, 1), groups=2), -9, 2),
    _c("groups4_1x1", S(1, 5, 4, 12, 8, 1, 1, groups=4), 100, -3),
    _c("dense_rows3", S.dense(3, 70, 13), -128, 0),
    # Few channels (packed from flat image rows, K row-blocked or dense as each level's kr
    # makes it: test_sweep_covers_both_few_channel_layouts; cg % kr != 0 at every level):
    # an RGB stem; one channel, no padding, batch 2 (the last row's slack); a row of exactly
    # one copy vector; rows dilated; a wide row of 7 vectors and a partial one.
    _c("rgb_stem_s2", S(1, 17, 17, 3, 8, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1)), -1, 4,
       FEW_CHANNELS, BOUNDED),
    _c("gray_valid_batch2", S(2, 7, 9, 1, 6, 3, 3), 77, -9, FEW_CHANNELS),
    _c("gray_row_one_vector", S(1, 5, 16, 1, 4, 3, 3, padding=(1, 1, 1, 1)), -128, 0,
       FEW_CHANNELS),
    _c("rgb_dilated_rows", S(1, 9, 8, 3, 5, 3, 3, dilation=(2, 1), padding=(2, 1, 2, 1)), 25,
       -2, FEW_CHANNELS),
    _c("6ch_5x3_wide_row", S(1, 6, 21, 6, 12, 5, 3, padding=(2, 1, 2, 1)), -60, 11,
       FEW_CHANNELS, act_range=(-128, 90)),
    # 7x7 kernels: a ResNet-style RGB stem (stride 2, SAME: row-blocked K), and 8 channels
    # (K = 392 packed densely, whole K blocks at every level)
    _c("7x7_rgb_stem_s2", S(1, 15, 14, 3, 8, 7, 7, strides=(2, 2), padding=(3, 3, 3, 3)),
       -11, 6, FEW_CHANNELS),
    _c("7x7_same_c8", S(1, 9, 8, 8, 12, 7, 7, padding=(3, 3, 3, 3)), 50, -20, DEPTH8),
    # one scale for the whole layer (per-tensor quantization)
    _c("per_tensor_3x3", S(1, 6, 7, 8, 12, 3, 3, padding=(1, 1, 1, 1)), -30, 10,
       per_tensor=True),
    _c("per_tensor_dense", S.dense(5, 40, 24), 0, -128, DEPTH8, per_tensor=True),
    # Pointwise layers read in place where a kernel can: K in whole 16-byte row loads (16,
    # 48, 144, 512) and with a tail of 1-3 K steps (40, 28, 72), N remainders, several
    # images; M a multiple of 4.
    _c("direct_k16", S(1, 4, 6, 16, 20, 1, 1), -128, 3, DIRECT),
    _c("direct_k48_n_rem", S(1, 2, 6, 48, 11, 1, 1), 7, -5, DIRECT),
    _c("direct_k144", S(1, 4, 4, 144, 36, 1, 1), -3, 0, DIRECT),
    _c("direct_k512", S(1, 2, 2, 512, 64, 1, 1), 127, -128, DIRECT, BOUNDED,
       act_range=(-128, 60)),
    _c("direct_k40_tail", S(2, 2, 3, 40, 24, 1, 1), -20, 1, DIRECT, DEPTH8),
    _c("direct_k28_tail", S(1, 4, 3, 28, 8, 1, 1), 50, -1, DIRECT),
    _c("direct_k72_tail", S(1, 2, 4, 72, 12, 1, 1), -7, 2, DIRECT, DEPTH8),
    _c("direct_dense", S.dense(8, 96, 16), -128, 0, DIRECT),
    # kh x kw convolutions read in place (``direct_window``: one run of kw * C input bytes
    # per kernel row, micro-tiles along output rows): padded (the bordered copy) and not,
    # strided, rows dilated, runs with a K tail (20, 24 bytes), one kernel row (1x7),
    # 1x1 with stride 2, several images, a 7x7 kernel (seven runs of 112 bytes).
    _c("direct_3x3_c16_same", S(1, 8, 8, 16, 20, 3, 3, padding=(1, 1, 1, 1)), -9, 4, DIRECT),
    _c("direct_3x3_s2_c32", S(1, 9, 16, 32, 8, 3, 3, strides=(2, 2), padding=(0, 0, 1, 1)),
       100, -100, DIRECT, act_range=(-100, 127)),
    _c("direct_5x5_c4_valid_b2", S(2, 9, 12, 4, 12, 5, 5), -128, 0, DIRECT),
    _c("direct_1x7_c8", S(1, 4, 12, 8, 16, 1, 7, padding=(0, 3, 0, 3)), 3, 7, DIRECT,
       DEPTH8),
    _c("direct_3x3_rows_dilated", S(1, 10, 8, 16, 8, 3, 3, dilation=(2, 1),
                                    padding=(2, 1, 2, 1)), -40, -3, DIRECT),
    _c("direct_1x1_s2_c24", S(1, 8, 16, 24, 8, 1, 1, strides=(2, 2)), 60, 9, DIRECT, DEPTH8),
    _c("direct_1x1_s2_c32", S(1, 8, 16, 32, 12, 1, 1, strides=(2, 2)), -60, 2, DIRECT),
    _c("direct_7x7_c16_same", S(1, 7, 8, 16, 8, 7, 7, padding=(3, 3, 3, 3)), -2, -9, DIRECT),
    # neon's 8-byte kernel: pointwise K = 24 (read in place), dense K = 40 with M and N
    # remainders, one K block (K = 8), a 3x3 conv over 8 channels (runs of 24 bytes)
    _c("k24_pointwise", S(1, 4, 6, 24, 20, 1, 1), -128, 5, DIRECT, DEPTH8),
    _c("k40_dense_rem", S.dense(6, 40, 13), 33, -2, DEPTH8),
    _c("k8_one_block", S(1, 3, 4, 8, 8, 1, 1), -7, 0, DEPTH8),
    _c("3x3_c8", S(1, 6, 8, 8, 12, 3, 3, padding=(1, 1, 1, 1)), -1, 4, DIRECT, DEPTH8),
    # GEMMs of one row (M = 1: a dense layer on one vector, a conv whose output is one
    # pixel): whole 16-byte row loads and a K tail (dotprod: K = 200 is 50 steps of 4), the
    # widest K loop (30 column blocks), K below DIRECT_MIN_K over many column passes and K
    # no multiple of kr (packed A), a 1x1 conv on a 1x1 image, a 3x3 VALID conv whose
    # output is one pixel (kernel rows read in place), a clamp.
    _c("one_row_k256_n120", S.dense(1, 256, 120), -128, 3, ONE_ROW, DIRECT),
    _c("one_row_k200_n40_tail", S.dense(1, 200, 40), 17, -9, ONE_ROW, DIRECT, DEPTH8),
    _c("one_row_k36_packed", S.dense(1, 36, 210), -3, 0, ONE_ROW),
    _c("one_row_k70_n29", S.dense(1, 70, 29), 127, -128, ONE_ROW, act_range=(-128, 50)),
    _c("one_row_1x1_on_1x1", S(1, 1, 1, 96, 24, 1, 1), 5, 2, ONE_ROW, DIRECT),
    _c("one_row_3x3_valid_c16", S(1, 3, 3, 16, 12, 3, 3), -60, 7, ONE_ROW, DIRECT),
    # the last M % 4 rows through the family's one-row kernel (at most half a micro-tile
    # left over): a 7x7 pointwise layer read in place (K = 64), one packed (K = 32), two
    # tail rows (dense M = 6, batch 2 of 5x5: M = 50); a stride-2 1x1 into 7 x 7 (the
    # tail row read in place at its pixel), a padded 3x3 at 7 x 7 (both GEMMs read the
    # one bordered copy), the same over two images (two tail rows, in the second image);
    # one tail row with a K remainder (dotprod: K = 20 is 5 blocks of 4; neon pads 20 to
    # 32), a stride-2 3x3 of 4 channels into 7 x 7 (dotprod: K = 36, both GEMMs packed
    # from the bordered copy; neon: row-blocked K, padded), and M = 7, 3 rows padded.
    _c("tail_7x7_k64_direct", S(1, 7, 7, 64, 40, 1, 1), -128, 3, TAIL, DIRECT),
    _c("tail_7x7_k32_packed", S(1, 7, 7, 32, 24, 1, 1), 17, -9, TAIL, act_range=(-128, 60)),
    _c("tail_dense_rows6", S.dense(6, 48, 20), 5, 0, TAIL),
    _c("tail_batch2_rows50", S(2, 5, 5, 16, 12, 1, 1), -40, -128, TAIL),
    _c("tail_1x1_s2_7x7", S(1, 13, 13, 64, 40, 1, 1, strides=(2, 2)), 30, -4, TAIL),
    _c("tail_3x3_7x7_same", S(1, 7, 7, 16, 24, 3, 3, padding=(1, 1, 1, 1)), -70, 8, TAIL,
       act_range=(-128, 70)),
    _c("tail_3x3_batch2_rows50", S(2, 5, 5, 16, 8, 3, 3, padding=(1, 1, 1, 1)), 4, -128,
       TAIL),
    _c("tail_rows9_k20", S(1, 3, 3, 20, 8, 1, 1), 100, 1, TAIL),
    _c("tail_3x3_s2_k36_packed", S(1, 13, 13, 4, 8, 3, 3, strides=(2, 2),
                                   padding=(1, 1, 1, 1)), -9, 12, TAIL),
    _c("no_tail_rows7", S.dense(7, 64, 16), -2, 2, TAIL),
    # Read by pixel (the INDIRECT form, ``DirectWindow.by_pixel``): output rows that are
    # no whole number of micro-tiles, so tiles cross rows (and images): a 7x7 map (M = 49,
    # the last tile one real row), stride 2 over two images (tiles cross images), a
    # strided 1x1 into a 7x7 map, rows dilated over 8 channels (neon's 8-byte kernel), a
    # 7x7 kernel (M = 30).
    _c("by_pixel_3x3_7x7_c16", S(1, 7, 7, 16, 12, 3, 3, padding=(1, 1, 1, 1)), -5, 3,
       BY_PIXEL),
    _c("by_pixel_3x3_s2_b2", S(2, 9, 11, 16, 20, 3, 3, strides=(2, 2), padding=(0, 1, 1, 1)),
       70, -128, BY_PIXEL, act_range=(-128, 80)),
    _c("by_pixel_1x1_s2_c32", S(1, 13, 13, 32, 8, 1, 1, strides=(2, 2)), -100, 6, BY_PIXEL),
    _c("by_pixel_rows_dilated_c8", S(1, 10, 6, 8, 8, 3, 3, dilation=(2, 1),
                                     padding=(2, 1, 2, 1)), 12, -7, BY_PIXEL, DEPTH8),
    _c("by_pixel_7x7_c16", S(1, 5, 6, 16, 8, 7, 7, padding=(3, 3, 3, 3)), -30, 0, BY_PIXEL),
    # the clamp's floor above the output zero point: qmuls_relu and the floor both kept
    # (lo == zp, where the floor goes, is every ReLU case above: out_zp -128 or -100)
    _c("floor_above_zp", S(1, 5, 6, 12, 16, 1, 1), 9, -40, act_range=(-25, 100)),
]
assert len({c.name for c in CASES}) == len(CASES)


def tagged(tag: str) -> list[Case]:
    return [c for c in CASES if tag in c.tags]


# Macro tiles of several micro-tiles, K unrolling: the knobs must not change any result.
TILES = GemmKnobs(m_tiles=2, n_tiles=2, k_unroll=2)
INT8_KERNELS = [k for k in kernels.TABLE if (k.a_dtype, k.b_dtype) == ("int8", "int8")]


def lowest_level(kernel) -> str:
    """The most portable ISA level whose target has every feature ``kernel`` needs."""
    return next(name for name, lvl in LEVELS.items()
                if not kernels.missing_features(kernel, lvl.target()))


def applies(kernel, case: Case) -> bool:
    """Whether the sweep runs ``case`` with ``kernel``: a one-row kernel is for GEMMs of
    one row and for row tails (it runs every row of those layers here); a family member
    over fewer bytes of K than the family's main kernel is for the depths it is selected
    for; every other kernel runs every case."""
    if kernel.one_row:
        return bool(case.tags & {ONE_ROW, TAIL})
    if kernel.kr != kernels.family_of(kernel).main.kr:
        return DEPTH8 in case.tags
    return True


# How a sweep entry reads A (``_build``): packed, in place along output rows (DIRECT), in
# place by pixel (INDIRECT).
PACKED, IN_PLACE, BY_PIXEL_READ = "packed", "direct", "by_pixel"


def sweep(level: str, scope: str = "full") -> list[tuple]:
    """(kernel, case, read) of the level's sweep: every int8 kernel whose lowest level is
    ``level``, every case it applies to, packed and (where it can) read in place, along
    output rows and by pixel. ``scope="cover"`` keeps, in that order, only the entries
    that bring their kernel something no earlier entry did (``_covers``)."""
    if scope == "cover":
        seen: dict = {}
        kept = []
        for kernel, case, read in sweep(level):
            new = _covers(kernel, case, read) - seen.setdefault(kernel.name, set())
            if new:
                kept.append((kernel, case, read))
                seen[kernel.name] |= new
        return kept
    out = []
    for kernel in INT8_KERNELS:
        if lowest_level(kernel) != level:
            continue
        for case in CASES:
            if not applies(kernel, case):
                continue
            out.append((kernel, case, PACKED))
            if gemm_plan.can_read_input_directly(case.shape, kernel,
                                                 gemm_plan.gemm_rows(case.shape, kernel)):
                out.append((kernel, case, IN_PLACE))
            if gemm_plan.can_read_by_pixel(case.shape, kernel):
                out.append((kernel, case, BY_PIXEL_READ))
    return out


# The sweep's scopes: the fast tier runs the cover, the exhaustive tier every entry.
SWEEP_SCOPES = ("cover", "full")
K_DENSE, K_ROW_BLOCKED = "k_dense", "k_row_blocked"  # a few-channel layer's K (gemm_layout)


def _covers(kernel, case: Case, read: str) -> set:
    """What an entry of the sweep exercises in its kernel: the read with the plan's form
    (block, whole-K, direct, indirect), and the read with each thing the case is for (its
    tags, one scale per layer, groups, several images, a few-channel layer's K layout)."""
    plan = gemm_plan.plan(case.shape, kernel, **_reads(read))
    form = plan.main.form
    things = set(case.tags)
    if plan.input_copy == ROWS:  # which K layout the row copy is packed into
        things |= {K_DENSE if plan.rows_copy.dense else K_ROW_BLOCKED}
    things |= {"per_tensor"} if case.per_tensor else set()
    things |= {"grouped"} if case.shape.groups > 1 else set()
    things |= {"batch"} if case.shape.batch > 1 else set()
    return {(read, form)} | {(read, t) for t in things}


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
    args = [data, pack_weights(weight, (kernel.mr, kernel.nr, kernel.kr), s.groups),
            fold_bias(weight, bias, case.in_zp), mult.astype(np.int32), shift.astype(np.int32)]
    return args, expected


def _quant(case: Case, **extra) -> dict:
    return dict(in_zp=case.in_zp, out_zp=case.out_zp, act_range=case.act_range, **extra)


def _reads(read: str | None) -> dict:
    """``gemm_plan.plan``'s arguments for a sweep entry's read (None: the policy's)."""
    if read is None:
        return {}
    return {"direct": read == IN_PLACE, "by_pixel": read == BY_PIXEL_READ}


def _build(case: Case, kernel, target, *, knobs=None, direct=None, read=None, **extra):
    """The scheduled conv2d GEMM of ``case`` with ``kernel`` and its plan (``read``: a
    sweep entry's, else ``direct`` as ``gemm_plan.plan`` takes it)."""
    reads = _reads(read) if read is not None else {"direct": direct}
    plan = gemm_plan.plan(case.shape, kernel, knobs=knobs, **reads)
    func = gemm_compute.conv2d_gemm_func(plan, **_quant(case, **extra))
    return gemm_schedule.schedule_conv2d_gemm(func, plan, target), plan


def _out_shape(shape: Conv2DShape) -> tuple[int, int, int]:
    """The conv2d_gemm output buffer: [pixels, groups, channels per group]."""
    return (shape.gemm_m, shape.groups, shape.gemm_n)


def _run_and_compare(run_funcs, level, funcs, runs, lib):
    """Run ``runs`` [(function name, case, args, expected)] of ``funcs`` and compare each
    output exactly; returns the module's assembly."""
    calls = [(name, args, _out_shape(case.shape), np.int8) for name, case, args, _ in runs]
    asm, outs = run_funcs(level, funcs, calls, lib)
    for (name, _, _, expected), out in zip(runs, outs):
        # the case must exercise the output range (a layer of few outputs: a third of them)
        assert len(np.unique(expected)) > min(8, expected.size // 3), name
        np.testing.assert_array_equal(out.reshape(expected.shape), expected,
                                      err_msg=f"{name} at {level}")
    return asm


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
    packed = pack_weights(w, (4, 4, 4))[0]  # (mr, nr, kr); one group
    assert packed.shape == (2, 2, 4, 4)
    flat = w.reshape(6, 5)
    for n in range(5):
        for k in range(6):
            assert packed[n // 4, k // 4, n % 4, k % 4] == flat[k, n]
    assert not packed[1, :, 1:, :].any() and not packed[:, 1, :, 2:].any()  # zero padding
    grouped = pack_weights(w[:, :, :, :4], (4, 2, 4), groups=2)  # 2 groups of 2 outputs
    assert grouped.shape == (2, 1, 2, 2, 4)
    assert grouped[1, 0, 0, 1, 2] == w.reshape(6, 5)[2, 3]  # group 1, its output 1 = n 3


def test_row_blocked_packing_layout():
    """Few channels: each kernel row's kw * cg bytes start a new K block (gemm_layout)
    where that takes no more blocks than K packed densely."""
    w = np.arange(2 * 1 * 3 * 5, dtype=np.int8).reshape(2, 1, 3, 5)  # rows of 3 bytes
    s = S(1, 6, 6, 3, 5, 2, 1)
    assert s.kernel_row_k(4, "int8") == 4 and s.packed_k(4, "int8") == 8  # dense: 6 -> 8
    packed = pack_weights(w, (4, 4, 4))[0]
    assert packed.shape == (2, 2, 4, 4)
    for ky in range(2):
        for r in range(4):
            k = ky * 4 + r
            want = w[ky].reshape(3, 5)[r] if r < 3 else np.zeros(5, np.int8)
            for n in range(5):
                assert packed[n // 4, k // 4, n % 4, k % 4] == want[n]


def test_few_channels_pack_densely_where_row_blocks_cost_blocks():
    """Row-blocked, 3 rows of 6 bytes take 6 blocks of 4 (24) where 18 bytes packed densely
    take 5 (20); at kr = 16, 3 blocks (48) against 2 (32). Over 40 output channels that is
    160 and 640 multiply-accumulates a pixel, at least DENSE_K_MIN_SAVED_MACS: K is dense,
    packed from the row copy all the same. Over 5 channels (20 and 80) the row-blocked
    pack's one load per block pays more. Whole channel blocks, groups, float: dense, no
    row copy."""
    s = S(1, 6, 6, 3, 40, 3, 2)
    assert s.kernel_row_k(4, "int8") is None and s.packed_k(4, "int8") == 20
    assert s.kernel_row_k(16, "uint8") is None and s.packed_k(16, "uint8") == 32
    assert input_copy(s, 4, "int8", direct=False) == ROWS
    assert rows_copy(s, 4, "int8").dense
    few_out = dataclasses.replace(s, out_c=5)
    assert few_out.kernel_row_k(4, "int8") == 8 and few_out.packed_k(4, "int8") == 24
    assert few_out.kernel_row_k(16, "int8") == 16 and not rows_copy(few_out, 4, "int8").dense
    assert input_copy(few_out, 4, "int8", direct=False) == ROWS
    assert 4 * 5 < DENSE_K_MIN_SAVED_MACS <= 4 * 40
    assert S(1, 6, 6, 4, 40, 3, 2).kernel_row_k(4, "int8") is None  # whole blocks
    assert input_copy(S(1, 6, 6, 4, 40, 3, 2), 4, "int8", direct=False) != ROWS
    assert S(1, 6, 6, 6, 40, 3, 2, groups=2).kernel_row_k(4, "int8") is None
    assert s.kernel_row_k(4, "float32") is None and s.packed_k(4, "float32") == 20
    w = np.arange(3 * 2 * 3 * 40, dtype=np.int8).reshape(3, 2, 3, 40)
    packed = pack_weights(w, (4, 4, 4))[0]
    assert packed.shape == (10, 5, 4, 4)
    flat = w.reshape(18, 40)
    for k in range(20):
        want = flat[k] if k < 18 else np.zeros(40, np.int8)
        for n in range(40):
            assert packed[n // 4, k // 4, n % 4, k % 4] == want[n]


def test_sweep_covers_every_int8_kernel_and_form():
    """The sweep is the table: every int8 kernel runs on some level, in every form it has
    (BLOCK and K_LOOP through the K loops of its cases, DIRECT where it reads in place
    along output rows, INDIRECT where by pixel)."""
    for scope in SWEEP_SCOPES:  # the fast tier's cover as much as the whole sweep
        seen: dict[str, set] = {}
        for level in LEVELS:
            for kernel, case, read in sweep(level, scope):
                plan = gemm_plan.plan(case.shape, kernel, **_reads(read))
                seen.setdefault(kernel.name, set()).add(plan.main.form)
        assert set(seen) == {k.name for k in INT8_KERNELS}, scope
        for kernel in INT8_KERNELS:
            want = set(kernel.forms) if kernel.forms else {None}
            assert seen[kernel.name] == want, (scope, kernel.name, seen[kernel.name])
    for level in LEVELS:  # the cover leaves out no pair a whole sweep's entry has
        full, cover = set(), set()
        for scope, into in (("full", full), ("cover", cover)):
            for kernel, case, read in sweep(level, scope):
                into |= {(kernel.name, c) for c in _covers(kernel, case, read)}
        assert cover == full and len(sweep(level, "cover")) < len(sweep(level)), level


def test_sweep_covers_both_few_channel_layouts():
    """At every level, the fast tier's cover packs a few-channel layer from the row copy
    into each K layout: row-blocked (a load per block) and dense (a blend of rows)."""
    for level in LEVELS:
        layouts = {t for kernel, case, read in sweep(level, "cover")
                   for _, t in _covers(kernel, case, read)} & {K_DENSE, K_ROW_BLOCKED}
        assert layouts == {K_DENSE, K_ROW_BLOCKED}, (level, layouts)


@pytest.mark.parametrize("level, scope", [
    tier(level, scope, id=f"{level}-{scope}", fast=scope == "cover")
    for level in LEVELS for scope in SWEEP_SCOPES])
def test_table_sweep_on_device(run_funcs, level, scope, tmp_path, report):
    """Every (kernel, case, form) of the level's sweep (the fast tier: its cover, every
    kernel in every form and every read of each thing a case is for) with the plan's
    knobs, and the level's selected kernel with 2 x 2 macro tiles and K unrolled by 2 as
    well: bit-exact, each function runs its kernel's instructions, and no parallel task
    allocates from the runtime's workspace pool."""
    target = targets.resolve(level)
    best = kernels.select(target, "int8", "int8")
    funcs, runs, by_kernel = {}, [], {}
    for kernel, case, read in sweep(level, scope):
        # the data's seed names the pair, so a case added to the table changes no other's
        args, expected = _case_data(case, zlib.crc32(f"{kernel.name}/{case.name}".encode()),
                                    kernel)
        knob_sets = {"default": None}
        if kernel == best:
            knob_sets["tiles"] = TILES
        for tag, knobs in knob_sets.items():
            name = f"{kernel.name}_{case.name}_{read}_{tag}"
            funcs[name], _ = _build(case, kernel, target, knobs=knobs, read=read)
            runs.append((name, case, args, expected))
            by_kernel.setdefault(kernel, []).append(name)
    asm = _run_and_compare(run_funcs, level, funcs, runs, tmp_path / "sweep.so")
    assert_no_workspace_per_task(asm, f"conv2d_gemm sweep at {level}")
    for kernel, names in by_kernel.items():
        if kernel.instructions:  # the scalar reference has no instruction to look for
            assert_functions_use(asm, names, kernel.instructions, f"{kernel.name} at {level}")
    report(f"conv2d_gemm sweep {level:8s} {scope:5s} {len(by_kernel)} kernels, "
           f"{len(funcs)} functions bit-exact")


def test_best_kernel_per_level():
    names = {lvl: kernels.select(targets.resolve(lvl), "int8", "int8").name
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
    from tvm_armq.frontend.model import TFLiteModel

    target = targets.resolve(level)
    kernel = kernels.select(target, "int8", "int8")
    funcs, runs = {}, []
    for name in TFLITE_MODELS:
        path = zoo_model(name)
        layer, shape, mult, shift = _tflite_case(path)
        # TFLite's FULLY_CONNECTED rounds its requantization once, CONV_2D twice
        # (passes.gemm.requant_rounding); 16 FC outputs need many inputs before the two
        # rules part (4 of 4800 outputs over FC_SEEDS, test_integrate's rounding test)
        dense = layer.op == "FULLY_CONNECTED"
        plan = gemm_plan.plan(shape, kernel, knobs=TILES)
        f = gemm_compute.conv2d_gemm_func(plan, in_zp=layer.in_zp, out_zp=layer.out_zp,
                                          act_range=layer.act_range,
                                          rounding="single" if dense else "double")
        funcs[name] = gemm_schedule.schedule_conv2d_gemm(f, plan, target)
        w = layer.weight_hwio()
        params = [pack_weights(w, plan.main.tile, shape.groups),
                  fold_bias(w, layer.bias, layer.in_zp), mult, shift]
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
# (7 output columns: no whole micro-tiles along a row, so A is read by pixel at dotprod;
# sampled packed here, the design space of a layer read in place is checked by
# test_direct_read_design_space_on_device)
SAMPLED_CASE = _c("sampled_3x3", S(1, 8, 7, 8, 16, 3, 3, padding=(1, 1, 1, 1)), -3, 4)
SAMPLED_TAIL_CASE = _c("sampled_7x7_tail", S(1, 7, 7, 48, 24, 1, 1), 9, -6, TAIL)
SEEDS = range(1, 7)


def _sampled(case: Case, kernel, target, seed: int, read=None):
    """One candidate of the design space of ``case`` (``read``: as a sweep entry's, None
    the policy's), its outputs merged as ``tuning.schedule_from_database`` merges them,
    and its trace."""
    from tvm import s_tir

    plan = gemm_plan.plan(case.shape, kernel, **_reads(read))
    func = gemm_compute.conv2d_gemm_func(plan, **_quant(case))
    assert (func.attrs[gemm_compute.ATTR_OP], func.attrs[gemm_compute.ATTR_KERNEL]) == \
        ("conv2d_gemm", kernel.name)
    sch = s_tir.Schedule(func, seed=seed)
    gemm_schedule.sample_conv2d_gemm(sch, plan, target)
    return merge_outputs(sch.mod["main"]), sch.trace


def _check_sampled(run_funcs, level, case, kernel, data_seed, lib, check_trace=None,
                   read=None) -> int:
    """Sample the design space of ``case`` once per seed of SEEDS (``check_trace(trace)``
    sees each trace; ``read`` as ``_sampled``'s). The traces must differ, and every
    candidate must run the kernel's instructions and be bit-exact. Returns the number of
    distinct schedules."""
    target = targets.resolve(level)
    funcs, decisions = {}, set()
    for seed in SEEDS:
        funcs[f"seed{seed}"], trace = _sampled(case, kernel, target, seed, read)
        if check_trace is not None:
            check_trace(trace)
        decisions.add(tuple(tuple(int(x) for x in d) for d in trace.decisions.values()))
    assert len(decisions) > 1, f"{len(SEEDS)} seeds sampled one and the same schedule"
    args, expected = _case_data(case, data_seed, kernel)
    asm = _run_and_compare(run_funcs, level, funcs,
                           [(name, case, args, expected) for name in funcs], lib)
    assert_functions_use(asm, funcs, kernel.instructions, f"{case.name} at {level}")
    return len(decisions)


def test_sample_conv2d_gemm_on_device(run_funcs, level, tmp_path, report):
    """``sample_conv2d_gemm`` with several seeds on a packed layer: the traces differ (the
    knobs are sampled), each candidate is tensorized with the level's kernel, and every
    one is bit-exact."""
    kernel = kernels.select(targets.resolve(level), "int8", "int8")
    form = gemm_plan.plan(SAMPLED_CASE.shape, kernel, **_reads(PACKED)).main.form

    def check_trace(trace):
        kinds = [inst.kind.name for inst in trace.insts]
        # m_tiles, n_tiles and k_unroll; no k_unroll where the kernel takes the whole K loop
        knobs = 2 if form == kernels.K_LOOP else 3
        assert kinds.count("SamplePerfectTile") == knobs and "Tensorize" in kinds, kinds

    distinct = _check_sampled(run_funcs, level, SAMPLED_CASE, kernel, 0,
                              tmp_path / "sampled.so", check_trace, PACKED)
    report(f"conv2d_gemm sampled {kernel.name:28s} {level:8s} {distinct} distinct "
           f"schedules of {len(SEEDS)} seeds bit-exact")


def test_sample_conv2d_gemm_with_row_tail_on_device(run_funcs, level, tmp_path, report):
    """The design space of a 7x7 pointwise layer: the main GEMM's knobs are sampled, its row
    tail (neon, dotprod) keeps its planned knobs, and each candidate, its outputs merged
    as ``tuning.schedule_from_database`` merges them, is bit-exact."""
    target = targets.resolve(level)
    c = SAMPLED_TAIL_CASE
    kernel = kernels.select(target, "int8", "int8", rows=c.shape.gemm_m, depth=c.shape.gemm_k)
    assert (gemm_plan.plan(c.shape, kernel).tail is not None) == (level != "i8mm")
    distinct = _check_sampled(run_funcs, level, c, kernel, 1, tmp_path / "sampled_tail.so")
    report(f"conv2d_gemm sampled with row tail {kernel.name:28s} {level:8s} "
           f"{distinct} distinct schedules of {len(SEEDS)} seeds bit-exact")


@pytest.mark.parametrize("level", LEVELS)
def test_design_space_holds_the_default_knobs(level):
    """Every sampled knob may take the plan's own value: a tuned layer cannot end up slower
    than its default because the default was not a candidate (MobileNetV2's 7 x 7 layers at
    i8mm: 25 row blocks, default m_tiles 5, once outside a space bounded at 4)."""
    from tvm import s_tir

    target = targets.resolve(level)
    for shape in (S(1, 7, 7, 160, 960, 1, 1), SAMPLED_CASE.shape, SAMPLED_TAIL_CASE.shape):
        kernel = kernels.select(target, "int8", "int8", rows=shape.gemm_m, depth=shape.gemm_k)
        plan = gemm_plan.plan(shape, kernel)
        sch = s_tir.Schedule(gemm_compute.conv2d_gemm_func(plan, **_quant(SAMPLED_CASE)))
        gemm_schedule.sample_conv2d_gemm(sch, plan, target)
        samples = [i for i in sch.trace.insts if i.kind.name == "SamplePerfectTile"]
        knobs = plan.main.knobs
        wanted = [knobs.m_tiles, knobs.n_tiles] if plan.main.window is None else [knobs.m_tiles]
        if plan.main.form == kernels.BLOCK:
            wanted.append(knobs.k_unroll)
        bounds = [int(i.attrs[1]) for i in samples]
        assert len(bounds) == len(wanted), (shape, bounds, wanted)
        assert all(b >= w for b, w in zip(bounds, wanted)), (shape, level, bounds, wanted)


@pytest.mark.parametrize("level", ["neon", "dotprod"])
def test_direct_read_design_space_on_device(run_funcs, level, tmp_path, report):
    """The design space of a layer read in place, along output rows and by pixel: m_tiles
    sampled, n_tiles fixed (the direct intrinsic is registered per n_tiles); every
    candidate tensorized (DIRECT) or marked for the indirect lowering (INDIRECT; its row
    tail, if any, tensorized), and bit-exact."""
    from tvm_armq.intrinsics import indirect

    target = targets.resolve(level)
    kernel = kernels.select(target, "int8", "int8")
    cases = [(c, IN_PLACE) for c in tagged(DIRECT)
             if gemm_plan.can_read_input_directly(c.shape, kernel) and ONE_ROW not in c.tags][:4]
    cases += [(c, BY_PIXEL_READ) for c in tagged(BY_PIXEL)
              if gemm_plan.can_read_by_pixel(c.shape, kernel)][:3]
    assert len(cases) == 7, [c.name for c, _ in cases]
    funcs, runs = {}, []
    for i, (c, read) in enumerate(cases):
        func, trace = _sampled(c, kernel, target, seed=3, read=read)
        kinds = [inst.kind.name for inst in trace.insts]
        assert kinds.count("SamplePerfectTile") == 1, kinds
        if read == IN_PLACE:
            assert "Tensorize" in kinds, kinds
        else:  # a row tail (M % 4 rows) is read in place along its output row
            tail = gemm_plan.plan(c.shape, kernel, **_reads(read)).tail
            assert ("Tensorize" in kinds) == (tail is not None) and "Blockize" in kinds, kinds
            assert indirect.MARK in str(func)
        funcs[c.name] = func
        runs.append((c.name, c, *_case_data(c, 100 + i, kernel)))
    asm = _run_and_compare(run_funcs, level, funcs, runs, tmp_path / "direct_sampled.so")
    assert_functions_use(asm, funcs, kernel.instructions, f"direct read at {level}")
    report(f"conv2d_gemm direct read sampled {kernel.name:28s} {level:8s} {len(cases)} "
           f"cases bit-exact")


# ------------------------------------------------------------- the policy (no device)
def test_default_knobs_are_honoured_and_fit_the_registers():
    """default_knobs picks tile counts that divide the block counts (so the schedule uses
    them as given), whole int32x4 output rows, and a K loop that fits the register file;
    neon's whole-K kernel keeps one micro-tile per K loop."""
    shapes = [S(1, 112, 112, 16, 96, 1, 1), S(1, 14, 14, 512, 512, 1, 1),
              S(1, 7, 7, 160, 960, 1, 1), S(1, 224, 224, 3, 32, 3, 3, strides=(2, 2)),
              S.dense(1, 1280, 1000), S(1, 5, 3, 8, 11, 1, 1)]
    for level in LEVELS:
        kernel = kernels.select(targets.resolve(level), "int8", "int8")
        for shape in shapes:
            knobs = gemm_plan.default_knobs(shape, kernel, parallel=False)
            mb, nb = -(-shape.gemm_m // kernel.mr), -(-shape.gemm_n // kernel.nr)
            assert mb % knobs.m_tiles == 0 and nb % knobs.n_tiles == 0, (level, shape, knobs)
            acc, operands = gemm_plan.k_loop_registers(kernel, knobs.m_tiles, knobs.n_tiles)
            assert acc + operands <= gemm_plan.NEON_REGISTERS - gemm_plan.SCRATCH_REGISTERS
            assert not knobs.parallel
            if shape.gemm_n % gemm_plan.EPILOGUE_LANES == 0:
                assert knobs.n_tiles * kernel.nr % gemm_plan.EPILOGUE_LANES == 0, (level, knobs)
    assert gemm_plan.default_knobs(CASES[0].shape, REFERENCE) == GemmKnobs()


def test_default_knobs_follow_the_measured_rules():
    """neon's whole-K kernel: one micro-tile per macro tile once K spans two blocks (short
    K loops are unrolled, and several tiles' partial sums spill); sdot by element on a
    packed layer (M = 35: no direct read, and 3 rows left over are padded, not a tail)
    takes the 16-channel row from LONG_K_BLOCKS K blocks, the 8-channel one below;
    one-row GEMMs fill ONE_ROW_CHANNELS, as a layer's row tail does."""
    gp = gemm_plan
    neon = kernels.select(targets.resolve("neon"), "int8", "int8")
    dot = kernels.select(targets.resolve("dotprod"), "int8", "int8")
    for k in (24, 32, 512):
        knobs = gp.default_knobs(S(1, 7, 7, k, 1024, 1, 1), neon)
        assert (knobs.m_tiles, knobs.n_tiles) == (1, 1), (k, knobs)
    long_k = S(1, 5, 7, 4 * gp.LONG_K_BLOCKS, 960, 1, 1)
    short_k = dataclasses.replace(long_k, in_c=4 * gp.LONG_K_BLOCKS - 4)
    assert gp.tail_kernel(long_k, dot) is None and not gp.reads_input_directly(long_k, dot)
    assert gp.default_knobs(long_k, dot).n_tiles * dot.nr == gp.STORE_CHANNELS
    assert gp.default_knobs(short_k, dot).n_tiles * dot.nr < gp.STORE_CHANNELS
    one_row = kernels.select(targets.resolve("dotprod"), "int8", "int8", rows=1)
    logits = S.dense(1, 1024, 1000)
    assert gp.default_knobs(logits, one_row).n_tiles * one_row.nr == gp.ONE_ROW_CHANNELS


def test_direct_read_only_where_it_applies():
    """Direct read needs a kernel with a DIRECT form (int8 sdot by element, smull/sadalp,
    smmla) that the plan reads in place with (``Cost.reads_in_place``: not smmla),
    K >= DIRECT_MIN_K and an ungrouped layer:
    pointwise with M % mr == 0 (M before a row tail) and K % kr == 0, or kh x kw with
    C % kr == 0, columns not dilated and out_w % mr == 0; every other layer and kernel
    keeps the A pack."""
    gp = gemm_plan
    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    assert gp.reads_input_directly(S(1, 14, 14, 512, 512, 1, 1), dot)
    assert gp.reads_input_directly(S(1, 14, 14, gp.DIRECT_MIN_K, 8, 1, 1), dot)
    # below DIRECT_MIN_K: in place where A is read by few column passes (16 channels each)
    passes = gp.STORE_CHANNELS * (gp.DIRECT_MAX_PASSES + 1)
    small_k = S(1, 14, 14, gp.DIRECT_MIN_K - dot.kr, passes, 1, 1)
    assert gp.can_read_input_directly(small_k, dot) and not gp.reads_input_directly(small_k, dot)
    few_passes = dataclasses.replace(small_k, out_c=passes - gp.STORE_CHANNELS)
    assert gp.reads_input_directly(few_passes, dot)
    # the widening kernel (neon) reads in place from two K blocks, over any number of passes
    neon = kernels.get(kernels.GEMM_S8S8S32_4X4X16_NEON)
    assert gp.reads_input_directly(dataclasses.replace(small_k, in_c=2 * neon.kr), neon)
    plan = gp.plan(small_k, dot)
    assert plan.main.window is None and plan.main.form == kernels.BLOCK
    assert "A_packed" in gemm_compute.conv2d_gemm_func(plan, **_quant(CASES[0])).script()
    assert not gp.reads_input_directly(S(1, 5, 7, 160, 960, 1, 1), dot)  # M = 35: padded
    # M = 49: 48 rows read in place, the row tail too (by the one-row member)
    assert gp.gemm_rows(S(1, 7, 7, 160, 960, 1, 1), dot) == 48
    assert gp.reads_input_directly(S(1, 7, 7, 160, 960, 1, 1), dot)
    assert not gp.reads_input_directly(S(1, 4, 4, 6, 8, 1, 1), dot)  # K = 6
    # a 3x3 conv below DIRECT_MIN_K packs, however few its passes (K = 36, N = 8: one)
    assert not gp.reads_input_directly(S(1, 4, 4, 4, 8, 3, 3, padding=(1, 1, 1, 1)), dot)
    conv = S(1, 8, 8, 16, 8, 3, 3, padding=(1, 1, 1, 1))
    assert gp.reads_input_directly(conv, dot)
    assert gp.plan(conv, dot).main.window == DirectWindow(48, 3, 10 * 16, 16)
    assert gp.plan(conv, dot).main.form == kernels.DIRECT
    assert not gp.reads_input_directly(dataclasses.replace(conv, in_w=7), dot)  # out_w 7
    assert not gp.reads_input_directly(dataclasses.replace(conv, in_c=18), dot)  # C % kr
    assert not gp.reads_input_directly(dataclasses.replace(conv, dilation=(1, 2)), dot)
    assert not gp.reads_input_directly(dataclasses.replace(conv, in_c=32, groups=2), dot)
    assert not gp.reads_input_directly(S(1, 4, 4, 8, 8, 1, 1, groups=2), dot)
    assert gp.reads_input_directly(S(1, 14, 14, 512, 512, 1, 1), neon)
    assert not gp.reads_input_directly(S(1, 14, 14, 72, 16, 1, 1), neon)  # K % 16
    assert gp.reads_input_directly(conv, neon)  # runs of 3 x 16 bytes: whole blocks of 16
    assert not gp.reads_input_directly(dataclasses.replace(conv, in_c=24), neon)  # C % 16
    # smmla can read in place (two zips per 16 bytes of two rows) and packs by default
    i8mm = kernels.select(targets.resolve("i8mm"), "int8", "int8")
    big = S(1, 14, 14, 512, 512, 1, 1)
    assert gp.can_read_input_directly(big, i8mm) and not i8mm.cost.reads_in_place
    assert not gp.reads_input_directly(big, i8mm)
    assert gp.plan(big, i8mm).main.form == kernels.BLOCK
    assert gp.plan(big, i8mm, direct=True).main.form == kernels.DIRECT
    assert not gp.reads_input_directly(big, REFERENCE)
    with pytest.raises(ValueError, match="cannot read A in place"):
        gp.plan(big, kernels.get(kernels.GEMM_U8U8S32_2X2X8_I8MM), direct=True)


def test_read_by_pixel_where_it_applies():
    """Where micro-tiles would cross output rows (out_w no multiple of mr, or a strided 1x1
    into such a map) and K >= DIRECT_MIN_K, a kernel with the INDIRECT form reads A by
    pixel (M but a row tail), no A_packed stage, the by-pixel window of
    kernel rows; only over as many column passes as the kernel's
    ``Cost.by_pixel_max_passes`` (sdot 32, the widening kernel 16). Layers the affine
    window reads keep it; smmla (which can, ``can_read_by_pixel``), the reference,
    pointwise layers, dilated columns, groups and K below the minimum pack."""
    gp = gemm_plan
    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    neon = kernels.get(kernels.GEMM_S8S8S32_4X4X16_NEON)
    d121 = S(1, 14, 14, 128, 32, 3, 3, padding=(1, 1, 1, 1))  # 8 column blocks of 4
    r50 = S(1, 7, 7, 512, 512, 3, 3, padding=(1, 1, 1, 1))   # 128
    for shape, kernel in ((d121, dot), (d121, neon), (r50, dot)):
        assert gp.reads_by_pixel(shape, kernel), (shape, kernel.name)
        plan = gp.plan(shape, kernel)
        assert plan.main.form == kernels.INDIRECT and plan.input_copy == "data_padded"
        # 14 x 14: whole micro-tiles, no tail; 7 x 7: 48 rows, the last through the
        # one-row twin, read in place at its pixel from the same bordered copy
        assert plan.main.rows == gp.gemm_rows(shape, kernel)
        if shape.gemm_m % kernel.mr:
            assert plan.tail.form == kernels.DIRECT and plan.tail.window.segments == 3
        else:
            assert plan.tail is None
        assert plan.main.window == DirectWindow.of_pixels(3 * shape.in_c, 3,
                                                          (shape.in_w + 2) * shape.in_c)
        knobs = gp.default_knobs(shape, kernel)
        assert knobs == plan.main.knobs and knobs.m_tiles == 1
        assert "A_packed" not in gemm_compute.conv2d_gemm_func(plan, **_quant(CASES[0])).script()
    assert not gp.reads_by_pixel(r50, neon)  # 128 passes: the widening kernel packs
    wide = S(1, 14, 14, 1024, 2048, 1, 1, strides=(2, 2))  # 128 passes of 4 tiles
    assert gp.can_read_by_pixel(wide, dot) and not gp.reads_by_pixel(wide, dot)
    assert gp.plan(r50, neon).main.form == kernels.K_LOOP
    strided = S(1, 14, 14, 1024, 512, 1, 1, strides=(2, 2))  # into 7 x 7
    assert gp.reads_by_pixel(strided, dot) and not gp.reads_input_directly(strided, dot)
    assert gp.plan(strided, dot).main.window == DirectWindow.of_pixels(1024, 1, 14 * 1024)
    affine = S(1, 8, 8, 128, 32, 3, 3, padding=(1, 1, 1, 1))  # out_w 8: whole tiles
    assert gp.reads_input_directly(affine, dot) and not gp.reads_by_pixel(affine, dot)
    i8mm = kernels.select(targets.resolve("i8mm"), "int8", "int8")
    assert gp.can_read_by_pixel(d121, i8mm)
    assert gp.plan(d121, i8mm, by_pixel=True).main.form == kernels.INDIRECT
    for shape, kernel in ((d121, i8mm), (d121, REFERENCE),
                          (S(1, 7, 7, 512, 64, 1, 1), dot),  # pointwise: a row tail
                          (dataclasses.replace(d121, dilation=(1, 2)), dot),
                          (dataclasses.replace(d121, groups=2), dot),
                          (dataclasses.replace(d121, in_c=4), dot)):  # K = 36
        assert not gp.reads_by_pixel(shape, kernel), (shape, kernel.name)
    with pytest.raises(ValueError, match="cannot read A by pixel"):
        gp.plan(S(1, 7, 7, 512, 64, 1, 1), dot, by_pixel=True)
    with pytest.raises(ValueError, match="not both"):
        gp.plan(d121, dot, direct=True, by_pixel=True)
    assert gp.plan(d121, dot, by_pixel=False).main.form == kernels.BLOCK  # packed on request


def test_row_tails_where_the_policy_says():
    """The tagged tail layers get a row tail through the family's one-row member (neon
    1x4x16, dotprod 1x4x4, reading the same packed B) when at most half a micro-tile is
    left over, pointwise or not; smmla's family has no one-row member, so at i8mm the rows
    are padded."""
    tail_cases = tagged(TAIL)
    for level, want in (("neon", 7), ("dotprod", 9), ("i8mm", 0)):
        target = targets.resolve(level)
        got = []
        for c in tail_cases:
            kernel = kernels.select(target, "int8", "int8", rows=c.shape.gemm_m,
                                    depth=c.shape.gemm_k)
            plan = gemm_plan.plan(c.shape, kernel)
            if plan.tail is not None:
                got.append(c.name)
                t = plan.tail
                assert t.kernel.one_row and (t.kernel.nr, t.kernel.kr) == (kernel.nr, kernel.kr)
                assert (t.first, t.first + t.rows) == (plan.main.rows, c.shape.gemm_m)
        assert got == [c.name for c in tail_cases[:want]], (level, got)
    # beyond pointwise layers: the tail row read in place at its own pixel (from the
    # bordered copy the main GEMM reads, where the layer pads), packed where K is short
    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    forms = {}
    for c in tail_cases:
        plan = gemm_plan.plan(c.shape, dot)
        if plan.tail is not None:
            forms[c.name] = (plan.main.form, plan.tail.form, plan.input_copy)
    assert forms["tail_1x1_s2_7x7"] == (kernels.INDIRECT, kernels.DIRECT, None)
    assert forms["tail_3x3_7x7_same"] == (kernels.INDIRECT, kernels.DIRECT, "data_padded")
    assert forms["tail_3x3_s2_k36_packed"] == (kernels.BLOCK, kernels.BLOCK, "data_padded")
    # a row-blocked K (its row copy packed for all rows at once) pads its last rows
    few = S(1, 13, 13, 3, 8, 3, 3, strides=(2, 2), padding=(1, 1, 1, 1))
    assert gemm_plan.plan(few, dot).input_copy == "data_rows"
    assert gemm_plan.tail_kernel(few, dot) is None


def test_plan_describes_each_part():
    """The plan's one line names each part's kernel, form, rows and tiles (the log line)."""
    dot = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    line = gemm_plan.plan(S(1, 7, 7, 64, 40, 1, 1), dot).describe()
    assert line.startswith("gemm_s8s8s32_4x4x4_dotprod direct rows 0..48")
    assert " + gemm_s8s8s32_1x4x4_dotprod direct rows 48..49" in line


def test_merge_outputs_joins_the_tail_into_one_output():
    """A func with a row tail has outputs ``output`` and ``output_tail`` while it is
    scheduled and one ``output`` of all M rows after (``output_tail`` a view of its last
    rows); a func without a tail is left as it is."""
    kernel = kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD)
    quant = dict(in_zp=0, out_zp=0, act_range=(-128, 127))
    f = gemm_compute.conv2d_gemm_func(gemm_plan.plan(S(1, 7, 7, 32, 8, 1, 1), kernel), **quant)
    names = [p.name for p in f.params]
    assert names[-2:] == ["output", "output_tail"], names
    assert [int(d) for d in f.params[-2].shape] == [48, 1, 8]
    assert [int(d) for d in f.params[-1].shape] == [1, 1, 8]
    merged = merge_outputs(f)
    assert [p.name for p in merged.params] == names[:-1]
    assert [int(d) for d in merged.params[-1].shape] == [49, 1, 8]
    assert "match_buffer(output[48, 0, 0:8], (1, 1, 8)" in merged.script()
    plain = gemm_compute.conv2d_gemm_func(gemm_plan.plan(S(1, 4, 4, 32, 8, 1, 1), kernel),
                                          **quant)
    assert merge_outputs(plain).same_as(plain)


def test_view_params_reshapes_a_scheduled_gemm_in_place_on_device(run_funcs, tmp_path):
    """A scheduled GEMM whose output [M, 1, N] and input are given the model's shapes
    (``view_params``: NHWC out, the input flattened) runs bit-exact on the device with
    tensors of those shapes; a shape of another element count is refused by name."""
    level = "dotprod"
    kernel = kernels.select(targets.resolve(level), "int8", "int8")
    case = _c("view_4x6_k32", S(1, 4, 6, 32, 24, 1, 1), 3, -5)
    args, expected = _case_data(case, 7, kernel)
    func, _ = _build(case, kernel, targets.resolve(level))
    out = len(func.params) - 1
    assert [int(d) for d in func.params[out].shape] == [24, 1, 24]
    viewed = view_params(func, {0: (4 * 6 * 32,), out: (1, 4, 6, 24)})
    assert [int(d) for d in viewed.params[out].shape] == [1, 4, 6, 24]
    _, (got,) = run_funcs(level, {"viewed": viewed},
                          [("viewed", [args[0].reshape(-1), *args[1:]], (1, 4, 6, 24),
                            "int8")], tmp_path / "viewed.so")
    np.testing.assert_array_equal(got, expected.reshape(1, 4, 6, 24))
    assert view_params(func, {}).same_as(func)
    with pytest.raises(ValueError, match=r"view_params: output \(24, 1, 24\) is not"):
        view_params(func, {out: (1, 4, 6, 25)})


@pytest.mark.parametrize("channels, vectors", [(384, [16]), (200, [8, 16]), (12, [12])])
def test_bordered_copy_moves_channels_a_register_at_a_time(channels, vectors):
    """The bordered input copy of a padded layer runs its channels in vectors of at most
    COPY_LANES (and one narrower vector for the rest): a whole channel loop as one vector
    (384 lanes in InceptionV3's 8 x 8 layers) was legalized by LLVM byte by byte."""
    import re

    from tvm_armq.schedules.gemm_layout import BORDERED, COPY_LANES

    shape = S(1, 8, 8, channels, 32, 1, 3, padding=(0, 1, 0, 1))
    case = _c("bordered", shape, 0, 0)
    func, plan = _build(case, kernels.get(kernels.GEMM_S8S8S32_4X4X4_DOTPROD),
                        targets.resolve("dotprod"))
    assert plan.input_copy == BORDERED
    text = func.script()
    copy = text[text.index(f"{BORDERED} = "):text.index("for g in")]  # the copy's loops
    found = sorted({int(b) - int(a or 0)
                    for a, b in re.findall(r"T.vectorized\((?:(\d+), )?(\d+)\)", copy)})
    assert found == vectors and max(found) <= COPY_LANES, copy


# ------------------------------------------------------------- bounded shifts
def test_bounded_shift_epilogue_on_device(run_funcs, level, tmp_path, report):
    """Layers built for their largest shift (``max_shift``, as the compiler does: real
    scales are below 1/2, every shift <= -1; the last tagged case gets scales of 1/2..1,
    shift 0): bit-exact at every level, and the epilogue's per-channel left shift (ushl)
    is gone from the module. (The shorter rounding fixup of max_shift <= -1 is counted in
    the depthwise kernel's loop, test_depthwise.)"""
    import re

    target = targets.resolve(level)
    cases = tagged(BOUNDED)
    funcs, runs, bounds = {}, [], []
    for i, case in enumerate(cases):
        kernel = kernels.select(target, "int8", "int8")
        last = i == len(cases) - 1  # scale 1/2 on half the channels: shift 0
        args, exp = _case_data(case, 40 + i, kernel, zero_shifts=last)
        top = int(args[4].max())
        assert top == 0 if last else top <= -1
        bounds.append(top)
        funcs[case.name], _ = _build(case, kernel, target, max_shift=top)
        runs.append((case.name, case, args, exp))
    asm = _run_and_compare(run_funcs, level, funcs, runs, tmp_path / "bounded.so")
    assert not re.search(r"\bushl\s+v\d+\.4s", asm), "a left shift in a max_shift <= 0 epilogue"
    report(f"conv2d_gemm max_shift {level:8s} {len(cases)} cases (max shifts {bounds}) "
           f"bit-exact")
