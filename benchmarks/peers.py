"""What tracetorch and its peers add per module call, every column measured in one run.

Each row is one piece of work (a step): the model is built once, then every variant of
``torch_peers`` (plain; bare wrapt wrappers; forward hooks; forward + full backward hooks;
``torch.profiler``; DeepSpeed's ``FlopsProfiler``; ``tracetorch.profile(model)``, also with
``ops=False`` and with ``backward_every=8``; and "plain again", the plain step itself: the method's
null, which reads 0 within the noise where the pairing favours no side) is entered, runs its warm-up
steps (``--warmup``, 2 by default: what a variant builds at a layer's first calls, and tracetorch's
learned operation counts, which take a layer's first two calls), times a sample of back-to-back
steps and is left again; what the warm-up steps added is reported apart. Variants are interleaved
round by round (the order rotates each round), each sample paired with a plain one taken just before
it; a column's cell is the median over rounds of (the variant's sample - its plain sample) per step,
divided by the module calls per step (counted once with forward hooks). The garbage collector runs
between samples, never inside one. One thread (``torch.set_num_threads(1)``), batch 1. The clock is
the process's CPU time by default (``--clock wall`` for wall time): on a shared machine the time
spent waiting for a core is noise, not cost.

Rows (``--rows`` takes names or prefixes, e.g. ``mlp``):

* ``mlp-infer``   50 x (Linear(8, 8), ReLU), inference under ``torch.no_grad()``;
* ``mlp-grad``    the same forward with autograd recording;
* ``mlp-train``   a training step: forward, MSE loss against zero, backward, SGD step,
  ``zero_grad``;
* ``bert-infer``  ``transformers.BertModel`` (hidden 256, 4 layers, 4 heads, intermediate 1024,
  random weights, nothing downloaded) on 128 token ids, ``eval()`` and ``no_grad``;
* ``bert-grad``   the same BERT's forward in ``train()`` mode with autograd recording (what a
  training step's forward costs, without the backward's noise);
* ``bert-train``  the same BERT's training step, as ``mlp-train``, in ``train()`` mode.

A cell is ``–`` where a variant cannot run (DeepSpeed or transformers not installed, or the
variant raised); the reason is printed under the table. ``pip install deepspeed==0.19.8`` (its
CPU install compiles nothing) and ``transformers`` fill those columns and rows. Then the same
table as % added to the plain step (± half the interquartile range over rounds: the noise), and
per row tracetorch's added cost as a ratio of forward hooks' and torch.profiler's (the goal: at
most 5% added to a BERT-sized training step on CPU).

Run: ``python benchmarks/peers.py [--rounds 15] [--sample-ms 50] [--rows mlp,bert]
[--clock cpu|wall] [--warmup 2] [--columns tracetorch,...] [--quick]``
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch_peers import (
    bare_wrapt,
    build_mlp,
    deepspeed_profiler,
    forward_classes,
    import_deepspeed,
    module_calls,
    timing_hooks,
    torch_profiler,
    torch_profiler_detailed,
)

import tracetorch

Step = Callable[[], object]
Variant = Callable[[torch.nn.Module], contextlib.AbstractContextManager]


@contextlib.contextmanager
def sampled_backward(model: torch.nn.Module, every: int) -> Iterator[tracetorch.profile]:
    """``tracetorch.profile(model, backward_every=every)``, stepped as a training loop would:
    at the end of each step, here after every optimizer step (a global post-hook, removed on
    exit; rows without an optimizer are one step, sampled)."""
    with tracetorch.profile(model, backward_every=every) as prof:
        hook = register_optimizer_step_post_hook(lambda *_: prof.step())
        try:
            yield prof
        finally:
            hook.remove()


def unprofiled(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """The model run as it is: the baseline every sample is paired with, and the null column."""
    return contextlib.nullcontext()


#: The plain step as a column of its own: a measure's null (see :data:`VARIANTS`).
PLAIN_AGAIN = "plain again"
#: Columns of the table, in the issue's order (then tracetorch's cheapest setting, and last the
#: null); ``plain`` is the baseline, not a column.
VARIANTS: dict[str, Variant] = {
    "plain": unprofiled,
    "bare wrapt": lambda model: bare_wrapt(forward_classes(model)),
    "forward hooks": timing_hooks,
    "forward + full backward hooks": lambda model: timing_hooks(model, backward=True),
    "torch.profiler": torch_profiler,
    "DeepSpeed profiler": deepspeed_profiler,
    "tracetorch": tracetorch.profile,
    # Rules only: no function mode at all (backward passes found at their first node).
    "tracetorch ops=False": lambda model: tracetorch.profile(model, ops=False),
    # Backward attributed on one step in 8 (stepped after each optimizer step: training rows).
    "tracetorch backward_every=8": lambda model: sampled_backward(model, 8),
    # What a user wanting per-layer FLOPs from torch turns on.
    "torch.profiler shapes+FLOPs+modules": torch_profiler_detailed,
    # The method's own floor: the plain step paired with the plain sample before it. Any
    # order effect of the pairing shows here; its cell should read 0 within the noise.
    PLAIN_AGAIN: unprofiled,
}
COLUMNS = [name for name in VARIANTS if name != "plain"]
BERT_GOAL_PCT = 5.0


@dataclass(frozen=True)
class Work:
    """One row: a name for ``--rows``, the table's label, and how to build its step."""

    name: str
    label: str
    grad: bool
    build: Callable[[], tuple[torch.nn.Module, Step]]


