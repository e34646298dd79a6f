"""8-bit unary ops as tables (``schedules.lut``): LOGISTIC, TANH, EXP, GELU (both forms),
HARD_SWISH, LEAKY_RELU, RELU, RELU6, RELU_N1_TO_1, RSQRT and the converter's float island
DEQUANTIZE -> NEG -> QUANTIZE, bit-exact against TFLite's reference kernels.

Two layers of evidence:

1. Host: each op's 256-entry table (TFLite's arithmetic, written out in NumPy) equals what
   TFLite's ``BUILTIN_REF`` kernel outputs for every one of the 256 input values, on
   single-op models written with ``frontend.writer``, over a seeded sweep of input scales
   across four decades, output scales around them and zero points over the whole range
   (the extremes included), for int8 and uint8 (EXP: int8; RSQRT: int8, and only the
   inputs at or above the zero point, the ones TFLite agrees to run on).
2. Device, the kernel alone (``lut_func``): every one of the 256 input values through a
   random table, for both dtypes and for sizes below one 16-byte vector, with a partial
   last vector and over several parallel tasks; each output equals ``table[x - min]`` and
   the code is the ``tbl``/``tbx`` lookup.
3. Device, at every ISA level: single-op models of each op, shapes with a remainder to
   the 16-lane vector, compiled with ``compile_tflite`` (the pass must lower the op to the
   table kernel: checked in the report, no float fallback) and run on the emulated
   device; every output equals TFLite's.
"""

from __future__ import annotations

import numpy as np
import pytest
from armq_checks import (assert_alive, assert_exact, assert_functions_use, one_level_in_turn,
                         tier)

from tvm_armq import build, export
from tvm_armq.frontend.layers import (ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1,
                                      activation_range)
from tvm_armq.frontend.model import TFLiteModel
from tvm_armq.frontend.writer import single_op_model
from tvm_armq.schedules import lut
from tvm_armq.targets import LEVELS
from tvm_armq.report import Fallback

# TFLite's fixed output quantization of its 8-bit LOGISTIC and TANH kernels
FIXED_OUTPUT = {("LOGISTIC", "int8"): (1 / 256, -128), ("LOGISTIC", "uint8"): (1 / 256, 0),
                ("TANH", "int8"): (1 / 128, 0), ("TANH", "uint8"): (1 / 128, 128)}
# the RELU family's clamp, as the pass computes it (frontend.layers.activation_range)
RELU_ACTIVATIONS = {"RELU": ACT_RELU, "RELU6": ACT_RELU6, "RELU_N1_TO_1": ACT_RELU_N1_TO_1}
HOST_DRAWS = 20  # random (scale, zero point) draws per op and dtype, plus the edge cases


def unary_model(op: str, shape, in_q, out_q, dtype: str, options=None) -> bytes:
    """A .tflite with the one unary op ``op`` (LEAKY_RELU with its ``alpha``, GELU with its
    ``approximate`` from ``options``); a float island (``lut.ISLAND_FUNCTIONS``) as the
    converter leaves it: DEQUANTIZE -> the float op -> QUANTIZE."""
    import tflite

    from tvm_armq.frontend.writer import Operator, graph_model
    from tvm_armq.frontend.writer import options as tflite_options

    options = options or {}
    code = getattr(tflite.BuiltinOperator, op)
    if op in lut.ISLAND_FUNCTIONS:
        tensors = [dict(shape=shape, dtype=dtype, q=in_q), dict(shape=shape, dtype="float32"),
                   dict(shape=shape, dtype="float32"), dict(shape=shape, dtype=dtype, q=out_q)]
        return graph_model(tensors, [Operator(tflite.BuiltinOperator.DEQUANTIZE, (0,), (1,)),
                                     Operator(code, (1,), (2,), version=1),
                                     Operator(tflite.BuiltinOperator.QUANTIZE, (2,), (3,))],
                           [0], [3])
    built = {"LEAKY_RELU": lambda: tflite_options("LeakyReluOptions", Alpha=options["alpha"]),
             "GELU": lambda: tflite_options("GeluOptions", Approximate=options["approximate"]),
             }.get(op, lambda: None)()
    tensors = [dict(shape=shape, dtype=dtype, q=in_q), dict(shape=shape, dtype=dtype, q=out_q)]
    return single_op_model(code, tensors, [0], [1], built, version=1)


