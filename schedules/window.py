"""Sliding-window geometry shared by the convolution schedules (NHWC, TFLite conventions)."""

from __future__ import annotations


def output_size(size: int, kernel: int, stride: int, dilation: int, pad_before: int,
                pad_after: int) -> int:
    """Output pixels along one axis of a strided, dilated, padded window."""
    return (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1


def same_padding(in_hw, kernel_hw, strides=(1, 1), dilation=(1, 1)) -> tuple[int, int, int, int]:
    """TensorFlow's SAME padding as (top, left, bottom, right): the odd pixel goes last."""
    pads = []
    for size, k, s, d in zip(in_hw, kernel_hw, strides, dilation):
        out = -(-size // s)
        total = max((out - 1) * s + d * (k - 1) + 1 - size, 0)
        pads.append((total // 2, total - total // 2))
    (pt, pb), (pl, pr) = pads
    return int(pt), int(pl), int(pb), int(pr)


def transpose_conv_padding(out_size: int, kernel: int, stride: int, same: bool) -> int:
    """The padding before the first output row (column) of a TFLite TRANSPOSE_CONV: its
    Eval pads as a convolution from the output (``out_size``) back to the input would,
    and the scatter then starts that many rows before the output's first."""
    if same:
        steps = (out_size + stride - 1) // stride
    else:
        steps = (out_size + stride - kernel) // stride
    return max(0, (steps - 1) * stride + kernel - out_size) // 2


class Window2D:
    """Output size of an NHWC window op, for dataclasses with the fields ``in_h``, ``in_w``,
    ``kh``, ``kw``, ``strides``, ``dilation`` and ``padding`` (top, left, bottom, right)."""

    @property
    def out_h(self) -> int:
        pt, _, pb, _ = self.padding
        return output_size(self.in_h, self.kh, self.strides[0], self.dilation[0], pt, pb)

    @property
    def out_w(self) -> int:
        _, pl, _, pr = self.padding
        return output_size(self.in_w, self.kw, self.strides[1], self.dilation[1], pl, pr)
