"""``qmuls.requantize_narrow``: ``clamp(qmuls(x, m, 31, s) + zp, lo, hi)`` as int8, bit-exact
against TFLite's arithmetic (``requant.multiply_by_quantized_multiplier``) on x86 (the
default rule) and on the emulated device, where the shift's range picks the 16-bit forms
(``_narrow_split``): one shift for every lane (sqrshrn), a spread of shifts (sqshrn by the
smallest less one, srshl by the rest), a spread too wide for them (the int32 form), and a
shift past sqshrn's 16. Accumulators include exact ties of both roundings and values whose
16-bit narrow saturates."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tvm_armq.intrinsics import qmuls as q
from tvm_armq.intrinsics import requant as rq

VECTOR_LANES = (16, 4)  # two int16x8 registers per vector; one int16x4 (a 4-wide tile)
N = 1 << 14
HALF = 1 << 30  # 0.5 in Q0.31
SEED = 20261126

# (name, smallest shift, largest shift, zero point, clamp): the shift range decides the form
CONFIGS = [
    ("uniform8", -8, -8, 3, (-128, 127)),
    ("uniform1_relu", -1, -1, -128, (-128, 127)),
    ("uniform16_relu6", -16, -16, -5, (-5, 90)),
    ("spread", -12, -6, -20, (-128, 60)),
    ("spread_relu", -7, -1, 10, (10, 127)),
    ("past16", -22, -17, 0, (-128, 127)),
    ("too_wide", -13, -2, 7, (-100, 127)),  # 12 - 1 > 7: the int32 form
]
# the 16-bit form each config must take on aarch64 (too_wide: none, the int32 srshl)
FORM_ASM = {"uniform8": "sqrshrn", "uniform1_relu": "sqrshrn", "uniform16_relu6": "sqrshrn",
            "spread": "sqshrn", "spread_relu": "sqxtn", "past16": "sqshrn"}


def _operands(lo_shift: int, hi_shift: int):
    rng = np.random.default_rng(SEED + 31 * lo_shift + hi_shift)
    s = rng.integers(lo_shift, hi_shift, N, endpoint=True).astype(np.int32)
    m = rng.integers(HALF, (1 << 31) - 1, N, endpoint=True)
    m[: N // 8] = HALF  # exact halves: ties of the multiply and of the shift
    magnitude = np.floor(2.0 ** rng.uniform(0, 31, N)).astype(np.int64)
    x = np.minimum(magnitude, rq.INT32_MAX) * rng.choice([-1, 1], N)
    r = -s[: N // 8].astype(np.int64)
    odd = 2 * rng.integers(0, 1 << 12, N // 8) + 1
    x[: N // 8] = rng.choice([-1, 1], N // 8) * odd << r  # ties of the rounding shift
    return x.astype(np.int32), m.astype(np.int32), s


def _expected(x, m, s, zp, lo, hi):
    r = rq.multiply_by_quantized_multiplier(x, m, s, "double").astype(np.int64) + zp
    return np.clip(r, lo, hi).astype(np.int8)


def _kernel(name: str, lo_shift: int, hi_shift: int, zp: int, lo: int, hi: int,
            lanes: int = 16):
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def kernel(X: T.Buffer((N,), "int32"), M: T.Buffer((N,), "int32"),
               S: T.Buffer((N,), "int32"), Y: T.Buffer((N,), "int8")):
        T.func_attr({"tir.noalias": True})
        for io in range(N // lanes):
            for ii in T.vectorized(lanes):
                Y[io * lanes + ii] = q.requantize_narrow(
                    X[io * lanes + ii], M[io * lanes + ii],
                    q.bounded_shift(S[io * lanes + ii], hi_shift, lo_shift), zp, lo, hi)

    return kernel.with_attr("global_symbol", name)


def _funcs():
    return {f"{name}_x{lanes}": _kernel(f"{name}_x{lanes}", a, b, zp, *clamp, lanes=lanes)
            for name, a, b, zp, clamp in CONFIGS for lanes in VECTOR_LANES}


def test_split_of_shift_ranges():
    assert q._narrow_split(8, 8) == 7 and q._narrow_split(1, 1) == 0
    assert q._narrow_split(6, 12) == 5  # rest 1..7
    assert q._narrow_split(2, 13) is None  # rest up to 12: a saturated lane could land in range
    assert q._narrow_split(17, 22) == 16  # sqshrn shifts at most 16
    assert q._narrow_split(0, 3) is None  # shift 0 (or a left shift): nothing to round


def test_host_default_rule_is_exact():
    import tvm

    lib = tvm.compile(tvm.IRModule(_funcs()), target="llvm")
    for name, a, b, zp, (lo, hi) in CONFIGS:
        x, m, s = _operands(a, b)
        for lanes in VECTOR_LANES:
            out = tvm.runtime.tensor(np.zeros(N, np.int8))
            lib[f"{name}_x{lanes}"](*(tvm.runtime.tensor(v) for v in (x, m, s)), out)
            np.testing.assert_array_equal(out.numpy(), _expected(x, m, s, zp, lo, hi),
                                          err_msg=f"{name}, {lanes} lanes")


@pytest.mark.device
@pytest.mark.parametrize("level", ["neon", "i8mm"])
def test_on_device(run_funcs, level, tmp_path):
    funcs = _funcs()
    calls, expected = [], []
    for name, a, b, zp, (lo, hi) in CONFIGS:
        x, m, s = _operands(a, b)
        for lanes in VECTOR_LANES:
            calls.append((f"{name}_x{lanes}", [x, m, s], (N,), "int8"))
            expected.append(_expected(x, m, s, zp, lo, hi))
        # the cases reach the saturating narrow: some |x * m / 2**31| >> k are past int16
        assert (np.abs(x.astype(np.int64) * m >> 31) >> 16).any()
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "requantize_narrow.so")
    for (name, *_), want, got in zip(calls, expected, outs):
        np.testing.assert_array_equal(got, want, err_msg=f"{name} at {level}")


def test_forms_by_shift_range():
    """Each config compiled alone for aarch64: the 16-bit form its shift range allows, the
    rounding shift on int16 lanes (srshl .8h) unless one shift serves every lane, and the
    int32 srshl for the range too wide to narrow first."""
    import tvm

    from tvm_armq import targets

    for (name, a, b, zp, clamp), lanes in itertools.product(CONFIGS, VECTOR_LANES):
        func = _kernel(name, a, b, zp, *clamp, lanes=lanes)
        asm = tvm.compile(tvm.IRModule({name: func}), target=targets.resolve("neon")) \
            .mod.inspect_source("asm")
        what = f"{name}, {lanes} lanes"
        if name in FORM_ASM:
            assert f"{FORM_ASM[name]}\tv" in asm, f"{what}: no {FORM_ASM[name]}"
            per_lane = "srshl\tv" in asm
            assert per_lane == (FORM_ASM[name] != "sqrshrn"), what
            assert ".4s" not in "".join(l for l in asm.splitlines() if "srshl" in l), what
            if lanes == 4:  # the 4 bytes leave as one word, no shuffle with an undefined half
                assert "uzp1" not in asm and "zip1" not in asm, f"{what}: a lane shuffle"
        else:
            assert "sqshrn" not in asm and "sqrshrn" not in asm and "srshl\tv" in asm, what
