"""The profiling guide's workflow, end to end, on a tracetorch.core MLP.

Static analysis first (parameters, FLOPs from shapes), then a careful latency measurement, then
the per-layer profile of real calls: the tree is printed, saved as JSON and read back.

    python examples/profile_mlp.py [--batch 64] [--out mlp-profile.json]

Then print the saved profile again, or view it by layer type:

    tracetorch report mlp-profile.json --flat type
"""
from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence

import numpy as np

import tracetorch as tt
from tracetorch.core import Linear, ReLU, Sequential, Tensor


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="rows per forward call")
    parser.add_argument("--out", help="where to save the profile (default: a temporary file)")
    args = parser.parse_args(argv)

    model = Sequential(Linear(784, 256), ReLU(), Linear(256, 10))
    x = Tensor(np.random.default_rng(0).standard_normal((args.batch, 784)).astype(np.float32))

    # 1. Static analysis: what the model costs before anything runs.
    params = tt.count_parameters(model)
    flops = tt.count_flops(model, (args.batch, 784))
    print(f"Parameters:      {params:,}")
    print(f"Forward FLOPs:   {flops:,} for a batch of {args.batch} (FLOPs = 2 x MACs)")

    # 2. Latency: warm-up calls first, then the mean of timed calls, in seconds.
    latency = tt.measure_latency(model, x, warmup=5, iterations=50)
    print(f"Mean latency:    {latency * 1e3:.3f} ms  ->  {flops / latency / 1e9:.2f} GFLOP/s")

    # 3. The profile: every layer call inside the block, as a tree.
    with tt.profile(model) as prof:
        for _ in range(10):
            model(x)
    print()
    print(prof)

    # 4. Save it, read it back: a saved profile answers the same questions as a live one.
    path = args.out or os.path.join(tempfile.mkdtemp(), "mlp-profile.json")
    prof.save(path)
    again = tt.load(path)
    assert again.find("layers.0").calls == prof.find("layers.0").calls == 10
    assert again.forward_flops == prof.forward_flops == 10 * flops
    print(f"\nSaved to {path} and read back: {again.find('layers.0').calls} calls of "
          f"layers.0, {again.forward_flops:,} forward FLOPs in all.")


if __name__ == "__main__":
    main()