def _training_step(model: torch.nn.Module, forward: Callable[[], torch.Tensor]) -> Step:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> None:
        forward().square().mean().backward()  # MSE against zero
        optimizer.step()
        optimizer.zero_grad()

    return step


def _mlp(train: bool) -> tuple[torch.nn.Module, Step]:
    model, x = build_mlp(), torch.randn(1, 8)
    return model, (_training_step(model, lambda: model(x)) if train else lambda: model(x))


def _bert(train: bool, step: bool = True, tiny: bool = False) -> tuple[torch.nn.Module, Step]:
    # ``train``: train() mode, and with ``step`` a whole training step (else its forward);
    # ``tiny``: the same 79 module calls around products too small to matter (hidden 32, seq 8).
    from transformers import BertConfig, BertModel

    width = 32 if tiny else 256
    config = BertConfig(hidden_size=width, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=4 * width)
    model = BertModel(config).train(train)
    ids = torch.randint(0, config.vocab_size, (1, 8 if tiny else 128))
    if train and step:
        return model, _training_step(model, lambda: model(input_ids=ids).last_hidden_state)
    return model, lambda: model(input_ids=ids)


WORK = [
    Work("mlp-infer", "50×(Linear(8,8),ReLU) batch 1, inference (`no_grad`)", False,
         lambda: _mlp(train=False)),
    Work("mlp-grad", "same, forward with autograd on", True, lambda: _mlp(train=False)),
    Work("mlp-train", "same, **full training step** (forward, backward, SGD)", True,
         lambda: _mlp(train=True)),
    Work("bert-infer", "transformers BERT (hidden 256, 4 layers, seq 128), inference", False,
         lambda: _bert(train=False)),
    Work("bert-grad", "same BERT, forward with autograd on (`train()` mode)", True,
         lambda: _bert(train=True, step=False)),
    Work("bert-train", "same BERT, **training step** (forward, backward, SGD)", True,
         lambda: _bert(train=True)),
    # (not in the default rows: what the wrapper costs per call where the products cost
    # nothing, counted under callgrind in minutes where the full BERT takes half an hour)
    Work("tiny-bert-infer", "transformers BERT (hidden 32, 4 layers, seq 8), inference", False,
         lambda: _bert(train=False, tiny=True)),
]


#: ``--clock`` choices. Process CPU time leaves out the time the process waits for a core
#: (the box is shared); every variant runs in the calling thread, so nothing else differs.
CLOCKS: dict[str, Callable[[], int]] = {"cpu": time.process_time_ns, "wall": time.perf_counter_ns}


@dataclass
class Row:
    """A row's results: the plain step, each variant's differences to it (ns per step, one a
    round), and why a variant has no number."""

    work: Work
    failed: dict[str, str]
    calls: int = 0
    steps: int = 0
    plain_ns: float = 0.0
    diffs: dict[str, list[float]] = field(default_factory=dict)
    #: what a variant's warm-up steps added to the plain ones (ns for them all), one a round
    warmups: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0

    def added_ns(self, name: str) -> float | None:
        """Median ns a variant adds per module call, or ``None`` where it has no number."""
        if name not in self.diffs:
            return None
        return statistics.median(self.diffs[name]) / self.calls

    def added_pct(self, name: str) -> tuple[float, float] | None:
        """Median % a variant adds to the plain step and half the interquartile range of the
        rounds' % (the noise), or ``None`` where it has no number."""
        if name not in self.diffs:
            return None
        low, middle, high = statistics.quantiles(self.diffs[name], n=4)
        return 100 * middle / self.plain_ns, 50 * (high - low) / self.plain_ns