def draw_case(op: str, dtype: str, rng: np.random.RandomState, zp_in=None, zp_out=None):
    """(in_q, out_q, options) for one random draw: input scale 1e-3..3 (1e-3..0.1 for
    LOGISTIC / TANH, whose output saturates past |x| ~ 8: a scale of 0.1 spans +-12), output
    scale within a decade of it (TFLite's fixed one for LOGISTIC / TANH), zero points
    in the middle half of the range."""
    info = np.iinfo(dtype)
    top = -1.0 if (op, dtype) in FIXED_OUTPUT else 0.5
    s_in = float(np.float32(10 ** rng.uniform(-3, top)))
    mid = (int(info.min) + int(info.max)) // 2  # random zero points in the middle half of
    # the range, so the output is not saturated (the edges are cases of their own)
    zp_in = mid + int(rng.randint(-64, 64)) if zp_in is None else zp_in
    if (op, dtype) in FIXED_OUTPUT:
        out_q = FIXED_OUTPUT[(op, dtype)]
    elif op == "EXP":  # inputs up to about e**3, the output scale fitted to the largest
        s_in = float(np.float32(10 ** rng.uniform(-3, -1.3)))
        top = np.exp(s_in * (int(info.max) - zp_in))
        s_out = float(np.float32(top / 255 * 10 ** rng.uniform(-0.2, 0.2)))
        out_q = (s_out, int(info.min) + int(rng.randint(0, 32)) if zp_out is None else zp_out)
    elif op == "RSQRT":  # 1 / sqrt(s_in * v) for v in [1, 255] spans about the output range
        zp_in = int(rng.randint(info.min, 0)) if zp_in is None else zp_in
        s_out = float(np.float32(10 ** rng.uniform(-0.3, 0.3) / (np.sqrt(s_in) * 127)))
        out_q = (s_out, int(info.min) + int(rng.randint(0, 64)) if zp_out is None else zp_out)
    else:
        s_out = float(np.float32(s_in * 10 ** rng.uniform(-1, 1)))
        out_q = (s_out, mid + int(rng.randint(-64, 64)) if zp_out is None else zp_out)
    options = {"alpha": float(np.float32(rng.uniform(-1, 1.5)))} if op == "LEAKY_RELU" else \
        {"approximate": bool(rng.randint(2))} if op == "GELU" else {}
    if op in RELU_ACTIVATIONS:
        options = {"act_range": activation_range(RELU_ACTIVATIONS[op], *out_q, dtype)}
    return (s_in, zp_in), out_q, options


def host_cases():
    rng = np.random.RandomState(20261124)
    for op in lut.OPS:
        for dtype in lut.dtypes(op):
            info = np.iinfo(dtype)
            for i in range(HOST_DRAWS):
                yield op, dtype, draw_case(op, dtype, rng), True
            for zp in (int(info.min), int(info.max)):  # zero points at both edges (the
                # output may saturate to one value there: equal, but not necessarily alive)
                yield op, dtype, draw_case(op, dtype, rng, zp_in=zp, zp_out=zp), False


@pytest.mark.parametrize("op", lut.OPS)
def test_tables_equal_tflite_on_every_input_value(op):
    every_value = {dtype: np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1)
                   .astype(dtype).reshape(1, 16, 16) for dtype in lut.DTYPES}
    checked = lively = 0
    for case_op, dtype, (in_q, out_q, options), alive in host_cases():
        if case_op != op:
            continue
        model = TFLiteModel.load(unary_model(op, (1, 16, 16), in_q, out_q, dtype, options))
        x = every_value[dtype]
        if op == "RSQRT":  # TFLite refuses inputs below the zero point: repeat the others
            x = np.resize(x.ravel()[x.ravel() >= in_q[1]], x.shape)
        expected = model.reference_outputs([x])[0].ravel()
        got = lut.table(op, in_q, out_q, dtype, **options)[x.ravel() - np.iinfo(dtype).min]
        assert np.array_equal(got, expected), (op, dtype, in_q, out_q, options)
        if alive and len(np.unique(expected)) > 4:
            lively += 1
        checked += 1
    assert checked == len(lut.dtypes(op)) * (HOST_DRAWS + 2)
    # A table of a few values (all saturated) proves little: most random draws must vary.
    assert lively >= 0.75 * len(lut.dtypes(op)) * HOST_DRAWS, \
        f"only {lively} draws have outputs that vary"


# a vector's worth and less, one vector and a remainder, several parallel tasks and a
# remainder (lut.BLOCK_VECTORS vectors each)
KERNEL_SHAPES = [(1, 9), (16,), (1, 5, 7, 19), (2, lut.BLOCK_VECTORS * lut.LANES + 3)]


