"""Quantized NHWC conv2d (and dense) as a GEMM over packed operands, requantized in the
epilogue: the path of one layer, start here.

A convolution is a matrix product: A[M, K] the im2col of the input (one row per output
pixel), B[K, N] the weights, M = output pixels, K = kh * kw * in_c, N = output channels.
A micro-kernel of the selection table (``intrinsics/kernels.py``) multiplies an mr x kr
block of A by a kr x nr block of B, so both are packed block by block; the int32 blocks
are requantized TFLite's way straight from the registers they were computed in, and only
int8 results reach memory. One layer goes through four steps, each in its own module:

    plan    = gemm_plan.plan(shape, kernel)       decide once: kernel and row tail, read
                                                  A in place or pack it, input copy, knobs
    func    = gemm_compute.conv2d_gemm_func(plan, **quant)        the TE stages
    func    = gemm_schedule.schedule_conv2d_gemm(func, plan, target)
                                                  macro tiles, epilogue, tensorize
    weights = constants(plan, weight_hwio, bias, in_zp)           packed at compile time

``conv2d_gemm`` runs the first three; ``gemm_layout`` has the geometry and the packed
layouts, ``tir_util`` the TIR surgery. The passes (``tvm_armq.passes``) and the tuner
(``tvm_armq.tuning``, which samples the knobs instead: ``gemm_schedule.sample_conv2d_gemm``)
take the same steps.

A row tail (``gemm_plan.tail_kernel``): where padding M would waste most of a micro-tile
(a 7x7 map: M = 49 is 12 tiles of 4 rows and one of 1 row and 3 padding), the
last M % mr rows are a second GEMM, run by the family's one-row kernel over the same
packed B, with its own epilogue; the two outputs are one buffer once scheduled.

Asymmetric weights (uint8 models with a weight zero point) add a row-sums kernel
(``conv2d_u8.py``); float models run the same GEMM in bf16 (``conv2d_bf16.py``);
TRANSPOSE_CONV runs it once per output phase (``transpose_conv.py``).
"""

from __future__ import annotations

import numpy as np

from .gemm_compute import conv2d_gemm_func
from .gemm_layout import fold_bias, pack_weights
from .gemm_plan import GemmKnobs, GemmPlan, plan
from .gemm_schedule import schedule_conv2d_gemm


def conv2d_gemm(shape, kernel, target, *, knobs: GemmKnobs | None = None,
                parallel: bool = True, **quant):
    """The scheduled PrimFunc of the conv2d GEMM of ``shape`` (``gemm_layout.Conv2DShape``)
    with ``kernel`` for ``target``, and its plan: (func, plan). ``knobs``: the main GEMM's
    macro tile (default: the plan's); ``quant``: ``gemm_compute.conv2d_gemm_te``'s
    quantization arguments. The func's operands are (data, ``constants(plan, ...)``,
    output)."""
    p = plan(shape, kernel, knobs=knobs, parallel=parallel)
    return schedule_conv2d_gemm(conv2d_gemm_func(p, **quant), p, target), p


def constants(plan: GemmPlan, weight_hwio: np.ndarray, bias: np.ndarray, in_zp: int,
              w_zp: int = 0) -> list[np.ndarray]:
    """The layer's compile-time operands after the input: the weights packed for the
    plan's kernel (``pack_weights``) and the folded bias (``fold_bias``); the
    requantization's multiplier and shift follow them."""
    return [pack_weights(weight_hwio, plan.main.tile, plan.shape.groups),
            fold_bias(weight_hwio, bias, in_zp, w_zp=w_zp)]
