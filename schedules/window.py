"""Sliding-window geometry shared by the convolution schedules (NHWC, TFLite conventions)."""

from __future__ import annotations


def output_size(size: int, kernel: int, stride: int, dilation: int, pad_before: int,
                pad_after: int) -> int:
    """Output pixels along one axis of a strided, dilated, padded window."""
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1
