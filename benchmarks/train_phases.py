"""Where tracetorch's cost in a training step goes, phase by phase.

The training step of ``peers.py``'s ``mlp-train`` row (50 x (Linear(8, 8), ReLU), batch
1, one thread, SGD) is run as six timed phases — forward, loss, backward, optimizer step,
``zero_grad`` and the step's end, ``prof.step()`` (nothing in the plain run) — plain, under
``tracetorch.profile(model)``, ``profile(model, ops=False)`` and ``profile(model,
backward_every=8)``, interleaved round by round; each cell is the median over rounds of (a
phase's median over the round's steps - the plain one), per module call (101 per step). With
``backward_every=8`` the median step is one whose backward work is not attributed.

``--model bert`` runs ``peers.py``'s BERT (hidden 256, 4 layers, seq 128) instead, in
``train()`` mode (79 module calls per step).

Then, on a model of its own, the calls that reach tracetorch's function mode in each of five
profiled steps: every layer's operations in the first two, after that only what is not learned.

Run: ``python benchmarks/train_phases.py [--rounds 15] [--steps 10] [--model mlp|bert]``
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch_peers import build_mlp, module_calls

import tracetorch
from tracetorch.adapters.torch.ops import OpCountingMode

PHASES = ("forward", "loss", "backward", "step", "zero_grad", "prof.step")
_clock = time.process_time_ns


def _nothing() -> None:
    """The plain run's step mark."""


def _mlp() -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    model, x = build_mlp(), torch.randn(1, 8)
    return model, lambda: model(x)


def _bert() -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    # peers.py's BERT (hidden 256, 4 layers, seq 128, random weights), in train() mode
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024)
    model = BertModel(config).train()
    ids = torch.randint(0, config.vocab_size, (1, 128))
    return model, lambda: model(input_ids=ids).last_hidden_state


#: ``--model`` choices: the model and its forward.
MODELS = {"mlp": ("50 x (Linear(8,8), ReLU)", _mlp),
          "bert": ("transformers BERT (hidden 256, 4 layers, seq 128)", _bert)}


def phase_costs(rounds: int, steps: int, model_name: str = "mlp") -> dict[str, dict[str, float]]:
    """ns added per module call in each phase, by variant (``tracetorch``, ``ops=False``,
    ``backward_every=8``), and the plain step's phases in µs."""
    model, forward = MODELS[model_name][1]()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    calls = module_calls(model, forward)
    samples: dict[str, list[int]] = {}

    def timed(phase: str, run: Callable[[], object]) -> object:
        start = _clock()
        out = run()
        samples.setdefault(phase, []).append(_clock() - start)
        return out

    def step(prof: object) -> None:
        y = timed("forward", forward)
        loss = timed("loss", lambda: y.square().mean())  # type: ignore[union-attr]
        timed("backward", loss.backward)  # type: ignore[union-attr]
        timed("step", optimizer.step)
        timed("zero_grad", optimizer.zero_grad)
        timed("prof.step", prof.step if isinstance(prof, tracetorch.profile) else _nothing)

    variants: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "plain": contextlib.nullcontext,
        "tracetorch": lambda: tracetorch.profile(model),
        "ops=False": lambda: tracetorch.profile(model, ops=False),
        "backward_every=8": lambda: tracetorch.profile(model, backward_every=8),
    }
    medians: dict[str, dict[str, list[float]]] = {name: {p: [] for p in PHASES}
                                                   for name in variants}
    for _ in range(rounds):
        for name, variant in variants.items():
            with variant() as prof:
                step(prof)  # untimed: first calls
                samples.clear()
                gc.collect()
                gc.disable()
                try:
                    for _ in range(steps):
                        step(prof)
                finally:
                    gc.enable()
            for phase in PHASES:
                medians[name][phase].append(statistics.median(samples[phase]))
    plain = {p: statistics.median(medians["plain"][p]) for p in PHASES}
    costs = {name: {p: (statistics.median(medians[name][p]) - plain[p]) / calls for p in PHASES}
             for name in variants if name != "plain"}
    costs["plain (µs per step)"] = {p: plain[p] / 1e3 for p in PHASES}
    return costs


def mode_operations(steps: int, model_name: str = "mlp") -> list[int]:
    """How many calls reach the profile's function mode in each of ``steps`` training steps
    (``tracetorch.profile(model)``): the first two count every layer's operations, later ones
    only what is not learned (see tracetorch.adapters.torch.learned)."""
    model, forward = MODELS[model_name][1]()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    reached = [0]
    original = OpCountingMode.__torch_function__

    def counted(mode: OpCountingMode, *args: Any, **kwargs: Any) -> Any:
        reached[0] += 1
        return original(mode, *args, **kwargs)

    per_step = []
    OpCountingMode.__torch_function__ = counted  # type: ignore[method-assign]
    try:
        with tracetorch.profile(model) as prof:
            for _ in range(steps):
                before = reached[0]
                forward().square().mean().backward()  # type: ignore[union-attr]
                optimizer.step()
                optimizer.zero_grad()
                prof.step()
                per_step.append(reached[0] - before)
    finally:
        OpCountingMode.__torch_function__ = original  # type: ignore[method-assign]
    return per_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp",
                        help="the mlp (default) or BERT (needs transformers)")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 3 steps (a smoke run)")
    args = parser.parse_args(argv)
    rounds, steps = (3, 3) if args.quick else (args.rounds, args.steps)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, {MODELS[args.model][0]} training step, "
          f"medians of {rounds} rounds x {steps} steps")
    print("ns added per module call, by phase:")
    costs = phase_costs(rounds, steps, args.model)
    print(f"  {'phase':<10}" + "".join(f"{name:>22}" for name in costs))
    for phase in PHASES:
        print(f"  {phase:<10}" + "".join(f"{costs[name][phase]:>22,.1f}" for name in costs))
    print("calls reaching tracetorch's function mode in steps 1-5:",
          mode_operations(5, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
