"""Train a small CNN with tracetorch.core on synthetic "which quadrant is bright" images.

Each 16x16 grey image holds one bright blob in one of its four quadrants (plus noise); the
label is the quadrant.  The data is generated with a fixed seed, so runs are repeatable and
need no download.  Runs in a few seconds on a laptop CPU:

    python examples/train_cnn.py --epochs 5

``build_model()`` and ``make_dataset()`` can be imported, e.g. to profile the model::

    import tracetorch as tt
    from train_cnn import build_model          # with examples/ on sys.path
    model = build_model()
    print(tt.count_parameters(model))
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from tracetorch.core import (
    Adam,
    Conv2d,
    CrossEntropyLoss,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
    Tensor,
    manual_seed,
    no_grad,
)

__all__ = ["build_model", "make_dataset", "main"]

IMAGE_SIZE = 16
NUM_CLASSES = 4


def make_dataset(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images (n, 1, 16, 16) float32 and their quadrant labels (n,) int64."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=n)
    half = IMAGE_SIZE // 2
    # Blob centre: somewhere inside the labelled quadrant (row half = label // 2, col = label % 2).
    cy = (labels // 2) * half + rng.uniform(2, half - 2, size=n)
    cx = (labels % 2) * half + rng.uniform(2, half - 2, size=n)
    grid = np.arange(IMAGE_SIZE)
    dy = grid[None, :, None] - cy[:, None, None]
    dx = grid[None, None, :] - cx[:, None, None]
    blobs = np.exp(-(dy**2 + dx**2) / (2 * 1.5**2))
    images = 0.8 * blobs + 0.8 * rng.standard_normal((n, IMAGE_SIZE, IMAGE_SIZE))
    return images[:, None].astype(np.float32), labels.astype(np.int64)


def build_model() -> Sequential:
    """Conv-ReLU-Pool twice, then a linear classifier: (N, 1, 16, 16) -> (N, 4) logits."""
    return Sequential(
        Conv2d(1, 8, kernel_size=3, padding=1),
        ReLU(),
        MaxPool2d(2),
        Conv2d(8, 16, kernel_size=3, padding=1),
        ReLU(),
        MaxPool2d(2),
        Flatten(),
        Linear(16 * 4 * 4, NUM_CLASSES),
    )


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Train and print the mean loss and accuracy per epoch; returns the per-epoch losses."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    manual_seed(args.seed)
    images, labels = make_dataset(args.samples, seed=args.seed)
    model = build_model()
    loss_fn = CrossEntropyLoss()
    optimizer = Adam(model.parameters(), lr=args.lr)
    order_rng = np.random.default_rng(args.seed + 1)

    losses: list[float] = []
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = order_rng.permutation(args.samples)
        total, batches = 0.0, 0
        for begin in range(0, args.samples, args.batch_size):
            idx = order[begin : begin + args.batch_size]
            loss = loss_fn(model(Tensor(images[idx])), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        model.eval()
        with no_grad():
            predictions = model(Tensor(images)).data.argmax(axis=1)
        accuracy = float((predictions == labels).mean())
        losses.append(total / batches)
        print(f"epoch {epoch}/{args.epochs}  loss {losses[-1]:.4f}  accuracy {accuracy:.1%}")
    elapsed = time.perf_counter() - start
    print(f"final loss {losses[-1]:.4f} (first epoch {losses[0]:.4f}) in {elapsed:.1f} s")
    return losses


if __name__ == "__main__":
    main()
