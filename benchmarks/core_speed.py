"""Achieved GFLOP/s of tracetorch.core Linear and Conv2d, forward and backward.

Shapes (batch 64): Linear 1024 -> 1024; Conv2d 16 -> 32 channels, 3x3, padding 1, on 32x32.
Each is compared with bare numpy doing the same GEMM (``x @ w``; for the convolution, the
GEMM of the already-unfolded columns, i.e. without im2col) and, when torch is importable,
with torch on CPU using the same number of threads as numpy's BLAS.  Times are medians of
``--reps`` runs after warm-up; FLOPs count 2 per multiply-add (bias adds excluded), and a
backward pass computes both the input and the weight gradients.

    python benchmarks/core_speed.py              # about 10-20 s
    python benchmarks/core_speed.py --threads 1  # steadier on a shared machine
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable


def _pin_threads_from_argv(argv: Sequence[str]) -> None:
    """``--threads N`` must reach OpenBLAS before numpy loads it, so it is read here."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--threads=") else (
            argv[i + 1] if arg == "--threads" and i + 1 < len(argv) else None)
        if value:
            for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                os.environ[var] = value


if __name__ == "__main__":
    _pin_threads_from_argv(sys.argv[1:])

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracetorch.core import Conv2d, Linear, Tensor, no_grad  # noqa: E402

BATCH = 64


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """A runner that calls ``fn`` once and returns the seconds it took."""

    def run() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return run


def timed_backward(make_out: Callable[[], Tensor], grad: np.ndarray,
                   leaves: Sequence[Tensor]) -> Callable[[], float]:
    """A runner timing ``out.backward(grad)`` alone (grads cleared before, untimed)."""
    out = make_out()

    def run() -> float:
        for leaf in leaves:
            leaf.grad = None
        start = time.perf_counter()
        out.backward(grad)
        return time.perf_counter() - start

    return run


def medians(runners: dict[str, Callable[[], float]], reps: int, threads: int,
            warmup: int = 3) -> dict[str, float]:
    """Median seconds per runner.

    Runners are interleaved rep by rep, so a burst of load from other processes hits each
    alike.  With more than one thread, torch runners are timed in a block of their own:
    torch's OpenMP pool and numpy's OpenBLAS pool busy-wait after each call, and alternating
    them makes whichever runs next wait for the other's spinning threads.
    """
    samples: dict[str, list[float]] = {name: [] for name in runners}
    if threads == 1:
        groups = [list(runners)]
    else:
        groups = [[n for n in runners if not n.startswith("torch")],
                  [n for n in runners if n.startswith("torch")]]
    for group in groups:
        for i in range(warmup + reps):
            for name in group:
                elapsed = runners[name]()
                if i >= warmup:
                    samples[name].append(elapsed)
        time.sleep(0.3)  # let the previous pool's threads go idle
    return {name: statistics.median(values) for name, values in samples.items() if values}


def blas_threads() -> tuple[int, str]:
    """numpy's BLAS thread count, and how it was found."""
    try:
        from threadpoolctl import threadpool_info

        counts = [p["num_threads"] for p in threadpool_info() if p.get("user_api") == "blas"]
        if counts:
            return counts[0], "threadpoolctl"
    except ImportError:
        pass
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var]), var
    return os.cpu_count() or 1, "assumed: OpenBLAS default = CPU count (threadpoolctl absent)"


def _no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with no_grad():
            return fn()

    return run


def bench_linear(reps: int, threads: int, torch) -> dict[str, float]:
    rng = np.random.default_rng(0)
    fin = fout = 1024
    layer = Linear(fin, fout)
    x = rng.standard_normal((BATCH, fin), dtype=np.float32)
    g = rng.standard_normal((BATCH, fout), dtype=np.float32)
    w = layer.weight.data
    xt, xg = Tensor(x), Tensor(x, requires_grad=True)
    runners = {
        "numpy fwd": timed(lambda: x @ w),
        "core fwd": timed(lambda: layer(xt)),
        "core fwd no_grad": timed(_no_grad(lambda: layer(xt))),
        "numpy bwd": timed(lambda: (g @ w.T, x.T @ g)),
        "core bwd": timed_backward(lambda: layer(xg), g, [xg] + layer.parameters()),
    }
    if torch is not None:
        tx = torch.from_numpy(x).requires_grad_()
        tw = torch.from_numpy(w.copy()).requires_grad_()
        tb = torch.zeros(fout, requires_grad=True)
        tg = torch.from_numpy(g)
        out = tx @ tw + tb
        runners["torch fwd"] = timed(_torch_no_grad(torch, lambda: tx @ tw + tb))
        runners["torch bwd"] = timed(
            lambda: torch.autograd.grad(out, (tx, tw, tb), tg, retain_graph=True))
    res = medians(runners, reps, threads)
    res["flops"] = 2 * BATCH * fin * fout
    return res


