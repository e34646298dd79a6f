"""The float32 exp and tanh of ``schedules/float_math.py``, and GELU / SOFTMAX / LOGISTIC
built on them, run on the device: each within its stated ulps of the float64 value over the
inputs its layers see, and none calling the C library (the loops are vector code).

At one level in the fast tier (the code is the same NEON at every level) and at every level
in the exhaustive one; and on the host, that a dynamic-range net's float layers are these
kernels once tvm_armq's passes have run.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from armq_checks import tier

from tvm_armq.schedules import float_math as fm
from tvm_armq.targets import LEVELS

F32 = np.float32


def _inputs():
    """Inputs per function: dense sweeps of the range each op's layers use, random points,
    the clamps' edges and the tiny ones."""
    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, fm.EXP_MIN, fm.EXP_MAX, fm.TANH_CLAMP, -fm.TANH_CLAMP, fm.TANH_TINY,
             -fm.TANH_TINY, 1e-6, -1e-6, 1e-30, -100.0, 100.0]
    exp_x = np.concatenate([np.linspace(-90, 0, 12001), np.linspace(0, 88, 4001),
                            rng.uniform(-20, 0, 4000), edges])
    tanh_x = np.concatenate([np.linspace(-10, 10, 16001), rng.standard_normal(4000) * 3,
                             np.geomspace(1e-8, 1, 2000), -np.geomspace(1e-8, 1, 2000), edges])
    whole = {"exp": exp_x.astype(F32), "tanh": tanh_x.astype(F32),
             "sigmoid": tanh_x.astype(F32) * 4, "gelu_tanh": tanh_x.astype(F32)}
    # rows of the vector's width (fm.VECTOR_LANES): the layers' last axes are
    return {k: np.resize(v, (-(-v.size // 64), 64)) for k, v in whole.items()}


def _ulps(got, exact):
    """|got - exact| in units of the float32 spacing at ``exact`` (float64)."""
    spacing = np.spacing(np.abs(exact).astype(F32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - exact) / spacing


def _gelu64(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _softmax64(x):
    """SOFTMAX as the kernel computes it (the differences x - max in float32, as TFLite's
    reference; the sum of the row's exponentials in float32, in REDUCE_LANES partial sums
    and then across them), with each exponential and the division in float64: what is
    left is the error of exp and of the multiply by 1 / sum (two roundings)."""
    e = np.exp((x - x.max(axis=-1, keepdims=True)).astype(np.float64))
    tail = -e.shape[-1] % fm.REDUCE_LANES  # the kernel's lanes past the row add zeros
    padded = np.pad(e.astype(F32), [(0, 0)] * (e.ndim - 1) + [(0, tail)])
    lanes = padded.reshape(*e.shape[:-1], -1, fm.REDUCE_LANES)
    parts = np.add.accumulate(lanes, axis=-2, dtype=F32)[..., -1, :]
    total = np.add.accumulate(parts, axis=-1, dtype=F32)[..., -1:]
    return e / total.astype(np.float64)


MATMULS = {"attention": ((1, 4, 32, 16), (1, 4, 16, 32)),  # whole tiles
           "tails": ((2, 3, 7, 20), (2, 3, 20, 36)),  # rows and columns off the tile
           "scaled": ((1, 4, 32, 16), (1, 4, 16, 32))}
# the tiled kernels' epilogues (float_math.EPILOGUE_OPS) the cases above are built with
EPILOGUES = {"matmul_scaled": (("multiply", np.array([0.25], F32)),),
             "conv2d_stem_bias_relu6": (("add", np.linspace(-2, 2, 16).astype(F32)),
                                        ("relu", None), ("clip", (0.0, 6.0)))}


def _apply(epilogue, out):
    """``epilogue`` applied to float64 ``out`` (exactly, and to |out|'s bound as it is)."""
    for op, value in epilogue:
        if op == "add":
            out = out + value
        elif op == "multiply":
            out = out * value
        elif op == "relu":
            out = np.maximum(out, 0)
        else:
            out = np.clip(out, *value)
    return out


CONVS = {  # data, weight (HWIO), strides, padding (top, left, bottom, right), dilation
    "stem": ((1, 32, 32, 3), (3, 3, 3, 16), (1, 1), (1, 1, 1, 1), (1, 1)),
    "stem_bias_relu6": ((1, 32, 32, 3), (3, 3, 3, 16), (1, 1), (1, 1, 1, 1), (1, 1)),
    "strided": ((1, 15, 17, 8), (3, 3, 8, 12), (2, 2), (0, 1, 1, 0), (1, 1)),
    "dilated": ((1, 12, 12, 5), (3, 3, 5, 7), (1, 1), (2, 2, 2, 2), (2, 2)),
    "pointwise": ((2, 7, 9, 32), (1, 1, 32, 24), (1, 1), (0, 0, 0, 0), (1, 1)),
}


def _conv64(x, w, strides, padding, dilation):
    """conv2d in float64 (and with |x|, |w|: the bound's sum), NHWC / HWIO."""
    (sh, sw), (dh, dw), (top, left, bottom, right) = strides, dilation, padding
    xp = np.pad(x.astype(np.float64), ((0, 0), (top, bottom), (left, right), (0, 0)))
    kh, kw = w.shape[:2]
    oh = (xp.shape[1] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[2] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            out += win @ w[i, j].astype(np.float64)
    return out


TAIL_ROWS = (6, 37)  # SOFTMAX rows that are not whole vectors
POOLED = (2, 5, 7, 24)  # a global average pool's NHWC input


# every op of float_math.TREE_OPS (and clip), with operands broadcast the numpy way
TREE = ("clip", ("add", ("multiply", ("input", 0), ("rsqrt", ("add", ("input", 1),
                                                                 ("const", 1e-6)))),
                 ("divide", ("square", ("subtract", ("input", 2), ("input", 1))),
                  ("maximum", ("relu", ("input", 0)),
                   ("minimum", ("sqrt", ("input", 3)), ("negative", ("const", -2.0)))))),
        -4.0, 4.0)
TREE_SHAPES = [(3, 7, 16), (3, 7, 1), (16,), (3, 7, 16)]


def _tree_numpy(x0, x1, x2, x3):
    """TREE in float32, one IEEE operation per op (what the kernel computes, bit for bit)."""
    r = F32(1) / np.sqrt(x1 + F32(1e-6))
    d = x2 - x1
    m = np.maximum(np.maximum(x0, F32(0)), np.minimum(np.sqrt(x3), -F32(-2.0)))
    return np.clip(x0 * r + (d * d) / m, F32(-4), F32(4))


def _funcs(inputs, rows):
    """The scheduled PrimFuncs (name -> func) of each op over its inputs, of SOFTMAX over
    ``rows`` and of each MATMULS case."""
    funcs = {name: fm.func(name, x.shape) for name, x in inputs.items()}
    funcs[fm.SOFTMAX] = fm.func(fm.SOFTMAX, rows.shape, -1)
    funcs["softmax_tail"] = fm.func(fm.SOFTMAX, TAIL_ROWS, -1)
    funcs[fm.MEAN] = fm.func(fm.MEAN, TAIL_ROWS)
    funcs["spatial_mean"] = fm.spatial_mean_func(POOLED, keepdims=True)
    funcs["tree"] = fm.tree_func(TREE, TREE_SHAPES, TREE_SHAPES[0])
    for name, (a, b) in MATMULS.items():
        funcs[f"matmul_{name}"] = fm.matmul_func(a, b, EPILOGUES.get(f"matmul_{name}", ()))
    for name, case in CONVS.items():
        funcs[f"conv2d_{name}"] = fm.conv2d_func(*case, EPILOGUES.get(f"conv2d_{name}", ()))
    return funcs


@pytest.mark.device
@pytest.mark.parametrize("level", [tier(lvl, id=lvl, fast=lvl == "neon") for lvl in LEVELS])
def test_float_math_within_its_ulps_on_device(level, run_funcs, tmp_path, report):
    inputs = _inputs()
    # attention's rows: scores of a few magnitudes, one row with a single dominant entry
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((24, 64)) * np.repeat([0.5, 3, 12], 8)[:, None]).astype(F32)
    rows[0, 5] = 80.0
    funcs = _funcs(inputs, rows)
    calls = [(name, [x], x.shape, "float32") for name, x in inputs.items()]
    calls.append(("softmax", [rows], rows.shape, "float32"))
    tail_rows = (rng.standard_normal(TAIL_ROWS) * 4).astype(F32)
    calls.append(("softmax_tail", [tail_rows], TAIL_ROWS, "float32"))
    calls.append((fm.MEAN, [tail_rows], (TAIL_ROWS[0], 1), "float32"))
    tree_inputs = [rng.standard_normal(shape).astype(F32) for shape in TREE_SHAPES]
    tree_inputs[1], tree_inputs[3] = np.abs(tree_inputs[1]), np.abs(tree_inputs[3])
    calls.append(("tree", tree_inputs, TREE_SHAPES[0], "float32"))
    pooled = rng.standard_normal(POOLED).astype(F32)
    calls.append(("spatial_mean", [pooled], (POOLED[0], 1, 1, POOLED[3]), "float32"))
    operands = {}
    for name, (a, b) in MATMULS.items():
        operands[name] = [rng.standard_normal(a).astype(F32), rng.standard_normal(b).astype(F32)]
        consts = fm.epilogue_constants(EPILOGUES.get(f"matmul_{name}", ()))
        calls.append((f"matmul_{name}", operands[name] + consts, (*a[:-1], b[-1]), "float32"))
    for name, (x, w, *conv) in CONVS.items():
        operands[f"conv2d_{name}"] = [rng.standard_normal(x).astype(F32),
                                     rng.standard_normal(w).astype(F32), conv]
        shape = _conv64(np.zeros(x), np.zeros(w), *conv).shape
        consts = fm.epilogue_constants(EPILOGUES.get(f"conv2d_{name}", ()))
        calls.append((f"conv2d_{name}", operands[f"conv2d_{name}"][:2] + consts, shape,
                      "float32"))
    asm, outs = run_funcs(level, funcs, calls, tmp_path / "float_math.so")
    got = dict(zip([c[0] for c in calls], outs))
    for name in got:
        assert np.all(np.isfinite(got[name])), name
    x = inputs["exp"]
    exact = np.exp(x.astype(np.float64))
    normal = (x >= fm.EXP_MIN) & (x <= fm.EXP_MAX)
    worst = {"exp": _ulps(got["exp"][normal], exact[normal]).max()}
    assert np.all(got["exp"][x < fm.EXP_MIN] == 0)
    x = inputs["tanh"]
    worst["tanh"] = _ulps(got["tanh"], np.tanh(x.astype(np.float64))).max()
    assert np.all(np.abs(got["tanh"]) <= 1)
    x = inputs["sigmoid"]
    worst["sigmoid"] = _ulps(got["sigmoid"], 1 / (1 + np.exp(-x.astype(np.float64)))).max()
    # GELU: the tanh's error, scaled by 0.5 |x|, on top of the float32 products around it
    x = inputs["gelu_tanh"]
    err = np.abs(got["gelu_tanh"].astype(np.float64) - _gelu64(x))
    bound = (fm.TANH_ULPS + 2) * np.spacing(F32(1)) * 0.5 * np.abs(x) + np.spacing(
        np.abs(_gelu64(x)).astype(F32))
    assert np.all(err <= bound), float(np.max(err / bound))
    worst["softmax"] = max(_ulps(got["softmax"], _softmax64(rows)).max(),
                           _ulps(got["softmax_tail"], _softmax64(tail_rows)).max())
    # MEAN: a float32 sum of the row (within n eps/2 of its magnitude), then one division
    exact = tail_rows.astype(np.float64).mean(-1, keepdims=True)
    bound = (TAIL_ROWS[1] + 1) * np.spacing(F32(1)) / 2 * np.abs(tail_rows).mean(-1, keepdims=True)
    assert np.all(np.abs(got[fm.MEAN] - exact) <= bound), "mean"
    want = _tree_numpy(*tree_inputs)
    assert np.array_equal(got["tree"], want), np.abs(got["tree"] - want).max()
    assert np.unique(want).size > want.size // 2  # alive, not clamped flat
    exact = pooled.astype(np.float64).mean((1, 2), keepdims=True)
    pixels = POOLED[1] * POOLED[2]
    bound = (pixels + 1) * np.spacing(F32(1)) / 2 * np.abs(pooled).mean((1, 2), keepdims=True)
    assert np.all(np.abs(got["spatial_mean"] - exact) <= bound), "spatial_mean"
    # a float32 sum of k products in any order is within k * eps/2 * sum |a b| of the exact
    for name, (a, b, *conv) in operands.items():
        if conv:
            exact, magnitude = _conv64(a, b, *conv[0]), _conv64(np.abs(a), np.abs(b), *conv[0])
            depth = b[..., 0].size
        else:
            exact, magnitude = np.matmul(a.astype(np.float64), b), np.matmul(np.abs(a), np.abs(b))
            depth, name = a.shape[-1], f"matmul_{name}"
        # an epilogue after the sum: its ops move a value by at most the sum's error
        # (clamps and a positive scale) plus an ulp of the result per rounding op
        epilogue = EPILOGUES.get(name, ())
        exact = _apply(epilogue, exact)
        scale = np.prod([np.abs(v).max() for op, v in epilogue if op == "multiply"] or [1])
        bound = depth * np.spacing(F32(1)) / 2 * magnitude * scale + len(epilogue) * np.spacing(
            np.abs(exact).astype(F32))
        assert np.all(np.abs(got[name] - exact) <= bound), name
        assert np.unique(got[name]).size > got[name].size // 4, name  # alive
    limits = {"exp": fm.EXP_ULPS, "tanh": fm.TANH_ULPS, "sigmoid": fm.EXP_ULPS + 2,
              "softmax": 2 * fm.EXP_ULPS + 2}
    for name, limit in limits.items():
        assert worst[name] <= limit, f"{name} at {level}: {worst[name]:.2f} ulps > {limit}"
    assert got["softmax"][0, 5] > 0.99 and np.allclose(got["softmax"].sum(-1), 1, atol=1e-5)
    # vector code, and no call of the C library's exp / tanh
    called = set(re.findall(r"\tbl\t(\w+)", asm))
    assert not called & {"expf", "tanhf", "exp", "tanh"}, called
    assert "frecpe\tv" in asm and "fmla\tv" in asm
    report(f"float_math {level:8s} worst ulps: " + ", ".join(
        f"{k} {v:.2f}" for k, v in worst.items()))


@pytest.mark.parametrize("name", ["bert_encoder_dynamic", "resnet_block_dynamic"])
def test_dynamic_range_nets_float_layers_are_these_kernels(name, zoo_model):
    """After tvm_armq's passes a dynamic-range net's float SOFTMAX, GELU, MEAN, attention
    products, float convolutions and chains of elementwise ops are calls of these kernels,
    each named in the naming grammar; no float op that TVM would lower to a libm call or
    an unscheduled loop nest of products is left."""
    import tvm

    from tvm_armq import build, targets
    from tvm_armq.frontend import importer
    from tvm_armq.intrinsics import names
    from tvm_armq.passes.float_math import FLOAT

    mod = build.lower(importer.import_tflite(zoo_model(name)), targets.resolve("dotprod"))
    left = []

    def visit(expr):
        if isinstance(expr, tvm.relax.Call) and getattr(expr.op, "name", "") in (
                "relax.exp", "relax.tanh", "relax.sigmoid", "relax.nn.softmax",
                "relax.nn.gelu_tanh", "relax.matmul", "relax.nn.conv2d") and \
                str(expr.ty.dtype) == FLOAT:
            left.append(expr.op.name)

    tvm.relax.analysis.post_order_visit(mod["main"], visit)
    assert not left, left
    kernels = {gv.name_hint: f.attrs["tvm_armq.kernel"] for gv, f in mod.functions_items()
               if gv.name_hint.startswith("tvm_armq_float_")}
    assert kernels and all(names.NAME_RE.match(k) for k in kernels.values()), kernels
    want = ({"softmax_f32_neon", "gelu_tanh_f32_neon", "mean_f32_neon"}
            if name.startswith("bert") else {"conv2d_f32f32f32_4x16x1_neon",
                                             "spatial_mean_f32_neon"})
    assert want <= set(kernels.values()), kernels
    if name.startswith("bert"):  # a LayerNorm's steps (resnet's residual ADDs are the
        # epilogues of its hybrid layers: test_hybrid)
        assert any(k.startswith("elementwise_f32_neon_ops") for k in kernels.values()), \
            kernels