@pytest.mark.device
@pytest.mark.parametrize("dtype", lut.DTYPES)
def test_table_kernel_looks_up_every_value_on_the_device(run_funcs, level, dtype, tmp_path):
    rng = np.random.RandomState(3)
    info = np.iinfo(dtype)
    table = rng.randint(info.min, info.max + 1, lut.TABLE_SIZE).astype(dtype)
    funcs, calls, inputs = {}, [], []
    for i, shape in enumerate(KERNEL_SHAPES):
        x = rng.randint(info.min, info.max + 1, shape).astype(dtype)
        flat = x.reshape(-1)
        every = np.arange(info.min, info.max + 1).astype(dtype)[:flat.size]
        flat[:every.size] = rng.permutation(every)  # every value, where the size allows
        funcs[f"lut{i}"] = lut.lut_func(shape, dtype)
        calls.append((f"lut{i}", [x, table], shape, dtype))
        inputs.append(x)
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "lut.so")
    # every kernel of a vector's worth of elements or more looks up through tbl / tbx (one
    # of fewer elements, (1, 9), looks its elements up one at a time)
    vectorized = [f"lut{i}" for i, shape in enumerate(KERNEL_SHAPES)
                  if np.prod(shape) >= lut.LANES]
    assert len(vectorized) == len(KERNEL_SHAPES) - 1
    assert_functions_use(asm, vectorized, ["tbl", "tbx"], f"lut kernels {dtype} at {level}")
    assert len(outs) == len(inputs)
    for x, got in zip(inputs, outs):
        want = table[x.astype(np.int32) - info.min]
        assert_alive(want, f"{dtype} {x.shape} at {level}")
        np.testing.assert_array_equal(got, want, err_msg=f"{dtype} {x.shape} at {level}")


# shapes: a remainder to 16 lanes, fewer than 16, several outer rows, rank 2
DEVICE_SHAPES = [(1, 5, 7, 19), (1, 9), (3, 33), (2, 4, 4, 16)]
DEVICE_SEEDS = (0, 1)
LIVE_DRAWS = 200  # draws tried for a case whose outputs are alive on every seed


def _inputs(model: TFLiteModel, op: str, in_q, seed: int) -> list[np.ndarray]:
    x = model.random_inputs(seed=seed)
    if op == "RSQRT":  # TFLite refuses inputs below the zero point
        x = [np.maximum(v, in_q[1]).astype(v.dtype) for v in x]
    return x


def live_case(op: str, dtype: str, shape, rng: np.random.RandomState):
    """(model, in_q) of the first random draw whose TFLite outputs are alive
    (``assert_alive``) on every one of ``DEVICE_SEEDS``: a draw whose clamp or scale
    leaves one or a few values (RELU_N1_TO_1 at a coarse output scale) would pass the
    comparison by saying nothing."""
    for _ in range(LIVE_DRAWS):
        in_q, out_q, options = draw_case(op, dtype, rng)
        model = TFLiteModel.load(unary_model(op, shape, in_q, out_q, dtype, options))
        try:
            for seed in DEVICE_SEEDS:
                for i, e in enumerate(model.reference_outputs(_inputs(model, op, in_q, seed))):
                    assert_alive(e, f"{op} {dtype} output {i}")
        except AssertionError:
            continue
        return model, in_q
    raise AssertionError(f"{op} {dtype} {shape}: none of {LIVE_DRAWS} draws has live outputs")


# The models' kernels are lut_s8_neon / lut_u8_neon at every level: the fast tier runs them
# at one level, the exhaustive tier at the others.
UNARY_LEVELS = [tier(level, id=level, fast=level == one_level_in_turn(0)) for level in LEVELS]


@pytest.mark.device
@pytest.mark.parametrize("level", UNARY_LEVELS)
def test_unary_ops_run_bit_exact_on_the_device(devices, level, tmp_path):
    rng = np.random.RandomState(7)
    built = []
    for i, op in enumerate(lut.OPS):
        for dtype in lut.dtypes(op) if op in ("HARD_SWISH", "LOGISTIC") else ("int8",):
            shape = DEVICE_SHAPES[(i + len(built)) % len(DEVICE_SHAPES)]
            model, in_q = live_case(op, dtype, shape, rng)
            report: list = []
            lib = export.export_aarch64(build.compile_tflite(model, level, report=report),
                                       tmp_path / f"{op.lower()}_{dtype}.so")
            assert [r.kernel for r in report] == [f"lut_{'s8' if dtype == 'int8' else 'u8'}"
                                                  "_neon"], [r.line() for r in report]
            assert not any(isinstance(r, Fallback) for r in report)
            built.append((op, dtype, model, lib, in_q))
    session = devices.session(level)
    for op, dtype, model, lib, in_q in built:
        run = build.DeviceModel(session, lib)
        for seed in DEVICE_SEEDS:
            x = _inputs(model, op, in_q, seed)
            what = f"{op} {dtype} at {level}, seed {seed}"
            assert_exact(run(x), model.reference_outputs(x), what)
