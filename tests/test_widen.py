"""``intrinsics.widen.widening_mul``: the int32 product of two int16 values, exact on x86
(the default rule) and on the emulated device (smull), for every sign and the extremes
(-32768 * -32768 = 2**30)."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_armq.intrinsics.widen import widening_mul

N = 64
LANES = (16, 4, 1)  # four smull registers, one, and the scalar (default rule) form


def _kernel(name: str, lanes: int):
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def kernel(a: T.Buffer((N,), "int16"), b: T.Buffer((N,), "int16"),
               out: T.Buffer((N,), "int32")):
        T.func_attr({"tir.noalias": True})
        for io in range(N // lanes):
            for ii in T.vectorized(lanes):
                out[io * lanes + ii] = widening_mul(a[io * lanes + ii], b[io * lanes + ii])

    return kernel.with_attr("global_symbol", name)


def _operands():
    rng = np.random.default_rng(3)
    a = rng.integers(-32768, 32767, N, endpoint=True).astype(np.int16)
    b = rng.integers(-32768, 32767, N, endpoint=True).astype(np.int16)
    a[:4], b[:4] = [-32768, -32768, 32767, -1], [-32768, 32767, 32767, -32768]
    return a, b


def _module():
    import tvm

    return tvm.IRModule({f"mul{lanes}": _kernel(f"mul{lanes}", lanes) for lanes in LANES})


def test_widening_mul_checks_its_operands():
    from tvm import tirx

    with pytest.raises(TypeError, match="must be int16"):
        widening_mul(tirx.const(1, "int32"), tirx.const(1, "int16"))
    with pytest.raises(TypeError, match="lanes"):
        widening_mul(tirx.const(1, "int16x4"), tirx.const(1, "int16x8"))


def test_x86_build_is_exact():
    import tvm

    lib = tvm.compile(_module(), target="llvm")
    a, b = _operands()
    want = a.astype(np.int32) * b.astype(np.int32)
    for lanes in LANES:
        out = tvm.runtime.tensor(np.zeros(N, np.int32))
        lib[f"mul{lanes}"](tvm.runtime.tensor(a), tvm.runtime.tensor(b), out)
        np.testing.assert_array_equal(out.numpy(), want, err_msg=f"{lanes} lanes")


@pytest.mark.device
def test_smull_on_device(run_funcs, tmp_path):
    a, b = _operands()
    funcs = {f"mul{lanes}": _kernel(f"mul{lanes}", lanes) for lanes in LANES}
    calls = [(name, [a, b], (N,), "int32") for name in funcs]
    asm, outs = run_funcs("neon", funcs, calls, tmp_path / "widen.so")
    assert "smull\tv" in asm and "smull2\tv" in asm
    assert not any(line.split()[:1] == ["mul"] and ".4s" in line for line in asm.splitlines()), \
        "a 32-bit vector multiply where smull was asked for"
    want = a.astype(np.int32) * b.astype(np.int32)
    for (name, *_), got in zip(calls, outs):
        np.testing.assert_array_equal(got, want, err_msg=name)
