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
tracetorch's as a ratio of FlopCounterMode's (total and added). With ``--pieces``, then what
each piece of a count's own work costs: ``count_flops`` again with the garbage collector off,
and with one piece at a time switched off (:data:`PIECES`: the piece does nothing, so the count
comes out wrong; only its instructions are read), the drop being the piece's cost.

Run: ``python benchmarks/one_shot_instructions.py [--models cnn,transformer] [--counts 5]
[--classes 1200] [--pieces]`` (needs ``valgrind``; about seven minutes, most of it importing
torch under Valgrind).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import warnings
from collections.abc import Iterator
from typing import Callable

import torch
from enter_exit import one_shot_ways, resnet, synthetic_classes, transformer
from instructions import run_counted, run_under_callgrind
from torch import nn
from torch_peers import module_calls

import tracetorch
from tracetorch.engine.tally import TallyCollector
from tracetorch.flops.registry import NO_RULE, FlopRegistry
from tracetorch.profiler.counting import count_forward
from tracetorch.records.tree import CALLS, new_entry

#: The models counted, by ``--models`` name: label, builder, input shape (batch 1, as
#: enter_exit.py's one-shot rows).
MODELS = {
    "cnn": ("ResNet-18-shaped CNN, 1x3x32x32", resnet, (1, 3, 32, 32)),
    "transformer": ("transformer encoder, 4 layers, 1x16x64", transformer, (1, 16, 64)),
}


def _free_rules(registry: FlopRegistry, layer_type: type, layer: object = None) -> object:
    # Each rule found stands in as one that costs nothing and counts 0.
    rule = _LOOKUP(registry, layer_type, layer)
    return rule if rule is None or rule is NO_RULE else _no_flops


def _no_flops(layer: object, inputs: object, output: object) -> int:
    return 0


def _counted(collector: TallyCollector, node: object, owner: object, key: object,
             shape: object, args: object, kwargs: object, output: object) -> list[object]:
    # A call's end as the wrappers need it (a counter already counted), without its rule and
    # its share of the total.
    entry = new_entry()
    entry[CALLS] = 1
    return entry


_LOOKUP = FlopRegistry.lookup

#: What ``--pieces`` switches off, one at a time: the piece's name, and the attribute replaced
#: with what stands in for it.
PIECES: dict[str, tuple[object, str, object]] = {
    "the FLOP rules": (FlopRegistry, "lookup", _free_rules),
    "each call's end (its rule, its share of the total)": (TallyCollector, "first_entry",
                                                           _counted),
}


@contextlib.contextmanager
def switched_off(piece: str) -> Iterator[None]:
    """For the duration, :data:`PIECES`' ``piece`` does nothing."""
    owner, attr, stand_in = PIECES[piece]
    original = vars(owner)[attr]
    setattr(owner, attr, stand_in)
    try:
        yield
    finally:
        setattr(owner, attr, original)


#: The breakdown's blocks (see :func:`breakdown_ways`), in order.
BREAKDOWN = ("block alone", "block, forward", "block, forward and twin", "block, forward twice")


def breakdown_ways(build: Callable[[], nn.Module], shape: tuple[int, ...]
                   ) -> dict[str, Callable[[], None]]:
    """Where a one-shot count's instructions go: ``count_flops``'s opening (``count_forward``)
    around nothing, one forward, a forward and one of a twin model (the same layer classes,
    wrapped already: its calls recorded as a first forward's are), and two forwards (the
    second one takes up the first one's frames again: a loop's calls)."""
    model, twin, x = build(), build(), torch.randn(shape)

    def block(*forwards: nn.Module) -> Callable[[], None]:
        def forward() -> None:
            for layer in forwards:
                layer(x)

        def run() -> None:
            count_forward(model, forward)
        return run

    return dict(zip(BREAKDOWN, (block(), block(model), block(model, twin),
                                block(model, model))))


#: The name of ``count_flops`` counted with the garbage collector off, before :data:`PIECES`.
ALL_ON = "count_flops, garbage collector off"


def piece_ways(build: Callable[[], nn.Module], shape: tuple[int, ...]
               ) -> list[tuple[str, Callable[[], None]]]:
    """``count_flops`` on a model of its own, then with each of :data:`PIECES` switched off."""
    model = build()

    def count() -> None:
        tracetorch.count_flops(model, shape)

    def without(piece: str) -> Callable[[], None]:
        def run() -> None:
            with switched_off(piece):
                count()
        return run

    return [(ALL_ON, count), *((piece, without(piece)) for piece in PIECES)]


