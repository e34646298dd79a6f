"""``lane_dot.lane_dot4``: its default rule against NumPy on the host, the byte order its
aarch64 rule hands ``sdot``, and the instructions that rule compiles to. (On the device,
bit-exact, it runs in test_depthwise's sdot cases.)"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.tirx import Shuffle, Var

from tvm_armq import targets
from tvm_armq.intrinsics import lane_dot


def _func(n: int, block: int):
    x = te.placeholder((lane_dot.TAPS, n), "int8", "x")
    w = te.placeholder((lane_dot.TAPS, n), "int8", "w")
    acc = te.placeholder((n,), "int32", "acc")
    out = te.compute((n,), lambda c: lane_dot.lane_dot4(
        acc[c].asobject(), [x[t, c].asobject() for t in range(lane_dot.TAPS)],
        [w[t, c].asobject() for t in range(lane_dot.TAPS)]), name="out")
    sch = tvm.s_tir.Schedule(te.create_prim_func([x, w, acc, out]))
    (c,) = sch.get_loops(sch.get_sblock("out"))
    sch.vectorize(sch.split(c, [None, block])[1])
    return sch.mod


@pytest.mark.parametrize("n, block", [(48, 16), (24, 8), (20, 4)])
def test_default_rule_is_the_exact_sum(n, block):
    """On the host (the default rule), for 16 lanes and for the lane counts the aarch64
    rule leaves to it: acc + the four products, wrapping as int32 does."""
    rng = np.random.default_rng(n)
    x = rng.integers(-128, 127, (4, n), endpoint=True, dtype=np.int8)
    w = rng.integers(-128, 127, (4, n), endpoint=True, dtype=np.int8)
    x[:, :4], w[:, :4] = -128, -128  # the largest sum: 4 * 2**14 on top of acc
    acc = rng.integers(-2**31, 2**31 - 1, n, endpoint=True, dtype=np.int64).astype(np.int32)
    acc[:2] = 2**31 - 1  # wraps past the top
    lib = tvm.compile(_func(n, block), target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.empty((n,), "int32", dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in (x, w, acc)), out)
    want = (acc.astype(np.int64) + (x.astype(np.int64) * w).sum(axis=0) + 2**31) % 2**32 - 2**31
    np.testing.assert_array_equal(out.numpy(), want.astype(np.int32))


def _bytes(e, leaves):
    """What each byte of a (nested) Shuffle of ``leaves`` is: (leaf index, lane)."""
    if not isinstance(e, Shuffle):
        return [(leaves.index(e), i) for i in range(16)]
    flat = [b for v in e.vectors for b in _bytes(v, leaves)]
    return [flat[int(i)] for i in e.indices]


def test_aarch64_rule_hands_sdot_four_taps_per_channel():
    """Register k of the interleaved operand holds channels 4k .. 4k+3, each as its four
    taps in order: the bytes one sdot lane sums."""
    leaves = [Var(f"x{t}", "int8x16") for t in range(lane_dot.TAPS)]
    regs = lane_dot._interleaved(leaves, 16)
    assert len(regs) == 4
    for k, reg in enumerate(regs):
        assert _bytes(reg, leaves) == [(tap, 4 * k + c) for c in range(4) for tap in range(4)]
    call = lane_dot.lane_dot4(Var("acc", "int32x16"), leaves, leaves)
    lowered = lane_dot.lower_aarch64(call)
    sdots = [p for p in lowered.vectors if getattr(p, "op", None) is not None]
    assert len(sdots) == 4
    sdot_id = tvm.target.codegen.llvm_lookup_intrinsic_id(lane_dot.SDOT)
    assert all(p.op.name == "tirx.call_llvm_pure_intrin" and p.args[0].value == sdot_id
               for p in sdots)
    narrow = lane_dot.lane_dot4(Var("acc8", "int32x8"), [Var("y", "int8x8")] * 4,
                                [Var("v", "int8x8")] * 4)
    assert lane_dot.lower_aarch64(narrow).same_as(narrow)  # left to the default rule
    with pytest.raises(TypeError, match="int8"):
        lane_dot.lane_dot4(Var("a", "int32x16"), [Var("z", "int16x16")] * 4, leaves)


def test_aarch64_code_is_zips_and_sdot():
    """Compiled for dotprod: per 16 lanes four vector-form sdot, fed by zip1/zip2 of bytes
    and of halfwords (no table lookup)."""
    asm = tvm.compile(_func(16, 16), target=targets.resolve("dotprod")).mod.inspect_source("asm")
    assert len(re.findall(r"\bsdot\s+v\d+\.4s, v\d+\.16b, v\d+\.16b\n", asm)) == 4
    for size in ("16b", "8h"):
        assert re.search(rf"\bzip1\s+v\d+\.{size}", asm) and re.search(rf"\bzip2\s+v\d+\.{size}",
                                                                         asm)
    assert not re.search(r"\btbl\s", asm)