def _torch_no_grad(torch, fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return fn()

    return run


def bench_conv(reps: int, threads: int, torch) -> dict[str, float]:
    rng = np.random.default_rng(1)
    cin, cout, size, k = 16, 32, 32, 3
    conv = Conv2d(cin, cout, k, padding=1)
    x = rng.standard_normal((BATCH, cin, size, size), dtype=np.float32)
    g = rng.standard_normal((BATCH, cout, size, size), dtype=np.float32)
    w = conv.weight.data
    xt, xg = Tensor(x), Tensor(x, requires_grad=True)
    cols = rng.standard_normal((BATCH, cin * k * k, size * size), dtype=np.float32)
    w2 = w.reshape(cout, -1)
    g3 = g.reshape(BATCH, cout, -1)
    runners = {
        "numpy fwd": timed(lambda: np.matmul(w2, cols)),
        "core fwd": timed(lambda: conv(xt)),
        "core fwd no_grad": timed(_no_grad(lambda: conv(xt))),
        "numpy bwd": timed(lambda: (np.matmul(w2.T, g3), np.matmul(g3, cols.transpose(0, 2, 1)))),
        "core bwd": timed_backward(lambda: conv(xg), g, [xg] + conv.parameters()),
    }
    if torch is not None:
        conv2d = torch.nn.functional.conv2d
        tx = torch.from_numpy(x).requires_grad_()
        tw = torch.from_numpy(w.copy()).requires_grad_()
        tb = torch.zeros(cout, requires_grad=True)
        tg = torch.from_numpy(g)
        out = conv2d(tx, tw, tb, padding=1)
        runners["torch fwd"] = timed(_torch_no_grad(torch, lambda: conv2d(tx, tw, tb, padding=1)))
        runners["torch bwd"] = timed(
            lambda: torch.autograd.grad(out, (tx, tw, tb), tg, retain_graph=True))
    res = medians(runners, reps, threads)
    res["flops"] = 2 * k * k * cin * cout * size * size * BATCH
    return res


def report(title: str, res: dict[str, float]) -> list[str]:
    print(f"\n{title}  (forward {res['flops'] / 1e6:.1f} MFLOP, backward 2x that)")
    print(f"  {'':18s} {'median ms':>10s} {'GFLOP/s':>9s}")
    for key in ("numpy fwd", "core fwd", "core fwd no_grad", "torch fwd",
                "numpy bwd", "core bwd", "torch bwd"):
        if key in res:
            flops = res["flops"] * (2 if "bwd" in key else 1)
            print(f"  {key:18s} {res[key] * 1e3:10.3f} {flops / res[key] / 1e9:9.1f}")
    lines = []
    for phase in ("fwd", "bwd"):
        core = res[f"core {phase}"]
        ratio = f"core/numpy {res[f'numpy {phase}'] / core:.2f}x"
        if f"torch {phase}" in res:
            ratio += f", core/torch {res[f'torch {phase}'] / core:.2f}x"
        lines.append(f"{title.split()[0]} {phase}: {ratio} (throughput ratios; >1 = core faster)")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="tracetorch.core Linear/Conv2d GFLOP/s")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--no-torch", action="store_true", help="skip the torch comparison")
    parser.add_argument("--threads", type=int, default=None,
                        help="pin numpy's BLAS and torch to this many threads (default: "
                             "numpy's own count; 1 is steadier on a busy machine)")
    args = parser.parse_args(argv)
    threads, how = blas_threads()
    torch = None
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(threads)
        except ImportError:
            torch = None
    print(f"numpy {np.__version__}, BLAS threads {threads} ({how}); "
          + (f"torch {torch.__version__} with {torch.get_num_threads()} threads"
             if torch is not None else "torch not available"))
    summary = report("Linear 1024->1024, batch 64", bench_linear(args.reps, threads, torch))
    summary += report("Conv2d 16->32 3x3 pad 1 on 32x32, batch 64",
                      bench_conv(args.reps, threads, torch))
    print("\nSummary (goals: Linear fwd core/numpy >= 0.8; Conv2d fwd core/torch >= 0.3)")
    for line in summary:
        print("  " + line)


if __name__ == "__main__":
    main()