def run_child(models: list[str], counts: int, classes: int, pieces: bool) -> dict[str, object]:
    """Inside callgrind: each way on each model, ``counts`` times in one ``functools.reduce``
    call (after two uncounted calls), then the breakdown's blocks with the garbage collector
    off (their recordings are left to it, as a profile's are), and with ``pieces``
    :func:`piece_ways` with it off. Returns the ``model/way`` names in dump order, and per
    model its module calls per forward."""
    keep = synthetic_classes(classes)  # noqa: F841 - alive while counting, as in enter_exit.py
    dumped: list[str] = []
    calls: dict[str, int] = {}
    with torch.no_grad():
        for label, build, shape in (MODELS[name] for name in models):
            calls[label] = _module_calls(build, shape)
            ways = [*one_shot_ways(build(), shape).items(),
                    *breakdown_ways(build, shape).items(),
                    *(piece_ways(build, shape) if pieces else ())]
            for way, fn in ways:
                fn()
                fn()
                dumped.append(f"{label}/{way}")
                run_counted(fn, counts,
                            collector_off=way in BREAKDOWN or way == ALL_ON or way in PIECES)
    return {"dumped": dumped, "calls": calls}


def _module_calls(build: Callable[[], nn.Module], shape: tuple[int, ...]) -> int:
    model, x = build(), torch.randn(shape)
    return module_calls(model, lambda: model(x))


def count(models: list[str], counts: int, classes: int, pieces: bool, valgrind: str
          ) -> tuple[dict[str, int], dict[str, int]]:
    """Run the child under callgrind: the instructions of one call of each way, by name, and
    each model's module calls per forward."""
    result, events = run_under_callgrind(
        valgrind, ["--child", "--models", ",".join(models), "--counts", str(counts),
                   "--classes", str(classes), *(["--pieces"] if pieces else [])], __file__)
    dumped = result["dumped"]
    if len(events) != len(dumped):
        raise RuntimeError(f"{len(events)} dumps for {len(dumped)} counted ways")
    return ({name: counted["Ir"] // counts for name, counted in zip(dumped, events)},
            result["calls"])


def report(models: list[str], per_call: dict[str, int],
           calls: dict[str, int]) -> None:
    """Per model: each way's instructions per call, added over the plain forward, ratios; then
    the breakdown of count_flops's block."""
    for label in (MODELS[name][0] for name in models):
        ways = {name.split("/", 1)[1]: n for name, n in per_call.items()
                if name.startswith(label + "/")}
        plain, reference = ways["plain forward"], ways["FlopCounterMode"]
        print(f"  {label}")
        for way, n in ways.items():
            if way in BREAKDOWN or way == ALL_ON or way in PIECES:
                continue
            line = (f"    {way:<16} {n / 1e6:8.2f} M   +{(n - plain) / 1e6:7.2f} M over a "
                    f"plain forward")
            if way in ("count_flops", "profile(model)"):
                line += (f"   {n / reference:.2f}x FlopCounterMode's "
                         f"({(n - plain) / (reference - plain):.2f}x its added)")
            print(line)
        alone, once, twin, twice = (ways[way] for way in BREAKDOWN)
        module_calls_made = calls[label]
        first = twin - once - plain  # every module call recorded, the classes wrapped already
        again = twice - once - plain  # the same, each call's frame taken up again
        wrapping = once - alone - plain - first
        print(f"    count_flops's block, garbage collector off: {alone / 1e6:.2f} M entering and "
              f"leaving; the first forward +{(once - alone - plain) / 1e6:.2f} M over a plain "
              f"one:\n      its {module_calls_made} module calls {first / 1e6:.2f} M "
              f"({first / module_calls_made:,.0f} each; {again / module_calls_made:,.0f} each "
              f"again in a loop), wrapping the classes at their first calls "
              f"{wrapping / 1e6:.2f} M")
        if ALL_ON in ways:
            every = ways[ALL_ON]
            drops = ", ".join(f"{piece} {(ways[piece] - every) / 1e6:+.2f} M" for piece in PIECES)
            print(f"    count_flops with the garbage collector off {every / 1e6:.2f} M "
                  f"({(ways['count_flops'] - every) / 1e6:.2f} M less than with it on); with "
                  f"one piece off at a time: {drops}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, among {', '.join(MODELS)} (default: both)")
    parser.add_argument("--counts", type=int, default=5,
                        help="calls of each way counted (default 5)")
    parser.add_argument("--classes", type=int, default=1200,
                        help="synthetic layer classes defined meanwhile (default 1200)")
    parser.add_argument("--pieces", action="store_true",
                        help="then count_flops with each piece of its work switched off")
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
        print(json.dumps(run_child(models, args.counts, args.classes, args.pieces)))
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("one_shot_instructions.py needs valgrind (Debian: apt-get install valgrind)",
              file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, 1 thread, batch 1, no_grad, callgrind instructions "
          f"per call ({args.counts} counted):")
    report(models, *count(models, args.counts, args.classes, args.pieces, valgrind))
    return 0


if __name__ == "__main__":
    sys.exit(main())
