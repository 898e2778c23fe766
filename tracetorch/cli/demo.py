"""A small CNN training loop to profile: what ``tracetorch demo`` runs.

The command is built from these public pieces, which examples and tests reuse:
:func:`make_dataset` (synthetic, learnable images), :func:`build_cnn`, :func:`batches`,
:func:`train_step` and :func:`run_demo`.

Example:
    >>> import tracetorch
    >>> from tracetorch.core import CrossEntropyLoss, SGD
    >>> images, labels = make_dataset(8, seed=0)
    >>> model = build_cnn()
    >>> optimizer = SGD(model.parameters(), lr=0.05)
    >>> with tracetorch.profile(model) as prof:
    ...     loss = train_step(model, CrossEntropyLoss(), optimizer, images, labels)
    >>> sorted(n.name for n in prof.root.children.values())
    ['', 'CrossEntropyLoss', 'SGD.step', 'backward']
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from tracetorch.cli.progress import ProgressLine
from tracetorch.core import (
    SGD,
    Conv2d,
    CrossEntropyLoss,
    Flatten,
    Linear,
    MaxPool2d,
    Module,
    Optimizer,
    ReLU,
    Sequential,
    Tensor,
    manual_seed,
)
from tracetorch.profiler import profile
from tracetorch.profiler.schedule import schedule
from tracetorch.text.units import format_time_ns

__all__ = (
    "DemoRun",
    "make_dataset",
    "build_cnn",
    "batches",
    "train_step",
    "run_demo",
)

def make_dataset(samples: int, num_classes: int = 10, image_size: int = 28,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic one-channel images: each class is a fixed random pattern plus noise.

    The patterns make the task learnable, so the demo's loss visibly falls; the values are
    scaled down so that a freshly initialised network starts near chance (loss ≈ ln 10).

    Returns:
        ``(images, labels)``: float32 ``(samples, 1, image_size, image_size)`` and int64
        ``(samples,)``.

    Example:
        >>> images, labels = make_dataset(4, image_size=8)
        >>> images.shape, labels.dtype
        ((4, 1, 8, 8), dtype('int64'))
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples!r}")
    rng = np.random.default_rng(seed)
    patterns = rng.standard_normal((num_classes, 1, image_size, image_size)).astype(np.float32)
    labels = rng.integers(0, num_classes, size=samples)
    noise = rng.standard_normal((samples, 1, image_size, image_size)).astype(np.float32)
    images = np.float32(0.3) * (patterns[labels] + np.float32(0.5) * noise)
    return images, labels.astype(np.int64)


def build_cnn(num_classes: int = 10, image_size: int = 28, seed: int = 0) -> Sequential:
    """Conv2d → ReLU → MaxPool2d → Conv2d → ReLU → MaxPool2d → Flatten → Linear.

    Both convolutions keep the size (3×3, padding 1) and each pool halves it, so
    ``image_size`` must be a multiple of 4.

    Example:
        >>> build_cnn(image_size=8)(Tensor(np.zeros((2, 1, 8, 8)))).shape
        (2, 10)
    """
    if image_size < 4 or image_size % 4:
        raise ValueError(f"image_size must be a positive multiple of 4, got {image_size!r}")
    manual_seed(seed)
    side = image_size // 4
    return Sequential(
        Conv2d(1, 8, kernel_size=3, padding=1), ReLU(), MaxPool2d(2),
        Conv2d(8, 16, kernel_size=3, padding=1), ReLU(), MaxPool2d(2),
        Flatten(), Linear(16 * side * side, num_classes),
    )


def batches(images: np.ndarray, labels: np.ndarray,
            batch_size: int) -> Iterator[tuple[Tensor, np.ndarray]]:
    """Endless ``(Tensor, labels)`` batches, cycling through the data in order.

    Example:
        >>> images, labels = make_dataset(3, image_size=4)
        >>> it = batches(images, labels, 2)
        >>> [len(next(it)[1]) for _ in range(3)]
        [2, 1, 2]
    """
    while True:
        for start in range(0, len(labels), batch_size):
            end = start + batch_size
            yield Tensor(images[start:end]), labels[start:end]


def train_step(model: Module, loss_fn: Module, optimizer: Optimizer, inputs: Tensor,
               targets: np.ndarray) -> float:
    """One step: zero the gradients, forward, loss, backward, optimizer step; returns the loss.

    Example:
        >>> model = build_cnn(image_size=4)
        >>> images, labels = make_dataset(2, image_size=4)
        >>> loss = train_step(model, CrossEntropyLoss(), SGD(model.parameters()), Tensor(images),
        ...                   labels)
        >>> loss > 0
        True
    """
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return float(loss.item())


@dataclass
class DemoRun:
    """What :func:`run_demo` returns: the profile, the loss after each step and the settings."""

    profile: profile
    losses: list[float]
    steps: int
    warmup: int
    batch_size: int
    image_size: int

    def headline(self) -> str:
        """One sentence saying what was trained and how the loss went."""
        skipped = "step 1 is" if self.warmup == 1 else f"steps 1-{self.warmup} are"
        return (f"Trained Conv2d-ReLU-MaxPool2d x2 + Linear (SGD, batch {self.batch_size}) on "
                f"synthetic {self.image_size}x{self.image_size} images for {self.steps} steps "
                f"({skipped} warm-up, not recorded); "
                f"loss {self.losses[0]:.3f} -> {self.losses[-1]:.3f}.")


def run_demo(steps: int = 20, batch_size: int = 32, image_size: int = 28, lr: float = 0.02,
             seed: int = 0, warmup: int = 1, progress: ProgressLine | None = None,
             timeline: bool = False) -> DemoRun:
    """Train :func:`build_cnn` with SGD for ``steps`` steps under the profiler.

    The first ``warmup`` steps run but are not recorded (a schedule skips them), so the
    report holds ``steps - warmup`` steps of forward, backward and optimizer calls.

    Args:
        progress: a line redrawn after each step with the step, loss and time per step.
        timeline: record per-call events (for a Chrome trace).

    Example:
        >>> run = run_demo(steps=3, batch_size=4, image_size=8)
        >>> run.profile.step_times.count, run.profile.find("SGD.step").calls
        (2, 2)
    """
    if steps <= warmup:
        raise ValueError(f"steps must be more than the {warmup} warm-up step(s), got {steps!r}")
    images, labels = make_dataset(max(batch_size, 256), image_size=image_size, seed=seed)
    model = build_cnn(image_size=image_size, seed=seed)
    loss_fn = CrossEntropyLoss()
    optimizer = SGD(model.parameters(), lr=lr, momentum=0.9)
    data = batches(images, labels, batch_size)
    losses: list[float] = []
    prof = profile(model, timeline=timeline,
                   schedule=schedule(warmup=warmup, active=steps - warmup, repeat=1))
    started = time.perf_counter_ns()
    with prof:
        for step in range(1, steps + 1):
            losses.append(train_step(model, loss_fn, optimizer, *next(data)))
            prof.step()
            if progress is not None:
                per_step = (time.perf_counter_ns() - started) // step
                progress.show(f"step {step}/{steps}  loss {losses[-1]:.3f}  "
                              f"{format_time_ns(per_step)}/step")
    if progress is not None:
        progress.clear()
    return DemoRun(prof, losses, steps, warmup, batch_size, image_size)
