"""The kernels a calibration times, per framework: a matmul, a copy and a trivial layer.

:func:`kit_for` gives the :class:`Kit` of a calibration's facts (see
:func:`tracetorch.analysis.machine_cache.machine_facts`); :func:`tracetorch.tools.calibrate.measure`
times its kernels. torch is imported only for a torch kit.

Example:
    >>> kit = kit_for({"framework": "numpy", "dtype": "float32"})
    >>> kit.matmul(4)().shape, kit.cuda
    ((4, 4), False)
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tracetorch.analysis.machine_cache import import_torch
from tracetorch.tools.bench import benchmark

__all__ = ("Kit", "NumpyKit", "TorchKit", "kit_for")


class Kit:
    """The kernels one framework is measured with: a matmul, a copy and a trivial layer."""

    #: Whether the kernels run on a GPU (the sizes and the copy are then larger).
    cuda = False

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts

    def __enter__(self) -> Kit:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    def sync(self) -> None:
        """Wait for queued device work (nothing to wait for on a CPU)."""

    def time(self, fn: Callable[[], Any], seconds: float) -> float:
        """Median seconds per call of ``fn``."""
        return benchmark(fn, warmup=1, min_run_time=seconds, sync=self.sync).median

    def matmul(self, n: int) -> Callable[[], Any]:
        raise NotImplementedError

    def copy(self, nbytes: int) -> Callable[[], Any]:
        raise NotImplementedError

    def trivial_layer(self) -> tuple[Any, Any]:
        raise NotImplementedError


class NumpyKit(Kit):
    def matmul(self, n: int) -> Callable[[], Any]:
        rng = np.random.default_rng(0)
        a, b = (rng.standard_normal((n, n)).astype(self.facts["dtype"]) for _ in range(2))
        out = np.empty_like(a)
        return lambda: np.matmul(a, b, out=out)

    def copy(self, nbytes: int) -> Callable[[], Any]:
        src = np.ones(nbytes // np.dtype(self.facts["dtype"]).itemsize, self.facts["dtype"])
        dst = np.empty_like(src)
        return lambda: np.copyto(dst, src)

    def trivial_layer(self) -> tuple[Any, Any]:
        from tracetorch.core import Linear, Tensor

        return Linear(1, 1), Tensor(np.ones((1, 1), dtype=self.facts["dtype"]))


class TorchKit(Kit):
    def __init__(self, facts: dict[str, Any]) -> None:
        super().__init__(facts)
        self.torch = import_torch()
        self.dtype = getattr(self.torch, facts["dtype"])
        self.device = self.torch.device(facts["device"])
        self.cuda = self.device.type == "cuda"
        self._threads = self.torch.get_num_threads()

    def __enter__(self) -> Kit:
        self.torch.set_num_threads(self.facts["threads"])
        self._grad = self.torch.is_grad_enabled()
        self.torch.set_grad_enabled(False)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.torch.set_num_threads(self._threads)
        self.torch.set_grad_enabled(self._grad)

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def _tensor(self, *shape: int) -> Any:
        return self.torch.randn(*shape, dtype=self.dtype, device=self.device)

    def matmul(self, n: int) -> Callable[[], Any]:
        a, b, out = self._tensor(n, n), self._tensor(n, n), self._tensor(n, n)
        return lambda: self.torch.matmul(a, b, out=out)

    def copy(self, nbytes: int) -> Callable[[], Any]:
        src = self._tensor(nbytes // self.torch.empty((), dtype=self.dtype).element_size())
        dst = self.torch.empty_like(src)
        return lambda: dst.copy_(src)

    def trivial_layer(self) -> tuple[Any, Any]:
        layer = self.torch.nn.Linear(1, 1).to(device=self.device, dtype=self.dtype)
        return layer, self._tensor(1, 1)


def kit_for(facts: dict[str, Any]) -> Kit:
    """The kit of ``facts["framework"]`` (numpy or torch) in ``facts["dtype"]``."""
    return NumpyKit(facts) if facts["framework"] == "numpy" else TorchKit(facts)