def _time_steps(step: Step, steps: int, clock: Callable[[], int]) -> float:
    """ns per step over ``steps`` back-to-back steps, the collector off."""
    gc.collect()
    gc.disable()
    try:
        start = clock()
        for _ in range(steps):
            step()
        return (clock() - start) / steps
    finally:
        gc.enable()


def failure_reason(error: BaseException) -> str:
    """A variant's error as a table note: its type and first line."""
    return f"{type(error).__name__}: {error}".splitlines()[0]


def measure(work: Work, rounds: int, sample_ns: float, clock: Callable[[], int],
            missing: dict[str, str], warmup: int = 2,
            variants: dict[str, Variant] | None = None) -> Row:
    """Build the row's model once and time every variant, interleaved round by round.

    Each variant's sample is paired with a plain sample taken just before it; its cost is the
    median over rounds of the difference. Adjacent pairs cancel the machine's changing speed
    (other processes share its cores and caches), which separate medians would not.
    ``variants``: what to time (default :data:`VARIANTS`), with its ``"plain"``."""
    variants = VARIANTS if variants is None else variants
    columns = [name for name in variants if name != "plain"]
    began = time.perf_counter()
    row = Row(work, failed=dict(missing))
    try:
        model, step = work.build()
    except ImportError as error:
        row.failed = {name: failure_reason(error) for name in columns}
        return row
    # Each sample starts with a collection; with torch, transformers and DeepSpeed imported a
    # full one takes ~0.5 s, so what exists now is moved out of the collector's sight.
    gc.collect()
    gc.freeze()

    def sample(name: str) -> tuple[float, float]:
        # ns of the warm-up steps together (what a variant builds at first calls, the CPU's
        # caches refilled), and per step of the timed ones after them
        with variants[name](model):
            warm = _time_steps(step, warmup, clock) * warmup
            return warm, _time_steps(step, row.steps, clock)

    peers = [name for name in columns if name not in missing]
    plain: list[float] = []
    with torch.set_grad_enabled(work.grad):
        row.calls = module_calls(model, step)
        for _ in range(3):
            step()
        row.steps = max(1, round(sample_ns / _time_steps(step, 2, clock)))
        for index in range(rounds):
            shift = index % len(peers)
            for name in peers[shift:] + peers[:shift]:
                if name in row.failed:
                    continue
                try:
                    (base_warm, base), (warm, timed) = sample("plain"), sample(name)
                except Exception as error:  # a peer that cannot run this model: a blank cell
                    row.failed[name] = failure_reason(error)
                    row.diffs.pop(name, None)
                    row.warmups.pop(name, None)
                    continue
                plain.append(base)
                row.diffs.setdefault(name, []).append(timed - base)
                row.warmups.setdefault(name, []).append(warm - base_warm)
    row.plain_ns = statistics.median(plain) if plain else 0.0
    row.seconds = time.perf_counter() - began
    return row


