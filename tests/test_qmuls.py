"""``qmuls`` is TFLite's requantization, bit for bit, in both of its lowerings.

The chain of evidence, from TFLite down to the instructions:

1. host: ``requant.quantize_multiplier`` follows TFLite's ``QuantizeMultiplier`` on
   hand-picked scales, and ``requant.multiply_by_quantized_multiplier`` agrees with exact
   integer arithmetic written from the definitions;
2. host: the two together reproduce a real TFLite convolution (the zoo's conv2d_3x3, run by
   TFLite's reference kernels) with zero differences in double rounding, while single
   rounding differs: the reference kernels round twice;
3. device, each ISA level: 2**20 random (x, m, s) triples plus edges (INT32_MIN/MAX,
   m = 2**31-1 and 2**30, every shift, exact ties of both signs) go through the int32x4,
   int32x8 (split) and scalar aarch64 lowerings, the constant-shift forms and the 64-bit
   default lowering forced on aarch64; everything equals the NumPy reference;
4. the aarch64 code really is sqrdmulh + srshl, and the x86 build (default lowering) is exact.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tvm_armq import export
from tvm_armq.intrinsics import requant as rq
from tvm_armq.intrinsics.qmuls import OP_NAMES, portable_lowering, qmuls, qmuls_relu
from tvm_armq.targets import LEVELS

pytestmark = pytest.mark.device

MODES = ("double", "single")
# The kernels' forms: each rounding mode's qmuls, and qmuls_relu (double rounding, floored
# at 0: the fixup for negative ties left out).
FORMS = MODES + ("relu",)
N_RANDOM = 1 << 20  # random triples per run, over 10**6
VECTOR_LANES = 4  # the int32x4 NEON form
WIDE_LANES = 8  # int32x8: lowered as two int32x4 pieces
NARROW_LANES = 2  # int32x2: the 64-bit NEON registers
N_CONST = 4096  # (x, m) pairs run through every constant shift
N_CONV_INPUTS = 8  # random inputs of the TFLite convolution (16x16x16 outputs each)
SEED = 20240601
Q_ONE = 1 << 31  # 1.0 in Q0.31
HALF = 1 << 30  # 0.5 in Q0.31


def _rounding(form: str) -> str:
    return "double" if form == "relu" else form


def _qmuls_of(form: str):
    """The TIR builder of a form: qmuls with its rounding, or qmuls_relu."""
    if form == "relu":
        return qmuls_relu
    return lambda x, m, q, s: qmuls(x, m, q, s, form)


def _shifts(form: str) -> np.ndarray:
    """Every shift the form is defined for (what QuantizeMultiplier gives for usable scales)."""
    return np.arange(rq.MIN_SHIFT, rq.MAX_SHIFT[_rounding(form)] + 1, dtype=np.int32)


# ------------------------------------------------------------------------------ data
SPECIAL_X = [rq.INT32_MIN, rq.INT32_MIN + 1, -HALF, -65536, -255, -2, -1, 0, 1, 2, 255, 65535,
             HALF, rq.INT32_MAX - 1, rq.INT32_MAX]
SPECIAL_M = [rq.INT32_MAX, HALF, HALF + 1, 3 << 29, 1518500250, rq.INT32_MIN, -HALF, -1, 0, 1]


def _tie_cases(rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x = +-odd * 2**t with m = 0.5 or 0.75 (Q0.31) and shifts around -t: exact halves.

    With m = 2**30, ``a * m / 2**31 = a / 2``: odd ``a`` is a tie of the multiply, and
    ``a = odd * 2**t`` with ``s = -t`` a tie of the rounding shift (and of single rounding).
    """
    xs, ms, ss = [], [], []
    for t in range(31):
        odd = 2 * rng.integers(0, max(1, (1 << (30 - t)) - 1), 6) + 1
        for sign in (1, -1):
            x = sign * odd * (1 << t)
            for m in (HALF, 3 << 29):
                for s in range(-t - 1, -t + 3):
                    if rq.MIN_SHIFT <= s <= rq.MAX_SHIFT["single"]:
                        xs.append(x)
                        ms.append(np.full(x.shape, m))
                        ss.append(np.full(x.shape, s))
    return (np.concatenate(xs).astype(np.int32), np.concatenate(ms).astype(np.int32),
            np.concatenate(ss).astype(np.int32))


