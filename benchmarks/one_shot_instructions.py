"""Machine instructions of a one-shot FLOP count against FlopCounterMode's: a count, not a time.

``enter_exit.py`` times the one-shot counts, and on a shared machine its medians move by ±15%
between runs, which hides a change of a few percent. This script runs the same ways of counting
one forward (``enter_exit.one_shot_ways``: a plain forward, ``FlopCounterMode``,
``tracetorch.count_flops`` and ``with tracetorch.profile(model)``) on the same two models under
Valgrind's callgrind, and counts the instructions executed inside the counted calls only (as
``instructions.py`` does: ``--toggle-collect`` and ``--dump-after`` on ``functools.reduce``,
which runs one way ``--counts`` times; one dump per way). The count does not depend on what
else the machine runs, so one run compares two versions of the code. An instruction is not a
time (inside a forward, the conv kernels evict the interpreter's caches, so Python bookkeeping
costs more per instruction than the arithmetic does): the goal stays with ``enter_exit.py``.

Printed per model: each way's instructions per count, added over the plain forward, and
tracetorch's as a ratio of FlopCounterMode's (total and added).

Run: ``python benchmarks/one_shot_instructions.py [--models cnn,transformer] [--counts 5]
[--classes 1200]`` (needs ``valgrind``; about seven minutes, most of it importing torch under
Valgrind).
"""
from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import warnings

import torch
from enter_exit import one_shot_ways, resnet, synthetic_classes, transformer
from instructions import run_under_callgrind

#: The models counted, by ``--models`` name: label, builder, input shape (batch 1, as
#: enter_exit.py's one-shot rows).
MODELS = {
    "cnn": ("ResNet-18-shaped CNN, 1x3x32x32", resnet, (1, 3, 32, 32)),
    "transformer": ("transformer encoder, 4 layers, 1x16x64", transformer, (1, 16, 64)),
}


def run_child(models: list[str], counts: int, classes: int) -> list[str]:
    """Inside callgrind: each way on each model, ``counts`` times in one ``functools.reduce``
    call (after two uncounted calls). Returns the ``model/way`` names in dump order."""
    keep = synthetic_classes(classes)  # noqa: F841 - alive while counting, as in enter_exit.py
    dumped: list[str] = []
    with torch.no_grad():
        for label, build, shape in (MODELS[name] for name in models):
            for way, fn in one_shot_ways(build(), shape).items():
                fn()
                fn()
                dumped.append(f"{label}/{way}")
                functools.reduce(lambda _, __: fn(), range(counts), None)
    return dumped


def count(models: list[str], counts: int, classes: int, valgrind: str) -> dict[str, int]:
    """Run the child under callgrind: the instructions of one call of each way, by name."""
    dumped, totals = run_under_callgrind(
        valgrind, ["--child", "--models", ",".join(models), "--counts", str(counts),
                   "--classes", str(classes)], __file__)
    if len(totals) != len(dumped):
        raise RuntimeError(f"{len(totals)} dumps for {len(dumped)} counted ways")
    return {name: total // counts for name, total in zip(dumped, totals)}


def report(models: list[str], per_call: dict[str, int]) -> None:
    """Per model: each way's instructions per call, added over the plain forward, ratios."""
    for label in (MODELS[name][0] for name in models):
        ways = {name.split("/", 1)[1]: n for name, n in per_call.items()
                if name.startswith(label + "/")}
        plain, reference = ways["plain forward"], ways["FlopCounterMode"]
        print(f"  {label}")
        for way, n in ways.items():
            line = (f"    {way:<16} {n / 1e6:8.2f} M   +{(n - plain) / 1e6:7.2f} M over a "
                    f"plain forward")
            if way in ("count_flops", "profile(model)"):
                line += (f"   {n / reference:.2f}x FlopCounterMode's "
                         f"({(n - plain) / (reference - plain):.2f}x its added)")
            print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, among {', '.join(MODELS)} (default: both)")
    parser.add_argument("--counts", type=int, default=5,
                        help="calls of each way counted (default 5)")
    parser.add_argument("--classes", type=int, default=1200,
                        help="synthetic layer classes defined meanwhile (default 1200)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.counts < 1:
        parser.error("--counts must be at least 1")
    if args.classes < 0:
        parser.error("--classes must be at least 0")
    models = [name.strip() for name in args.models.split(",") if name.strip()]
    if not models or any(name not in MODELS for name in models):
        parser.error(f"--models takes names among {', '.join(MODELS)}; got {args.models!r}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # layers with no FLOP rule
    if args.child:
        print(json.dumps(run_child(models, args.counts, args.classes)))
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("one_shot_instructions.py needs valgrind (Debian: apt-get install valgrind)",
              file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, 1 thread, batch 1, no_grad, callgrind instructions "
          f"per call ({args.counts} counted):")
    report(models, count(models, args.counts, args.classes, valgrind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
