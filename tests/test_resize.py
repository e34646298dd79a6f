"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR on the host: the tables and NumPy
references of ``schedules.resize`` against TFLite's reference kernels, bit for bit, over
upsampling and downsampling sizes, align_corners and half_pixel_centers (int8; nearest
also uint8).
The compiled kernels run on the device in ``tests/test_op_coverage.py``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tvm_armq.schedules import resize
from tvm_armq.frontend.model import TFLiteModel
from tvm_armq.frontend.writer import single_op_model

SIZES = [((4, 5), (8, 10)), ((5, 3), (16, 7)), ((8, 8), (3, 5)), ((3, 7), (3, 7)),
         ((1, 4), (5, 1)), ((6, 6), (13, 11))]
# nearest also: 2 -> 83 align_corners puts a position at 0.49999997, just below a half (not
# for bilinear: there TFLite's last rows read past the input, see resize.bilinear_table)
NEAREST_SIZES = SIZES + [((2, 2), (83, 5))]
MODES = [(False, False), (True, False), (False, True)]  # (align_corners, half_pixel_centers)


def resize_model(op: str, in_shape, out_hw, q, dtype, align_corners, half_pixel) -> bytes:
    """A one-op RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR model (op: the operator name)."""
    import tflite

    kind = "ResizeBilinear" if op == "RESIZE_BILINEAR" else "ResizeNearestNeighbor"

    def options(b):
        getattr(tflite, f"{kind}OptionsStart")(b)
        getattr(tflite, f"{kind}OptionsAddAlignCorners")(b, align_corners)
        getattr(tflite, f"{kind}OptionsAddHalfPixelCenters")(b, half_pixel)
        return getattr(tflite, f"{kind}OptionsEnd")(b)

    tensors = [dict(shape=in_shape, dtype=dtype, q=q),
               dict(shape=(2,), dtype="int32", data=np.asarray(out_hw, np.int32)),
               dict(shape=(in_shape[0], *out_hw, in_shape[3]), dtype=dtype, q=q)]
    return single_op_model(getattr(tflite.BuiltinOperator, op), tensors, [0, 1], [2],
                           (getattr(tflite.BuiltinOptions, f"{kind}Options"), options),
                           version=3)


# uint8 RESIZE_BILINEAR takes another path in TFLite (interpolation in float): int8 only
CASES = list(itertools.product(("RESIZE_BILINEAR",), SIZES, MODES, ("int8",))) + \
    list(itertools.product(("RESIZE_NEAREST_NEIGHBOR",), NEAREST_SIZES, MODES, ("int8", "uint8")))


def _id(case):
    op, (in_hw, out_hw), (align, half), dtype = case
    mode = "align_corners" if align else "half_pixel" if half else "asymmetric"
    return f"{op.lower()}-{in_hw[0]}x{in_hw[1]}-to-{out_hw[0]}x{out_hw[1]}-{mode}-{dtype}"


@pytest.mark.parametrize("op,sizes,mode,dtype", CASES, ids=[_id(c) for c in CASES])
def test_reference_matches_tflite(op, sizes, mode, dtype):
    (in_hw, out_hw), (align, half) = sizes, mode
    rng = np.random.default_rng(CASES.index((op, sizes, mode, dtype)))
    info = np.iinfo(dtype)
    in_shape = (2, *in_hw, 19)
    x = rng.integers(info.min, info.max, in_shape, endpoint=True).astype(dtype)
    x[0, 0, 0, 0] = info.min  # both ends of the range: the rounding of negative sums
    x[0, -1, -1, -1] = info.max
    make = resize.bilinear_table if op == "RESIZE_BILINEAR" else resize.nearest_table
    ty, tx = (make(i, o, align, half) for i, o in zip(in_hw, out_hw))
    run = resize.resize_bilinear if op == "RESIZE_BILINEAR" else resize.resize_nearest
    expected = TFLiteModel.load(resize_model(op, in_shape, out_hw, (0.05, 3), dtype, align,
                                             half)).reference_outputs([x])[0]
    np.testing.assert_array_equal(run(x, ty, tx), expected)
    assert len(np.unique(expected)) > min(24, expected.size // 8), "outputs must vary"


def test_bilinear_rounds_half_away_from_zero():
    """A sum exactly half a step below zero rounds away from zero (to -1), where a single
    rounding shift would give 0: the rounding the reference and the kernel take."""
    x = np.full((1, 2, 2, 1), -1, np.int8)
    x[0, 0, 0, 0] = 0
    # 2x2 -> 4x4 asymmetric: output (1, 1) reads at (0.5, 0.5): the average of four pixels
    ty = tx = resize.bilinear_table(2, 4, False, False)
    assert tuple(ty[1]) == (0, 1, resize.HALF)
    # (0 - 1 - 1 - 1) / 4 = -0.75 -> -1; a case at exactly -0.5: two pixels of -1 of four
    x2 = np.zeros((1, 2, 2, 1), np.int8)
    x2[0, 1, :, 0] = -1
    assert resize.resize_bilinear(x2, ty, tx)[0, 1, 1, 0] == -1
    assert resize.resize_bilinear(x, ty, tx)[0, 1, 1, 0] == -1
