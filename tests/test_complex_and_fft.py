"""Complex products and Fourier transforms count their real arithmetic: a complex multiply-add is
4 real multiplies and 4 real adds (4 x a real product's FLOPs, forward and backward, in the
function formulas and the layer rules alike), and every ``torch.fft`` transform costs
5·N·log2(N) (complex) or 2.5·N·log2(N) (a real side) per transform of N points, where it was 0
(a Fourier neural operator's spectral convolution counted 512 FLOPs of its 8,448)."""
from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402

torch.set_num_threads(1)
fft = torch.fft


class Apply(torch.nn.Module):
    """Runs one function of its inputs: its node's op table holds that call alone."""

    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *inputs):
        return self.function(*inputs)


def _counted(function, *inputs, grad=False):
    layer = Apply(function)
    with torch.set_grad_enabled(grad), tracetorch.profile(layer) as prof:
        out = layer(*inputs)
        if grad:
            out.abs().sum().backward()
    return prof


def _points(per_point, transforms, points):
    # per_point·N·log2(N) for each transform: the hand count the formulas must give
    return round(per_point * transforms * points * math.log2(points))


torch.manual_seed(0)
X = torch.randn(3, 8)                          # real signals of 8 points
Z = torch.randn(3, 8, dtype=torch.complex64)   # complex ones
X3 = torch.randn(2, 4, 8)                      # 2-D real signals of 4 x 8 points
Z3 = torch.randn(2, 4, 8, dtype=torch.complex64)

#: Each torch.fft function with its inputs and the hand count: (function, inputs, FLOPs).
TRANSFORMS = {
    "fft": (fft.fft, (Z,), _points(5, 3, 8)),
    "ifft": (fft.ifft, (Z,), _points(5, 3, 8)),
    "fft padded": (lambda z: fft.fft(z, n=16), (Z,), _points(5, 3, 16)),
    "fft over dim 0": (lambda z: fft.fft(z, dim=0), (Z,), _points(5, 8, 3)),
    "fft2": (fft.fft2, (Z3,), _points(5, 2, 32)),
    "ifft2": (fft.ifft2, (Z3,), _points(5, 2, 32)),
    "fftn": (fft.fftn, (Z3,), _points(5, 1, 64)),
    "fftn over dim 0": (lambda z: fft.fftn(z, dim=(0,)), (Z3,), _points(5, 32, 2)),
    "ifftn of the last two": (lambda z: fft.ifftn(z, s=(4, 8)), (Z3,), _points(5, 2, 32)),
    "rfft": (fft.rfft, (X,), _points(2.5, 3, 8)),
    "rfft trimmed": (lambda x: fft.rfft(x, n=6), (X,), _points(2.5, 3, 6)),
    "rfft2": (fft.rfft2, (X3,), _points(2.5, 2, 32)),
    "rfftn": (fft.rfftn, (X3,), _points(2.5, 1, 64)),
    "irfft": (fft.irfft, (fft.rfft(X),), _points(2.5, 3, 8)),
    "irfft of 7": (lambda c: fft.irfft(c, n=7), (fft.rfft(X),), _points(2.5, 3, 7)),
    "irfft2": (fft.irfft2, (fft.rfft2(X3),), _points(2.5, 2, 32)),
    "irfftn": (fft.irfftn, (fft.rfftn(X3),), _points(2.5, 1, 64)),
    "hfft": (fft.hfft, (fft.ihfft(X),), _points(2.5, 3, 8)),
    "ihfft": (fft.ihfft, (X,), _points(2.5, 3, 8)),
    "hfft2": (fft.hfft2, (fft.ihfft2(X3),), _points(2.5, 2, 32)),
    "ihfft2": (fft.ihfft2, (X3,), _points(2.5, 2, 32)),
    "hfftn": (fft.hfftn, (fft.ihfftn(X3),), _points(2.5, 1, 64)),
    "ihfftn": (fft.ihfftn, (X3,), _points(2.5, 1, 64)),
}


@pytest.mark.parametrize("function, inputs", [
    (lambda z: fft.fft(z, dim=0), (Z[:1],)),                       # a transform of one point
    (lambda x, w: x @ w, (torch.ones(0, 8), torch.ones(8, 4))),  # an empty batch
], ids=["one point", "empty batch"])
def test_a_counted_call_that_does_nothing_costs_a_known_zero(function, inputs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "FLOPs unknown" warning)
        prof = _counted(function, *inputs)
        assert tracetorch.count_flops(Apply(function), inputs) == 0
    assert prof.find("").flops == 0 and prof.find("").flops_source == "ops"
    assert prof.completeness == "complete"


def test_every_torch_fft_function_is_swept():
    swept = {case.split()[0] for case in TRANSFORMS}
    public = {name for name in dir(fft)
              if name.endswith(("fft", "fft2", "fftn")) and not name.startswith("_")}
    assert public <= swept


@pytest.mark.parametrize("case", list(TRANSFORMS))
def test_each_transform_costs_its_points(case):
    function, inputs, expected = TRANSFORMS[case]
    prof = _counted(function, *inputs)
    node = prof.find("")
    assert node.flops == expected and node.gemm_flops == 0
    assert [op.flops for op in node.op_table() if op.name.startswith("fft_")] == [expected]
    assert tracetorch.count_flops(Apply(function), inputs) == expected


