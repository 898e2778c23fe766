"""Check tracetorch's per-layer CUDA times against CUDA events around the whole forward.

On a GPU machine: a convolutional net and a transformer-style MLP stack run on CUDA inside
``tracetorch.profile``; each forward is also bracketed by a pair of ``torch.cuda.Event``\\ s.
Checked, per model:

* the model's own recorded device time equals the bracketing events' time (within
  ``--tolerance``, default 5%, plus 50 µs): both read the same GPU timeline;
* the sum of the top-level layers' device times is at most the model's time and at least
  ``1 - tolerance`` of it (the model does little besides calling them, and its GPU work
  dominates at the batch sizes used);
* no device synchronisation happened per layer: when ``model(x)`` returns, the GPU is still
  busy with the forward (informational only; a very fast GPU can finish first).

Prints a table per model (layer, calls, device ms per call, share of the forward) and exits 1 on
a mismatch. Without CUDA it prints why and exits 0.

Run: ``python benchmarks/gpu_check.py [--tolerance 0.05] [--repeats 20]``
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

try:
    import torch
except ImportError:  # pragma: no cover - the check needs torch
    print("gpu_check: torch is not installed; nothing to check.")
    sys.exit(0)

import tracetorch


def conv_net() -> torch.nn.Module:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000))


def mlp_stack() -> torch.nn.Module:
    nn = torch.nn
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.LayerNorm(1024), nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)]
    return nn.Sequential(*layers)


def check(name: str, model: torch.nn.Module, x: torch.Tensor, repeats: int,
          tolerance: float) -> bool:
    model = model.cuda().eval()
    x = x.cuda()
    with torch.no_grad():
        for _ in range(3):
            model(x)
        torch.cuda.synchronize()
        whole: list[float] = []
        still_busy = 0
        with tracetorch.profile(model) as prof:
            for _ in range(repeats):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                model(x)
                end.record()
                still_busy += not end.query()
                end.synchronize()
                whole.append(start.elapsed_time(end) * 1e6)
                prof.step()
    top = prof.find("")
    model_ns = top.time.total_ns
    events_ns = sum(whole)
    layers_ns = sum(child.time.total_ns for child in top.children.values())
    rows: list[tuple[str, Any, int, float, float]] = [
        (child.path, child.type_name, child.calls, child.time.total_ns / max(child.calls, 1) / 1e6,
         100.0 * child.time.total_ns / max(model_ns, 1)) for child in top.children.values()]
    print(f"\n{name}: input {tuple(x.shape)}, {repeats} forwards")
    print(f"  {'layer':<8} {'type':<20} {'calls':>5} {'ms/call':>9} {'share':>7}")
    for path, type_name, calls, ms, share in rows:
        print(f"  {path:<8} {type_name:<20} {calls:>5} {ms:>9.4f} {share:>6.1f}%")
    print(f"  model (tracetorch)        {model_ns / 1e6 / repeats:9.4f} ms/forward")
    print(f"  whole forward (events)    {events_ns / 1e6 / repeats:9.4f} ms/forward")
    print(f"  sum of top-level layers   {layers_ns / 1e6 / repeats:9.4f} ms/forward")
    print(f"  forwards still running on the GPU when model(x) returned: {still_busy}/{repeats}")
    slack = 50_000 * repeats
    ok = True
    if abs(model_ns - events_ns) > tolerance * events_ns + slack:
        print(f"  MISMATCH: model time differs from the bracketing events by "
              f"{100 * (model_ns - events_ns) / events_ns:+.1f}%")
        ok = False
    if layers_ns > model_ns + slack or layers_ns < (1 - tolerance) * model_ns - slack:
        print(f"  MISMATCH: top-level layers sum to {100 * layers_ns / model_ns:.1f}% of the model")
        ok = False
    if ok:
        print("  ok")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; nothing to check (exit 0).")
        return 0
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    results = [
        check("conv net", conv_net(), torch.randn(64, 3, 224, 224), args.repeats, args.tolerance),
        check("MLP stack", mlp_stack(), torch.randn(64, 128, 1024), args.repeats, args.tolerance),
    ]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