def _edge_cases() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every special x with every special m at every shift of double rounding."""
    x, m, s = np.meshgrid(np.array(SPECIAL_X, np.int64), np.array(SPECIAL_M, np.int64),
                          _shifts("double").astype(np.int64), indexing="ij")
    return x.ravel().astype(np.int32), m.ravel().astype(np.int32), s.ravel().astype(np.int32)


def _random_cases(rng, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Half uniform int32, half accumulator-like (log-uniform magnitudes); multipliers
    mostly in QuantizeMultiplier's [2**30, 2**31), the rest any int32; shifts uniform."""
    half = n // 2
    uniform = rng.integers(rq.INT32_MIN, rq.INT32_MAX, half, endpoint=True)
    magnitude = np.floor(2.0 ** rng.uniform(0, 31, n - half)).astype(np.int64)
    signs = rng.choice([-1, 1], n - half)
    x = np.concatenate([uniform, np.minimum(magnitude, rq.INT32_MAX) * signs])
    m = np.where(rng.random(n) < 0.75, rng.integers(HALF, Q_ONE, n),
                 rng.integers(rq.INT32_MIN, rq.INT32_MAX, n, endpoint=True))
    s = rng.integers(rq.MIN_SHIFT, rq.MAX_SHIFT["single"], n, endpoint=True)
    return x.astype(np.int32), m.astype(np.int32), s.astype(np.int32)


class Cases:
    """Inputs and NumPy answers of the x86 and device runs (built once per module)."""

    def __init__(self):
        rng = np.random.default_rng(SEED)
        parts = [_edge_cases(), _tie_cases(rng), _random_cases(rng, N_RANDOM)]
        self.x, self.m, s = (np.concatenate(p) for p in zip(*parts))
        pad = -len(self.x) % WIDE_LANES  # whole int32x8 vectors
        self.x, self.m, s = (np.concatenate([a, np.zeros(pad, np.int32)]) for a in
                             (self.x, self.m, s))
        self.n = len(self.x)
        # Shift 31 exists for double rounding only: single rounding gets 30 there instead.
        self.s = {"double": s, "single": np.minimum(s, rq.MAX_SHIFT["single"]).astype(np.int32)}
        self.want = {r: rq.multiply_by_quantized_multiplier(self.x, self.m, self.s[r], r)
                     for r in MODES}
        self.s["relu"] = self.s["double"]
        self.want["relu"] = np.maximum(self.want["double"], 0)
        # A smaller (x, m) set for the constant-shift kernels: edges first, then random.
        cx, cm, _ = _edge_cases()
        rx, rm, _ = _random_cases(rng, N_CONST)
        self.cx = np.concatenate([cx, rx])[:N_CONST]
        self.cm = np.concatenate([cm, rm])[:N_CONST]
        self.cwant = {r: rq.multiply_by_quantized_multiplier(
            self.cx[None, :], self.cm[None, :], _shifts(r)[:, None], r) for r in MODES}
        self.cwant["relu"] = np.maximum(self.cwant["double"], 0)


@pytest.fixture(scope="module")
def cases():
    return Cases()


