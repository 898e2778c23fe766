"""Spatial layers on NCHW tensors: Conv2d, MaxPool2d, AvgPool2d.

Attribute conventions follow TinyTorch: ``kernel_size`` is always a tuple (kh, kw);
Conv2d keeps ``stride``/``padding`` as given (int or pair) and normalises them per call;
the pools store ``stride`` as a tuple defaulting to ``kernel_size`` and ``padding`` as given.

Example::

    >>> conv = Conv2d(3, 8, 3, padding=1)
    >>> conv(Tensor(np.ones((2, 3, 16, 16)))).shape
    (2, 8, 16, 16)
"""
from __future__ import annotations

import math
from typing import Any

from . import init
from .layers import Module, as_tensor, check_positive_int
from .ops_conv import conv2d, to_pair
from .ops_pool import avg_pool2d, max_pool2d
from .tensor import Tensor

__all__ = ("Conv2d", "MaxPool2d", "AvgPool2d")


class Conv2d(Module):
    """2-D convolution (cross-correlation); weight (out, in, kh, kw), bias (out,).

    Weights are He-initialised, N(0, 2 / (in_channels*kh*kw)); bias starts at zero.
    Output size per dim: ``(H + 2*padding - kernel) // stride + 1``.

    Example::

        >>> Conv2d(1, 4, kernel_size=(3, 5), stride=2)(Tensor(np.ones((1, 1, 9, 9)))).shape
        (1, 4, 4, 3)
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Any,
        stride: Any = 1,
        padding: Any = 0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.in_channels = check_positive_int(in_channels, "in_channels", "Conv2d")
        self.out_channels = check_positive_int(out_channels, "out_channels", "Conv2d")
        self.kernel_size = to_pair(kernel_size, "Conv2d: kernel_size")
        to_pair(stride, "Conv2d: stride")  # validate now, keep the caller's form
        to_pair(padding, "Conv2d: padding", minimum=0)
        self.stride = stride
        self.padding = padding
        kh, kw = self.kernel_size
        fan_in = self.in_channels * kh * kw
        self.weight = init.normal(
            (self.out_channels, self.in_channels, kh, kw), std=math.sqrt(2.0 / fan_in)
        )
        self.bias = init.zeros((self.out_channels,)) if bias else None

    def _describe(self) -> str:
        return (
            f"Conv2d(in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"kernel_size={self.kernel_size})"
        )

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        shape = x.data.shape
        if len(shape) != 4:
            raise ValueError(
                f"{self._describe()}: expected 4-D input (N, C, H, W), got shape {shape}"
            )
        if shape[1] != self.in_channels:
            raise ValueError(
                f"{self._describe()}: expected {self.in_channels} input channels, "
                f"got shape {shape}"
            )
        try:
            return conv2d(x, self.weight, self.bias, self.stride, self.padding)
        except ValueError as err:  # e.g. input smaller than the kernel
            raise ValueError(f"{self._describe()}: {err}") from None

    def extra_repr(self) -> str:
        return (
            f"in_channels={self.in_channels}, out_channels={self.out_channels}, "
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"bias={self.bias is not None}"
        )


class _Pool2d(Module):
    """Shared constructor/validation of the pooling layers."""

    def __init__(self, kernel_size: Any, stride: Any | None = None, padding: Any = 0) -> None:
        super().__init__()
        name = type(self).__name__
        self.kernel_size = to_pair(kernel_size, f"{name}: kernel_size")
        self.stride = (
            self.kernel_size if stride is None else to_pair(stride, f"{name}: stride")
        )
        to_pair(padding, f"{name}: padding", minimum=0)
        self.padding = padding

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """Max over kh x kw windows (stride defaults to the kernel size, -inf padding).

    Example::

        >>> MaxPool2d(2)(Tensor(np.ones((1, 3, 8, 8)))).shape
        (1, 3, 4, 4)
    """

    def forward(self, x: Any) -> Tensor:
        return max_pool2d(as_tensor(x), self.kernel_size, self.stride, self.padding)


class AvgPool2d(_Pool2d):
    """Mean over kh x kw windows (zero padding included in the mean).

    Example::

        >>> AvgPool2d(2)(Tensor(np.ones((1, 3, 8, 8)))).shape
        (1, 3, 4, 4)
    """

    def forward(self, x: Any) -> Tensor:
        return avg_pool2d(as_tensor(x), self.kernel_size, self.stride, self.padding)
