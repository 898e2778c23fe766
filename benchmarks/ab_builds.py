"""Two builds of the C wrapper timed against each other in one process: what a change to
``tracetorch/engine/_hotpath.c`` does to the time of a module call.

Separate runs of ``peers.py`` on one build differ per module call by more than most changes to
the wrapper save, and alternating runs of two builds showed gains that the same two builds,
loaded side by side, did not (docs/overhead.md, "Where a BERT call's time goes"). So here the
checkout's own build (``A``) and another one (``B``: the ``_hotpath`` extension built in another
worktree) are loaded into one process, and ``peers.measure`` times ``tracetorch.profile`` with
each, one model, interleaved round by round, each sample paired with a plain one taken just
before it. Printed per build: ns per module call and % of the plain step (median over rounds, ±
half the interquartile range); then B - A paired by round (median, quartiles) and in how many
rounds B was the cheaper. Two files are mapped at different addresses, which may move the time
as well, so the null to read a difference against is an A/A run with a copy of the checkout's
own file as ``OTHER`` (the file itself loads as the same module), and a difference counts where
it holds with the builds' roles swapped too (run from the other checkout, with this one as
``OTHER``). How fine a difference that tells on BERT here (several hundred ns a call at best):
docs/overhead.md, "Which part of the key, and how far time can tell".

Run: ``python benchmarks/ab_builds.py OTHER [--rows bert-infer] [--rounds 100]
[--sample-ms 150] [--ops-off] [--quick]``, ``OTHER`` a built ``_hotpath`` extension file or a
checkout holding one (``python setup.py build_ext --inplace`` there first).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from peers import CLOCKS, Row, Variant, measure, select_work, unprofiled

import tracetorch
from tracetorch.engine import hotpath, patches

#: The extension's module name: the file of another build must be loaded under it (its init
#: function is named after it).
MODULE = "tracetorch.engine._hotpath"


def extension_file(other: Path) -> Path:
    """The ``_hotpath`` extension ``other`` names: the file itself, or the one a checkout holds."""
    if other.is_dir():
        found = sorted((other / "tracetorch" / "engine").glob("_hotpath*.so"))
        if not found:
            raise SystemExit(f"OTHER: no built _hotpath extension under {other}/tracetorch/engine "
                             "(run `python setup.py build_ext --inplace` there)")
        return found[0]
    if not other.is_file():
        raise SystemExit(f"OTHER: {other} is neither a file nor a checkout")
    return other


class Build(NamedTuple):
    """What a build of the extension puts on the hot path: its wrapper type, and the reader
    of the frame variable that goes with it (a build keeps nested calls' frames in cells of
    its own type, which only its reader reads through; an older build has none)."""

    wrapper: Any
    frame_reader: Callable[[], Any]


def own_build() -> Build:
    """The checkout's build, as the hot path holds it."""
    return Build(hotpath._NATIVE_WRAPPER, hotpath.innermost_frame)


def load_build(path: Path) -> Build:
    """The build in the extension file ``path``, loaded beside the checkout's own."""
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"OTHER: {path} cannot be loaded as {MODULE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reader = getattr(module, "FrameReader", None)
    return Build(module.Wrapper,
                 reader(hotpath._FRAME) if reader is not None else hotpath._FRAME.get)


def install(build: Build) -> Build:
    """Put ``build`` on the hot path (its wrapper, and its frame reader under whatever name a
    module of tracetorch's holds the reader in use); returns the build it replaced."""
    replaced = Build(hotpath._NATIVE_WRAPPER, hotpath.innermost_frame)
    hotpath._NATIVE_WRAPPER = build.wrapper
    for name, module in list(sys.modules.items()):
        if name.startswith("tracetorch."):
            namespace = vars(module)
            for held in [key for key, value in namespace.items()
                         if value is replaced.frame_reader]:
                namespace[held] = build.frame_reader
    return replaced


def profiled_with(build: Build, ops: bool) -> Variant:
    """A variant: ``tracetorch.profile(model, ops=ops)`` whose layer wrappers are ``build``'s."""

    @contextlib.contextmanager
    def variant(model: torch.nn.Module) -> Iterator[tracetorch.profile]:
        saved = install(build)
        # A class's wrapper is kept from one block to the next (patches._WRAPPERS): made anew
        # here, so the block runs this build's.
        patches._WRAPPERS.clear()
        try:
            with tracetorch.profile(model, ops=ops) as prof:
                yield prof
        finally:
            install(saved)
            patches._WRAPPERS.clear()

    return variant


def report(row: Row, names: dict[str, str]) -> None:
    """The row's two builds and their paired difference."""
    print(f"{row.work.name}: plain step {row.plain_ns / 1e6:.3f} ms, {row.calls} module calls, "
          f"{len(row.diffs.get('A', []))} rounds, {row.steps} steps/sample, {row.seconds:.0f} s")
    for name, label in names.items():
        if name in row.failed:
            print(f"  {name} ({label}): failed: {row.failed[name]}")
            continue
        added = row.added_pct(name)
        assert added is not None  # (timed in every round: failed otherwise)
        pct, noise = added
        print(f"  {name} ({label}): {row.added_ns(name):,.0f} ns a call, "
              f"{pct:+.2f}% ±{noise:.2f} of the step")
    if "A" in row.failed or "B" in row.failed:
        return
    paired = [(b - a) / row.calls for a, b in zip(row.diffs["A"], row.diffs["B"])]
    low, middle, high = statistics.quantiles(paired, n=4)
    cheaper = sum(difference < 0 for difference in paired)
    print(f"  B - A, paired by round: {middle:+,.0f} ns a call (quartiles {low:+,.0f} .. "
          f"{high:+,.0f}); B the cheaper in {cheaper} of {len(paired)} rounds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path,
                        help="the other build: a _hotpath extension file or a checkout with one")
    parser.add_argument("--rows", default="bert-infer",
                        help="comma-separated row names or prefixes of peers.py "
                             "(default: bert-infer)")
    parser.add_argument("--rounds", type=int, default=100, help="interleaved rounds (default 100)")
    parser.add_argument("--sample-ms", type=float, default=150.0,
                        help="plain time of one sample of back-to-back steps (default 150)")
    parser.add_argument("--ops-off", action="store_true",
                        help="profile with ops=False (no function mode: every call keyed after "
                             "it returns)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 2 rounds of ~2 ms samples")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the noise is a spread over rounds)")
    if args.quick:
        args.rounds, args.sample_ms = 2, 2.0
    if hotpath._NATIVE_WRAPPER is None:
        raise SystemExit("this checkout's C wrapper is not built (python setup.py build_ext "
                         "--inplace)")
    other = extension_file(args.other)
    names = {"A": "this checkout's build", "B": str(other)}
    ops = not args.ops_off
    variants = {"plain": unprofiled,
                "A": profiled_with(own_build(), ops),
                "B": profiled_with(load_build(other), ops)}
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, process CPU time, tracetorch.profile(ops={ops})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # missing FLOP rules under ops=False
        for work in select_work(args.rows):
            report(measure(work, args.rounds, args.sample_ms * 1e6, CLOCKS["cpu"], {},
                           variants=variants), names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