# --------------------------------------------------------------------------- kernels
def _elementwise(name: str, n: int, form: str, lanes: int):
    """Y[i] = qmuls(X[i], M[i], 31, S[i]): per-element multipliers and shifts, ``lanes`` wide
    (the ``form``'s qmuls: ``_qmuls_of``).

    Indices are written out rather than bound to a name: a ``let`` inside a vectorized loop
    makes TVM's VectorizeLoop fall back to a scalar loop without a word.
    """
    from tvm.script import tirx as T

    op = _qmuls_of(form)

    @T.prim_func
    def kernel(X: T.Buffer((n,), "int32"), M: T.Buffer((n,), "int32"),
               S: T.Buffer((n,), "int32"), Y: T.Buffer((n,), "int32")):
        T.func_attr({"tir.noalias": True})
        for io in range(n // lanes):
            for ii in T.vectorized(lanes):
                Y[io * lanes + ii] = op(X[io * lanes + ii], M[io * lanes + ii], 31,
                                        S[io * lanes + ii])

    return kernel.with_attr("global_symbol", name)


def _every_constant_shift(name: str, n: int, form: str, lanes: int):
    """Y[k, i] = qmuls(X[i], M[i], 31, lowest + k) for every shift, each k a constant.

    The k loop is unrolled before intrinsics are lowered, so each shift reaches the
    lowering as a literal and takes the constant-shift form (immediate shifts).
    """
    from tvm.script import tirx as T

    shifts = _shifts(form)
    count, lowest = len(shifts), int(shifts[0])
    op = _qmuls_of(form)

    @T.prim_func
    def kernel(X: T.Buffer((n,), "int32"), M: T.Buffer((n,), "int32"),
               Y: T.Buffer((count, n), "int32")):
        T.func_attr({"tir.noalias": True})
        for k in T.unroll(count):
            for io in range(n // lanes):
                for ii in T.vectorized(lanes):
                    Y[k, io * lanes + ii] = op(X[io * lanes + ii], M[io * lanes + ii], 31,
                                               k + lowest)

    return kernel.with_attr("global_symbol", name)


def _module(n: int):
    """Every kernel of the device run, by name: (kind, form, lanes)."""
    import tvm

    kernels = {}
    for r in FORMS:
        for lanes, tag in ((VECTOR_LANES, "v4"), (WIDE_LANES, "v8"), (NARROW_LANES, "v2"),
                          (1, "scalar")):
            kernels[f"{tag}_{r}"] = ("elementwise", r, lanes)
        for lanes, tag in ((VECTOR_LANES, "const_v4"), (1, "const_scalar")):
            kernels[f"{tag}_{r}"] = ("constant", r, lanes)
    funcs = {}
    for name, (kind, r, lanes) in kernels.items():
        make = _elementwise if kind == "elementwise" else _every_constant_shift
        funcs[name] = make(name, n if kind == "elementwise" else N_CONST, r, lanes)
    return tvm.IRModule(funcs), kernels


def _compile(mod, target, portable: bool = False):
    import tvm

    if portable:
        with portable_lowering():
            return tvm.compile(mod, target=target)
    return tvm.compile(mod, target=target)


def _assert_exact(got, want, what, x, m, s):
    bad = np.argwhere(got != want)
    if bad.size:
        i = tuple(bad[0])
        j = i[-1]
        shift = s[i[0]] if np.ndim(s) == 1 and np.ndim(got) == 2 else s[j]
        raise AssertionError(
            f"{what}: {len(bad)} of {got.size} results differ from TFLite's arithmetic; first: "
            f"x={x[j]} m={m[j]} s={shift} -> {got[i]}, expected {want[i]}")


def _check_all(run, cases: Cases, kernels, label: str, only=None):
    """Run each kernel through ``run(name, *arrays)`` and compare with the reference."""
    for name, (kind, r, _) in kernels.items():
        if only and name not in only:
            continue
        if kind == "elementwise":
            got = run(name, cases.x, cases.m, cases.s[r], np.zeros(cases.n, np.int32))
            _assert_exact(got, cases.want[r], f"{label} {name}", cases.x, cases.m, cases.s[r])
        else:
            shifts = _shifts(r)
            got = run(name, cases.cx, cases.cm, np.zeros((len(shifts), N_CONST), np.int32))
            _assert_exact(got, cases.cwant[r], f"{label} {name}", cases.cx, cases.cm, shifts)


# ------------------------------------------------------------------ host: reference
@pytest.mark.parametrize("scale, rounding, expected", [
    (0.0, "double", (0, 0)),
    (0.5, "double", (1 << 30, 0)),
    (0.75, "double", (3 << 29, 0)),
    (0.1, "double", (1717986918, -3)),  # 0.8 * 2**31 = 1717986918.4, rounds down
    (1 / 3, "double", (1431655765, -1)),
    (-0.75, "double", (-(3 << 29), 0)),
    (2.0 ** -31, "double", (1 << 30, -30)),
    (2.0 ** -32, "double", (1 << 30, -31)),  # the smallest shift kept
    (2.0 ** -33, "double", (0, 0)),  # shift -32 < -31: flushed to zero
    (1e-12, "double", (0, 0)),
    (0.5 + 2.0 ** -32, "double", ((1 << 30) + 1, 0)),  # exactly 2**30 + 0.5: away from zero
    (1 - 2.0 ** -33, "double", (1 << 30, 1)),  # rounds up to 2**31: halved, shift + 1
    (1 - 2.0 ** -32, "double", (1 << 30, 1)),  # 2**31 - 0.5, a tie, also rounds up
    (0.5 - 2.0 ** -34, "double", (1 << 30, 0)),
    (1.0, "double", (1 << 30, 1)),
    (3.0, "double", (3 << 29, 2)),
    (2.0 ** 29, "double", (1 << 30, 30)),
    (2.0 ** 30, "double", (1 << 30, 31)),
    (1e10, "double", (1250000000, 34)),  # 1e10 = (1e10 / 2**34) * 2**34, 1e10 / 8 exact
    (2.0 ** 29, "single", (1 << 30, 30)),
    (2.0 ** 30, "single", (rq.INT32_MAX, 30)),  # single rounding saturates shifts > 30
    (1e10, "single", (rq.INT32_MAX, 30)),
    (0.1, "single", (1717986918, -3)),
    (2.0 ** -33, "single", (0, 0)),
])
def test_quantize_multiplier_follows_tflite(scale, rounding, expected):
    assert rq.quantize_multiplier(scale, rounding) == expected


def test_quantize_multiplier_shift_range():
    """Over scales 2**-40 .. 2**40: double rounding's shift is frexp's exponent (one more when
    the multiplier rounded up to 2**31), 0 with multiplier 0 below 2**-32; single rounding is
    the same up to shift 30 and saturates above. Multipliers lie in [2**30, 2**31)."""
    rng = np.random.default_rng(SEED)
    exponents = np.arange(2000) % 81 - 40
    scales = np.ldexp(rng.uniform(0.5, 1.0, exponents.size), exponents)
    seen = set()
    for scale in scales:
        exponent = math.frexp(scale)[1]
        mult, shift = rq.quantize_multiplier(scale, "double")
        if exponent < rq.MIN_SHIFT:
            assert (mult, shift) == (0, 0)
        else:
            assert HALF <= mult < Q_ONE and shift - exponent in (0, 1)
            assert abs(mult * 2.0 ** (shift - 31) - scale) <= 2.0 ** (shift - 32)
            seen.add(shift)
        single = rq.quantize_multiplier(scale, "single")
        capped = shift > rq.MAX_SHIFT["single"]
        assert single == ((rq.INT32_MAX, rq.MAX_SHIFT["single"]) if capped else (mult, shift))
    assert min(seen) == rq.MIN_SHIFT and max(seen) > rq.MAX_SHIFT["double"]


def _exact(x: int, m: int, s: int, rounding: str) -> int:
    """One (x, m, s) in Python integers, from the definitions rather than from gemmlowp's code:
    round half up is floor(v + 1/2), round half away from zero works on |v|."""
    def wrap32(v):
        return (v - rq.INT32_MIN) % (1 << 32) + rq.INT32_MIN

    if rounding == "single":  # x * m / 2**(31 - s), rounded half up once
        return wrap32((x * m + (1 << (30 - s))) // (1 << (31 - s)))
    a = wrap32(x << max(s, 0))
    if a == m == rq.INT32_MIN:  # 2 * a * m = 2**63: the one product that saturates
        h = rq.INT32_MAX
    else:  # a * m / 2**31 rounded half up
        h = (a * m + (1 << 30)) // (1 << 31)
    e = max(-s, 0)
    q, r = divmod(abs(h), 1 << e)  # |h| / 2**e rounded half up, sign restored: away from 0
    q += 2 * r >= (1 << e) if e else 0
    return q if h >= 0 else -q


def test_reference_matches_exact_integer_arithmetic():
    rng = np.random.default_rng(SEED + 1)
    ex, em, es = _edge_cases()
    tx, tm, ts = _tie_cases(rng)
    rx, rm, rs = _random_cases(rng, 20000)
    x, m, s = (np.concatenate(p) for p in ((ex, tx, rx), (em, tm, rm), (es, ts, rs)))
    for rounding in MODES:
        ok = s <= rq.MAX_SHIFT[rounding]
        got = rq.multiply_by_quantized_multiplier(x[ok], m[ok], s[ok], rounding)
        want = [_exact(int(a), int(b), int(c), rounding) for a, b, c in zip(x[ok], m[ok], s[ok])]
        np.testing.assert_array_equal(got, np.array(want, np.int64).astype(np.int32))


def test_cases_contain_ties(cases):
    """The edge cases do hit exact halves, positive and negative, at both rounding steps."""
    x, m, s = (a.astype(np.int64) for a in (cases.x, cases.m, cases.s["double"]))
    ok = s <= rq.MAX_SHIFT["single"]
    x, m, s = x[ok], m[ok], s[ok]
    a = ((x << np.maximum(s, 0)) - rq.INT32_MIN) % (1 << 32) + rq.INT32_MIN
    product_tie = (a * m) % Q_ONE == HALF
    h = rq.saturating_rounding_doubling_high_mul(a, m)
    e = np.maximum(-s, 0)
    shift_tie = (e > 0) & ((h & ((1 << e) - 1)) == np.where(e > 0, 1 << np.maximum(e - 1, 0), -1))
    single_tie = (x * m) % (np.int64(1) << (31 - s)) == (np.int64(1) << (30 - s))
    for tie, what in ((product_tie, "multiply"), (shift_tie, "rounding shift"),
                      (single_tie, "single rounding")):
        for sign, vals in (("positive", x > 0), ("negative", x < 0)):
            assert (tie & vals).sum() >= 10, f"too few {sign} ties of the {what}"


def _conv_reference(x, w, bias, in_zp, out_zp, mult, shift, rounding):
    """TFLite's int8 CONV_2D (3x3, stride 1, SAME, ReLU) in NumPy integers."""
    out_ch, kh, kw, _ = w.shape
    _, h, wd, _ = x.shape
    xp = np.pad(x.astype(np.int64) - in_zp, ((0, 0), (kh // 2,) * 2, (kw // 2,) * 2, (0, 0)))
    acc = np.zeros((1, h, wd, out_ch), np.int64) + bias
    for i in range(kh):
        for j in range(kw):
            acc += np.einsum("nhwc,oc->nhwo", xp[:, i:i + h, j:j + wd, :],
                             w[:, i, j, :].astype(np.int64))
    out = rq.multiply_by_quantized_multiplier(acc, mult, shift, rounding).astype(np.int64)
    return np.clip(out + out_zp, max(out_zp, -128), 127)  # fused ReLU: nothing below zero


def _conv_tensors(model) -> tuple[int, int, int, int]:
    """Tensor indices (input, filter, bias, output) of the model's one CONV_2D."""
    import tflite

    fb = model.flatbuffer()
    graph = fb.Subgraphs(0)
    for k in range(graph.OperatorsLength()):
        op = graph.Operators(k)
        code = fb.OperatorCodes(op.OpcodeIndex())
        # Newer files keep the code in BuiltinCode, older ones in DeprecatedBuiltinCode.
        if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) == tflite.BuiltinOperator.CONV_2D:
            x, w, b = (int(i) for i in op.InputsAsNumpy())
            return x, w, b, int(op.OutputsAsNumpy()[0])
    raise AssertionError("the model has no CONV_2D")


def test_reference_reproduces_a_tflite_convolution(zoo_model):
    """conv2d_3x3: per-channel scales in_scale * w_scale / out_scale, quantized by
    ``quantize_multiplier``, then requantized by the reference, equal TFLite's reference
    kernels exactly in double rounding (and not in single rounding)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from tvm_armq.frontend.model import TFLiteModel

    model = TFLiteModel.load(zoo_model("conv2d_3x3"))
    it = Interpreter(model_content=model.data, num_threads=1,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    i_in, i_w, i_b, i_out = _conv_tensors(model)
    details = {d["index"]: d for d in it.get_tensor_details()}
    quant = {i: details[i]["quantization_parameters"] for i in (i_in, i_w, i_out)}
    # TFLite stores scales as float32 and computes the effective scale in double.
    in_scale, out_scale = (float(np.float32(quant[i]["scales"][0])) for i in (i_in, i_out))
    w_scales = quant[i_w]["scales"].astype(np.float32).astype(np.float64)
    effective = in_scale * w_scales / out_scale  # one real scale per output channel
    quantized = {r: rq.quantize_multipliers(effective, r) for r in MODES}
    mult, shift = quantized["double"]
    assert len(mult) == w_scales.size and np.all((rq.MIN_SHIFT <= shift) & (shift <= 0))
    w, bias = it.get_tensor(i_w), it.get_tensor(i_b).astype(np.int64)
    in_zp, out_zp = (int(quant[i]["zero_points"][0]) for i in (i_in, i_out))

    rng = np.random.default_rng(SEED)
    differ = {r: 0 for r in MODES}
    for _ in range(N_CONV_INPUTS):
        x = rng.integers(-128, 127, details[i_in]["shape"], endpoint=True).astype(np.int8)
        want = model.reference_outputs([x])[0].astype(np.int64)
        for r in MODES:
            got = _conv_reference(x, w, bias, in_zp, out_zp, *quantized[r], r)
            differ[r] += int((got != want).sum())
    assert differ["double"] == 0, differ
    assert differ["single"] > 0, "no input reached a tie: the test cannot tell the modes apart"


# ------------------------------------------------------------------- host: builder
def test_builder_checks_its_arguments():
    import tvm
    from tvm import tirx

    x = tirx.Var("x", "int32")
    with pytest.raises(ValueError, match="q = 31"):
        qmuls(x, 1 << 30, 15, -3)
    with pytest.raises(ValueError, match="outside"):
        qmuls(x, 1 << 30, 31, -32)
    with pytest.raises(ValueError, match="outside"):
        qmuls(x, 1 << 30, 31, 31, rounding="single")
    with pytest.raises(ValueError, match="rounding"):
        qmuls(x, 1 << 30, 31, -3, rounding="nearest")
    with pytest.raises(TypeError, match="int32"):
        qmuls(tirx.Var("y", "int64"), 1 << 30, 31, -3)
    call = qmuls(tirx.Var("v", "int32x4"), 1 << 30, 31, -3)
    assert call.op.name == OP_NAMES["double"] and str(call.ty.dtype) == "int32x4"
    assert tvm.ir.Op.get(OP_NAMES["single"]).get_attr("TVectorizable")


# ------------------------------------------------------------- host: asm and x86
@pytest.mark.parametrize("lvl", list(LEVELS))
def test_aarch64_code_is_sqrdmulh_and_srshl(lvl):
    import tvm

    target = LEVELS[lvl].target()
    n = 64

    def asm(rounding, lanes, portable=False):
        mod = tvm.IRModule({"k": _elementwise("k", n, rounding, lanes)})
        return _compile(mod, target, portable).mod.inspect_source("asm")

    vector = asm("double", VECTOR_LANES)
    assert "sqrdmulh\tv" in vector and "srshl\tv" in vector
    scalar = asm("double", 1)
    assert "sqrdmulh\ts" in scalar and "srshl\td" in scalar
    single = asm("single", VECTOR_LANES)
    assert "smull" in single and "srshl\tv" in single and "sqrdmulh" not in single
    # qmuls_relu: the same two instructions and a floor at zero, no ties-away fixup.
    relu = asm("relu", VECTOR_LANES)
    assert "sqrdmulh\tv" in relu and "srshl\tv" in relu and "smax\tv" in relu
    assert "and\tv" not in relu and "and\tv" in vector
    # The forced default lowering is the 64-bit form: no sqrdmulh, no srshl.
    portable = asm("double", VECTOR_LANES, portable=True)
    assert "sqrdmulh" not in portable and "srshl" not in portable


def test_x86_build_is_exact(cases):
    """On x86 only the default rule applies; the same kernels compile and are exact there."""
    import tvm

    mod, kernels = _module(cases.n)
    lib = _compile(mod, "llvm")
    asm = lib.mod.inspect_source("asm")
    assert "sqrdmulh" not in asm

    def run(name, *arrays):
        tensors = [tvm.runtime.tensor(a) for a in arrays]
        lib[name](*tensors)
        return tensors[-1].numpy()

    _check_all(run, cases, kernels, "x86")


# ------------------------------------------------------------------------- device
def test_qmuls_on_device(devices, level, cases, tmp_path):
    """Both lowerings, every kernel shape, both rounding modes, on the level's CPU."""
    import tvm

    mod, kernels = _module(cases.n)
    target = LEVELS[level].target()
    libs = {"aarch64": export.export_aarch64(_compile(mod, target), tmp_path / "qmuls.so"),
            "default": export.export_aarch64(_compile(mod, target, portable=True),
                                            tmp_path / "qmuls_default.so")}
    sess = devices.session(level)
    dev = sess.cpu(0)
    uploaded = {}  # big inputs go to the device once and serve every kernel

    def on_device(a):
        key = (a.__array_interface__["data"][0], a.shape)
        if key not in uploaded:
            uploaded[key] = tvm.runtime.tensor(a, dev)
        return uploaded[key]

    for lowering, path in libs.items():
        sess.upload(str(path))
        rlib = sess.load_module(path.name)

        def run(name, *arrays):
            args = [on_device(a) for a in arrays[:-1]]
            out = tvm.runtime.tensor(arrays[-1], dev)
            rlib[name](*args, out)
            return out.numpy()

        # The default lowering on the device: its vector and constant forms suffice.
        only = None if lowering == "aarch64" else {
            f"{k}_{r}" for k in ("v4", "const_v4") for r in FORMS}
        _check_all(run, cases, kernels, f"{level} {lowering} lowering", only)