def _table(rows: list[Row], cell: Callable[[Row, str], str]) -> list[str]:
    lines = ["| work | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in rows:
        lines.append(f"| {row.work.label} | " + " | ".join(cell(row, c) for c in COLUMNS) + " |")
    return lines


def _ns_cell(row: Row, name: str) -> str:
    ns = row.added_ns(name)
    return "–" if ns is None else f"~{ns:,.0f}"


def _pct_cell(row: Row, name: str) -> str:
    pct = row.added_pct(name)
    return "–" if pct is None else f"{pct[0]:+.1f}% ±{pct[1]:.1f}"


def _warmup_cell(row: Row, name: str) -> str:
    warm = row.warmups.get(name)
    return "–" if not warm else f"{statistics.median(warm) / 1e6:+.2f}"


def _ratio(row: Row, name: str, ours_name: str = "tracetorch") -> str:
    # The cost ours_name adds over the one name adds, both medians over rounds.
    ours, theirs = row.added_pct(ours_name), row.added_pct(name)
    if ours is None or theirs is None:
        return "–"
    if theirs[0] <= theirs[1]:  # a cost within the noise divides into nonsense
        return "– (its cost is within the noise)"
    return f"{ours[0] / theirs[0]:.2f}x"


def report(rows: list[Row]) -> None:
    """Print the issue's table, the blank cells' reasons, the % table and the ratios."""
    print("ns added per module call (median over rounds of the variant's sample minus the plain "
          "one before it, / module calls per step):")
    print()
    print("\n".join(_table(rows, _ns_cell)))
    reasons = {(name, why): [r.work.name for r in rows if r.failed.get(name) == why]
               for r in rows for name, why in r.failed.items()}
    for (name, why), names in reasons.items():
        print(f"- {name} blank in {', '.join(names)}: {why}")
    print()
    print("% added to the plain step time (median ± half the interquartile range of the rounds):")
    print()
    print("\n".join(_table(rows, _pct_cell)))
    print()
    print("ms added by a sample's warm-up steps, all of them (median over rounds; untimed "
          "above):")
    print()
    print("\n".join(_table(rows, _warmup_cell)))
    print()
    for row in rows:
        if not row.diffs:
            continue
        pct = row.added_pct("tracetorch")
        goal = ""
        if row.work.name == "bert-train" and pct is not None:
            verdict = "met" if pct[0] <= BERT_GOAL_PCT else "NOT met"
            goal = f" (goal <= {BERT_GOAL_PCT:.0f}%: {verdict})"
        print(f"{row.work.name}: plain step {row.plain_ns / 1e6:.3f} ms, {row.calls} module "
              f"calls, {row.steps} steps/sample, {row.seconds:.0f} s; tracetorch adds "
              f"{_pct_cell(row, 'tracetorch')} to the step{goal}, "
              f"{_ratio(row, 'forward hooks')} what forward hooks add, "
              f"{_ratio(row, 'torch.profiler')} what torch.profiler adds, "
              f"{_ratio(row, 'torch.profiler shapes+FLOPs+modules')} what torch.profiler with "
              f"shapes, FLOPs and modules adds; backward_every=8 "
              f"{_ratio(row, 'torch.profiler', 'tracetorch backward_every=8')} torch.profiler's; "
              f"the plain step again {_pct_cell(row, PLAIN_AGAIN)} (the method's null)")


def select_work(tokens: str) -> list[Work]:
    """The rows ``--rows`` names: comma-separated names or prefixes of :data:`WORK`."""
    wanted = [token.strip() for token in tokens.split(",") if token.strip()]
    chosen = [work for work in WORK if any(work.name.startswith(t) for t in wanted)]
    if not chosen:
        raise SystemExit(f"--rows {tokens!r} matches none of {', '.join(w.name for w in WORK)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--sample-ms", type=float, default=50.0,
                        help="plain time of one sample of back-to-back steps (default 50)")
    parser.add_argument("--rows", default="mlp,bert",
                        help="comma-separated row names or prefixes (default: all)")
    parser.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                        help="process CPU time (default) or wall time")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps before each sample (default 2: tracetorch learns a "
                             "layer's operation counts from its first two calls)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: 2 rounds of ~2 ms samples")
    parser.add_argument("--columns", default=",".join(COLUMNS),
                        help="comma-separated variants to time (default: all); fewer columns "
                             "make rounds shorter, so more of them fit the same time")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.columns.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in COLUMNS]
    if unknown or not chosen:
        parser.error(f"--columns: {', '.join(unknown) or 'none given'}; choose from "
                     f"{', '.join(COLUMNS)}")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the noise is a spread over rounds)")
    if args.warmup < 1:
        parser.error("--warmup must be at least 1 (a variant's first step builds its caches)")
    if args.quick:
        args.rounds, args.sample_ms = 2, 2.0
    torch.set_num_threads(1)
    missing = {name: "not timed (--columns)" for name in COLUMNS if name not in chosen}
    try:
        import_deepspeed()  # before any timing, so that every round runs with it imported
    except ImportError as error:
        missing.setdefault("DeepSpeed profiler", failure_reason(error))
    print(f"torch {torch.__version__}, 1 thread, batch 1, {args.clock} clock, medians of "
          f"{args.rounds} interleaved rounds, samples of ~{args.sample_ms:g} ms plain after "
          f"{args.warmup} warm-up steps")
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # missing FLOP rules, backward hooks on dict outputs
        for work in select_work(args.rows):
            rows.append(measure(work, args.rounds, args.sample_ms * 1e6, CLOCKS[args.clock],
                                missing, args.warmup))
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
