"""A PyTorch CNN training loop under the profiler: forward, backward and optimizer per step.

The model and the loop are plain PyTorch; tracetorch only wraps the loop in ``profile(...)``
and marks steps with ``prof.step()``. The schedule skips the first step (lazy initialisation
and allocator growth land there) and records the next ones.

    python examples/torch_cnn.py [--steps 6] [--out torch-cnn.json]

Without PyTorch installed (``pip install 'tracetorch[torch]'``) it explains and exits 0.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import tracetorch as tt

try:
    import torch
    from torch import nn
except ImportError:  # torch is an optional extra; say so instead of failing
    torch = None


def build_model() -> Any:
    """Conv → ReLU → MaxPool, twice, then a Linear classifier, for 1×28×28 images."""
    return nn.Sequential(
        nn.Conv2d(1, 8, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="training steps (>= 2)")
    parser.add_argument("--out", help="also save the profile as JSON")
    args = parser.parse_args(argv)
    if torch is None:
        print("This example needs PyTorch: pip install 'tracetorch[torch]'. "
              "Without it, see examples/profile_mlp.py or run `tracetorch demo`.")
        return 0
    if args.steps < 2:
        parser.error("--steps must be at least 2 (the first one is a warm-up)")

    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    images, labels = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))

    skip_first = tt.schedule(warmup=1, active=args.steps - 1, repeat=1)
    with tt.profile(model, schedule=skip_first) as prof:
        for step in range(args.steps):
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            prof.step()
            print(f"step {step + 1}/{args.steps}  loss {loss.item():.3f}")

    print()
    print(prof)
    if args.out:
        prof.save(args.out)
        print(f"saved to {args.out}; print it again with: tracetorch report {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