#: Products of complex tensors and the real FLOPs of the same shapes.
PRODUCTS = {
    "matmul": (lambda a, b: a @ b, ((4, 6), (6, 5)), 2 * 4 * 6 * 5),
    "mm": (torch.mm, ((4, 6), (6, 5)), 2 * 4 * 6 * 5),
    "bmm": (torch.bmm, ((2, 4, 6), (2, 6, 5)), 2 * 2 * 4 * 6 * 5),
    "einsum": (lambda a, b: torch.einsum("bix,iox->box", a, b), ((2, 3, 8), (3, 5, 8)),
               2 * 2 * 3 * 5 * 8),
    "linear": (torch.nn.functional.linear, ((4, 6), (5, 6)), 2 * 4 * 6 * 5),
    "conv2d": (torch.nn.functional.conv2d, ((1, 2, 5, 5), (3, 2, 3, 3)), 2 * 3 * 3 * 3 * 2 * 9),
}


@pytest.mark.parametrize("name", list(PRODUCTS))
def test_a_complex_product_counts_four_real_ones_forward_and_backward(name):
    function, shapes, real_flops = PRODUCTS[name]
    torch.manual_seed(1)
    real = [torch.randn(*shape, requires_grad=True) for shape in shapes]
    complex_ = [torch.randn(*shape, dtype=torch.complex64, requires_grad=True)
                for shape in shapes]
    as_real, as_complex = _counted(function, *real, grad=True), _counted(
        function, *complex_, grad=True)
    assert as_real.forward_gemm_flops == real_flops
    assert as_complex.forward_gemm_flops == 4 * real_flops
    # each operand's gradient is a product of the same size
    assert as_real.backward_gemm_flops == 2 * real_flops
    assert as_complex.backward_gemm_flops == 4 * 2 * real_flops


@pytest.mark.parametrize("make, shape", [
    (lambda: torch.nn.Linear(6, 5), (4, 6)),
    (lambda: torch.nn.Conv2d(2, 3, 3), (1, 2, 5, 5)),
    (lambda: torch.nn.ConvTranspose2d(2, 3, 3), (1, 2, 5, 5)),
], ids=["Linear", "Conv2d", "ConvTranspose2d"])
def test_a_complex_layer_counts_four_times_its_real_twins_flops(make, shape):
    torch.manual_seed(2)
    layer = make()
    twin = make().to(torch.complex64)
    with torch.no_grad(), tracetorch.profile(layer) as real:
        layer(torch.randn(*shape))
    with torch.no_grad(), tracetorch.profile(twin) as complex_:
        twin(torch.randn(*shape, dtype=torch.complex64))
    assert real.find("").flops_source == complex_.find("").flops_source == "rule"
    assert complex_.forward_gemm_flops == 4 * real.forward_gemm_flops > 0


class SpectralConv1d(torch.nn.Module):
    """A Fourier neural operator's layer: transform, mix the lowest modes, transform back."""

    def __init__(self, channels, modes):
        super().__init__()
        self.modes = modes
        self.weight = torch.nn.Parameter(
            torch.randn(channels, channels, modes, dtype=torch.complex64))

    def forward(self, x):
        spectrum = fft.rfft(x)
        mixed = torch.einsum("bix,iox->box", spectrum[..., :self.modes], self.weight)
        return fft.irfft(mixed, n=x.shape[-1])


def test_a_spectral_convolution_counts_its_transforms_and_its_complex_product():
    layer, x = SpectralConv1d(4, 8), torch.randn(2, 4, 32)
    with torch.no_grad(), tracetorch.profile(layer) as prof:
        layer(x)
    transforms = 2 * _points(2.5, 2 * 4, 32)  # rfft and irfft of 8 signals of 32 points
    mixing = 4 * 2 * 2 * 4 * 4 * 8  # b·i·o·x complex multiply-adds, 8 real FLOPs each
    assert prof.forward_flops == transforms + mixing == 8448
    assert prof.forward_gemm_flops == mixing
    assert tracetorch.count_flops(layer, (x,)) == prof.forward_flops


SIGNAL = torch.randn(2, 400)  # frames of 64 points every 16 (stft's default hop): 26 a signal
WINDOW = torch.hann_window(64)

#: stft and istft calls and their hand counts: per frame a transform of 64 points (2.5·64·6 one-
#: sided, 5·64·6 two-sided) plus the window's 64 multiplies, the 33 bins' scales if normalized.
SPECTROGRAMS = {
    "stft": (lambda x: torch.stft(x, 64, return_complex=True), (SIGNAL,), 2 * 26 * 960),
    "stft windowed": (lambda x: torch.stft(x, 64, window=WINDOW, return_complex=True),
                      (SIGNAL,), 2 * 26 * (960 + 64)),
    "stft two-sided, normalized": (
        lambda x: x.stft(64, window=WINDOW, onesided=False, normalized=True,
                         return_complex=True), (SIGNAL,), 2 * 26 * (1920 + 64 + 64)),
    "stft as real pairs": (lambda x: torch.view_as_real(torch.stft(x, 64, return_complex=True)),
                           (SIGNAL,), 2 * 26 * 960),
    # istft: a one-sided inverse per frame, the window's multiplies and the overlap-add's adds,
    # then a division per output sample
    "istft": (lambda s: torch.istft(s, 64, window=WINDOW),
              (torch.stft(SIGNAL, 64, window=WINDOW, return_complex=True),),
              2 * 26 * (960 + 2 * 64) + 2 * 400),
}


@pytest.mark.parametrize("case", list(SPECTROGRAMS))
def test_a_spectrogram_costs_a_transform_per_frame(case):
    function, inputs, expected = SPECTROGRAMS[case]
    prof = _counted(function, *inputs)
    counted = [op.flops for op in prof.find("").op_table() if op.name in ("stft", "istft")]
    assert counted == [expected]
