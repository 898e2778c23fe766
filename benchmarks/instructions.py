"""Machine instructions each way of timing torch modules adds per module call: a count, not a time.

``peers.py`` times steps, and on a shared machine its cells move by ±20% between runs (the BERT
rows by more), which hides changes of a few percent. This script runs the same rows and the same
variants (``peers.WORK``, ``peers.VARIANTS``) under Valgrind's callgrind and counts the
instructions executed inside the measured steps only: the count does not depend on what else
the machine runs (the plain step is counted twice, first and last: the two differ by under 0.1%,
printed under the table), so one run compares two versions of the code. An instruction count
is not a time — a cache miss or an allocation costs more than an add — so the time goals stay
with ``peers.py``; this is where a change's own cost is seen.

Each row runs in one child process under callgrind (``--toggle-collect`` and ``--dump-after``
on ``functools.reduce``, which runs a variant's steps: one dump per variant, nothing of
start-up, building the model, entering or leaving a variant counted). Rows run in parallel, one
per core. The table: instructions added per module call over the plain step, and tracetorch's as
a ratio of forward hooks'.

A column not counted (``--columns``) or whose variant cannot run is ``–``.

With ``--cache-sim``, Valgrind also simulates the caches (first level 32 KiB each for code and
data, the last level 1 MiB: one core's L2 on these machines) and a second table gives the misses
each variant adds per module call: first-level code + data / last-level code + data. On a row
whose products are large (BERT) they are what a call costs: the products between two calls
evict the caches, so every cache line a call touches is a miss, however few its instructions.
``--breakdown N`` (with the cache simulation) then says where each variant's misses are, per
module call over the plain step: by shared object (CPython's library, torch's, tracetorch's C
wrapper, the C library) and in the N functions that add the most (each function's own code,
read from the dumps). Read the first-level misses on a row whose products are
small (tiny-bert-infer): there they stand for the lines a call touches, each of which the large
products of the real row evict (a code line of CPython's that the wrapper's own code pushes out
of the cache counts to CPython's function, which runs as often as without it).

Run: ``python benchmarks/instructions.py [--rows mlp] [--steps 20] [--columns tracetorch,...]
[--cache-sim] [--breakdown 25]``
(needs ``valgrind``; an mlp row with every column takes about five minutes, most of it
importing torch under Valgrind; the BERT inference row with
``--columns "bare wrapt,forward hooks,tracetorch,tracetorch ops=False" --steps 3`` about 17).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import functools
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
from peers import COLUMNS, PLAIN_AGAIN, VARIANTS, Work, failure_reason, select_work
from torch_peers import import_deepspeed, module_calls

#: The C function whose calls callgrind counts, and after each of which it writes a dump.
MEASURED = "functools_reduce"
_TOTALS = re.compile(r"^totals:\s*([\d ]+)$", re.MULTILINE)
_EVENTS = re.compile(r"^events:\s*(.+)$", re.MULTILINE)
#: Valgrind's cache simulation for ``--cache-sim``: each first-level cache (code, data) and the
#: last level, in KiB (one core's L1 and L2 on these machines; 8 and 16 ways, 64-byte lines),
#: and the misses it counts, by the events' names in a dump: first-level code and data reads,
#: last level the same.
FIRST_LEVEL_KIB, LAST_LEVEL_KIB = 32, 1024
CACHE_SIM = ["--cache-sim=yes", f"--I1={FIRST_LEVEL_KIB * 1024},8,64",
             f"--D1={FIRST_LEVEL_KIB * 1024},8,64", f"--LL={LAST_LEVEL_KIB * 1024},16,64"]
MISSES = ("I1mr", "D1mr", "ILmr", "DLmr")
#: What ``--breakdown`` reads of each function: its instructions, then its misses.
BREAKDOWN_EVENTS = ("Ir", *MISSES)


#: Steps each variant runs before its counted ones: its caches fill on the first, and Python 3.11
#: specializes a function's code only after it has run 8 times, so code that runs once per step
#: (a profile's step fold, a peer's per-step bookkeeping) is specialized before counting starts.
WARMUP_STEPS = 9


def run_child(work: Work, steps: int, columns: list[str]) -> dict[str, Any]:
    """Inside callgrind: plain and each variant of ``columns`` run ``steps`` steps in one
    ``functools.reduce`` call. Returns the module calls per step, per variant ``"ran"`` or why
    not, and the variants whose steps began (each wrote one dump, in this order)."""
    missing: dict[str, str] = {}
    try:
        import_deepspeed()
    except ImportError as error:
        missing["DeepSpeed profiler"] = failure_reason(error)
    outcome: dict[str, str] = {}
    dumped: list[str] = []  # the variants whose steps began: each left one dump, in order
    calls = 0
    # A variant's count depends on what ran before it in the process: the same tracetorch
    # training step counted 37,708 instructions per call after bare wrapt and forward hooks,
    # 52,749 after those, full backward hooks and torch.profiler (the plain step counted again
    # after every peer grows by 0.5-1.5%), with a model of its own or not. tracetorch's
    # variants, which this script follows from version to version, run first, right after the
    # plain step; the peers after them, in the table's order.
    ours = [name for name in columns if name.startswith("tracetorch")]
    # The plain step is counted once more after every variant (asked for or not): how far two
    # counts of the same work differ, the count's own noise.
    others = (name for name in columns if name not in ours and name != PLAIN_AGAIN)
    order = ["plain", *ours, *others, PLAIN_AGAIN]
    with torch.set_grad_enabled(work.grad):
        for name in order:
            if name in missing:
                outcome[name] = missing[name]
                continue
            model, step = work.build()  # (a model of its own: nothing left on it by another)
            calls = calls or module_calls(model, step)
            try:
                with VARIANTS[name](model):
                    for _ in range(WARMUP_STEPS):
                        step()
                    dumped.append(name)
                    # The collector off, as peers.py times steps: a collection landing in one
                    # variant's counted steps and not another's (it follows allocation counts
                    # since start-up) moved a row by thousands of instructions per call.
                    run_counted(step, steps, collector_off=True)
                outcome[name] = "ran"
            except Exception as error:  # a peer that cannot run this model: a blank cell
                outcome[name] = failure_reason(error)
    return {"calls": calls, "outcome": outcome, "dumped": dumped}


def run_counted(run: Callable[[], object], times: int, collector_off: bool) -> None:
    """Run ``run`` ``times`` times inside one call of the function callgrind counts and dumps
    after (:data:`MEASURED`), with the garbage collector off if asked (collected first)."""
    if collector_off:
        gc.collect()
        gc.disable()
    try:
        functools.reduce(lambda _, __: run(), range(times), None)
    finally:
        gc.enable()


def count_row(work: Work, steps: int, columns: list[str], valgrind: str,
              cache_sim: bool = False, breakdown: bool = False) -> dict[str, Any]:
    """Run ``work``'s child under callgrind; the instructions of each variant's steps (and
    with ``cache_sim``, their cache misses: ``MISSES``; with ``breakdown``, also every
    function's counts: ``functions``)."""
    result, events = run_under_callgrind(
        valgrind, ["--child", work.name, "--steps", str(steps), "--columns", ",".join(columns)],
        __file__, CACHE_SIM if cache_sim or breakdown else [],
        read=(lambda dump: callgrind_events(dump) | {"functions": callgrind_functions(dump)})
        if breakdown else callgrind_events)
    dumped = result["dumped"]
    if len(events) != len(dumped):
        # A step that calls functools.reduce itself would toggle counting off inside it.
        raise RuntimeError(f"{work.name}: {len(events)} dumps for {len(dumped)} variants "
                           f"(does the step call functools.reduce?)")
    ran = [(name, counted) for name, counted in zip(dumped, events)
           if result["outcome"][name] == "ran"]
    result["instructions"] = {name: counted["Ir"] for name, counted in ran}
    if cache_sim or breakdown:
        result["misses"] = {name: [counted[event] for event in MISSES] for name, counted in ran}
    if breakdown:
        result["functions"] = {name: counted["functions"] for name, counted in ran}
    return result


def run_under_callgrind(valgrind: str, arguments: list[str], script: str,
                        options: list[str] | None = None,
                        read: Callable[[Path], Any] | None = None) -> tuple[Any, list[Any]]:
    """Run ``python script *arguments`` under callgrind (with Valgrind's ``options``), counting
    only inside ``functools.reduce`` calls (one dump after each): what the child printed last
    (one JSON line) and what ``read`` makes of each dump, in order (by default its events:
    :func:`callgrind_events`, ``Ir`` the instructions).

    Raises:
        RuntimeError: the child failed.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "callgrind.out"
        command = [valgrind, "--tool=callgrind", *(options or []),
                   f"--toggle-collect={MEASURED}", f"--dump-after={MEASURED}",
                   f"--callgrind-out-file={out}", sys.executable, script, *arguments]
        env = dict(os.environ, PYTHONHASHSEED="0")  # the same dict layouts in every run
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              cwd=Path(script).parent)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(script).name} {' '.join(arguments)}: the child failed:\n"
                               f"{done.stderr[-2000:]}")
        dumps = sorted(Path(folder).glob("callgrind.out.*"),
                       key=lambda path: int(path.suffix[1:]))
        return (json.loads(done.stdout.strip().splitlines()[-1]),
                [(read or callgrind_events)(path) for path in dumps])


def callgrind_events(dump: Path) -> dict[str, int]:
    """What a callgrind dump counted in all, by event (its ``events`` and ``totals`` lines:
    ``Ir``, the instructions, and with the cache simulation its misses)."""
    text = dump.read_text()
    names, totals = _EVENTS.search(text), _TOTALS.search(text)
    if names is None or totals is None:
        raise RuntimeError(f"{dump}: no events or totals line (not a callgrind dump?)")
    return dict(zip(names.group(1).split(), map(int, totals.group(1).split())))


def callgrind_functions(dump: Path) -> dict[tuple[str, str], list[int]]:
    """Every function's own counts in a dump (not those of the functions it calls), by
    ``(shared object, function)``: its instructions and its misses, :data:`BREAKDOWN_EVENTS`.

    Read from callgrind's format itself: names are given once with a number, ``(12) name``, and
    after that by ``(12)`` alone (a callee's, ``cob=``/``cfn=``, too); a cost line after
    ``calls=`` is the callee's inclusive cost, not the function's own; code inlined from another
    file (``fi=``/``fe=``: files are not read) stays its function's. A recursive function's
    levels (``fn'2``) are one function."""
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    kinds = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn"}
    shared_object, function, skip_next = "?", "?", False
    functions: dict[tuple[str, str], list[int]] = {}
    positions = 1  # a cost line's first columns: where it is (``positions: line``, the default)
    wanted: list[int] = []  # where each of BREAKDOWN_EVENTS is on a cost line
    with dump.open() as lines:
        for line in lines:
            if skip_next:
                skip_next = False
                continue
            if line.startswith("positions:"):
                positions = len(line.split()) - 1
                continue
            if line.startswith("events:"):
                events = line.split()[1:]
                wanted = [positions + events.index(event) for event in BREAKDOWN_EVENTS]
                continue
            head, equals, rest = line.partition("=")
            if equals and head in kinds:
                name = _compressed_name(names[kinds[head]], rest.strip())
                if head == "ob":
                    shared_object = Path(name).name
                elif head == "fn":
                    function = re.sub(r"'\d+$", "", name)
                continue
            if head == "calls":
                skip_next = True
                continue
            if not (line[:1].isdigit() or line[:1] in ("+", "-", "*")):
                continue
            values = line.split()  # (a line leaves out the zeros at its end)
            total = functions.setdefault((shared_object, function), [0] * len(wanted))
            for index, at in enumerate(wanted):
                if at < len(values):
                    total[index] += int(values[at])
    return functions


def _compressed_name(known: dict[str, str], text: str) -> str:
    """A name of callgrind's compressed form: ``(id) name`` defines ``id``, ``(id)`` uses it."""
    if not text.startswith("("):
        return text
    number, _, name = text.partition(")")
    name = name.strip()
    if name:
        known[number] = name
    return known.get(number, name or "?")


def print_header() -> None:
    """A table's header: the work, then every column."""
    print("| work | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))


def report(rows: list[tuple[Work, dict[str, Any]]], steps: int) -> None:
    """The table of instructions added per module call, then each row's plain step."""
    print("instructions added per module call (over the plain step, "
          f"{steps} steps per variant):\n")
    print_header()
    notes: list[str] = []
    for work, result in rows:
        calls, counts = int(result["calls"]), result["instructions"]
        plain = counts["plain"]
        added = {name: (counts[name] - plain) / (steps * calls) for name in counts}
        cells = [f"~{added[name]:,.0f}" if name in added else "–" for name in COLUMNS]
        print(f"| {work.label} | " + " | ".join(cells) + " |")
        for name, state in result["outcome"].items():
            if state != "ran":
                notes.append(f"- {name} blank in {work.name}: {state}")
        summary = f"{work.name}: plain step {plain / steps:,.0f} instructions, {calls} module calls"
        if PLAIN_AGAIN in counts:
            summary += f" (counted again: {100 * (counts[PLAIN_AGAIN] - plain) / plain:+.3f}%)"
        for ours, theirs in (("tracetorch", "forward hooks"), ("tracetorch", "torch.profiler"),
                             ("tracetorch", "torch.profiler shapes+FLOPs+modules"),
                             ("tracetorch backward_every=8", "torch.profiler")):
            if ours in added and added.get(theirs, 0.0) > 0:
                summary += f", {ours} {added[ours] / added[theirs]:.2f}x {theirs}"
        for name in ("tracetorch", "tracetorch ops=False", "forward hooks"):
            if name in added:
                summary += f"; {name} +{100 * (counts[name] - plain) / plain:.2f}% of the step"
        notes.append(summary)
    print("\n".join(notes))
    if any("misses" in result for _, result in rows):
        report_misses(rows, steps)


def report_breakdown(rows: list[tuple[Work, dict[str, Any]]], steps: int, top: int) -> None:
    """Per row and variant, what it adds per module call over the plain step: by shared object,
    then in the ``top`` functions adding the most first-level misses (``--breakdown``)."""
    heading = "instructions | first-level misses, code + data | last-level misses, code + data"
    for work, result in rows:
        per_call = 1 / (steps * int(result["calls"]))
        plain = result["functions"]["plain"]
        none = [0] * len(BREAKDOWN_EVENTS)
        for name, functions in result["functions"].items():
            if name in ("plain", PLAIN_AGAIN):
                continue
            added = {key: [(count - base) * per_call for count, base in
                           zip(functions.get(key, none), plain.get(key, none))]
                     for key in functions.keys() | plain.keys()}
            by_object: dict[str, list[float]] = {}
            for (shared_object, _), counts in added.items():
                by_object[shared_object] = [a + b for a, b in zip(
                    by_object.get(shared_object, [0.0] * len(counts)), counts)]
            print(f"\nwhere {name} adds, {work.name}, per module call over the plain step:\n")
            print(f"| shared object | {heading} |\n|---|---|---|---|")
            for shared_object, counts in sorted(by_object.items(), key=_first_level_misses):
                if any(round(count, 1) for count in counts):  # (not the many it leaves alike)
                    print(f"| {shared_object} | {_breakdown_cells(counts)} |")
            print(f"\nthe {top} functions adding the most first-level misses (their own code):\n")
            print(f"| function | shared object | {heading} |\n|---|---|---|---|---|")
            for (shared_object, function), counts in sorted(
                    added.items(), key=_first_level_misses)[:top]:
                print(f"| {function} | {shared_object} | {_breakdown_cells(counts)} |")


def _first_level_misses(item: tuple[Any, list[float]]) -> float:
    """Sort key: the most first-level misses (code and data) added first."""
    return -(item[1][1] + item[1][2])


def _breakdown_cells(counts: list[float]) -> str:
    instructions, i1, d1, il, dl = counts
    return f"{instructions:,.0f} | {i1:,.1f} + {d1:,.1f} | {il:,.1f} + {dl:,.1f}"


def report_misses(rows: list[tuple[Work, dict[str, Any]]], steps: int) -> None:
    """The table of cache misses added per module call (``--cache-sim``)."""
    print("\ncache misses added per module call (first-level code + data / last-level code + "
          f"data; {FIRST_LEVEL_KIB} KiB and {LAST_LEVEL_KIB} KiB caches):\n")
    print_header()
    for work, result in rows:
        calls, misses = int(result["calls"]), result["misses"]
        plain = misses["plain"]
        cells = []
        for name in COLUMNS:
            if name not in misses:
                cells.append("–")
                continue
            i1, d1, il, dl = ((count - base) / (steps * calls)
                              for count, base in zip(misses[name], plain))
            cells.append(f"{i1:,.0f}+{d1:,.0f} / {il:,.0f}+{dl:,.0f}")
        print(f"| {work.label} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="mlp",
                        help="comma-separated row names or prefixes of peers.py (default: mlp)")
    parser.add_argument("--steps", type=int, default=20,
                        help="steps counted per variant (default 20)")
    parser.add_argument("--columns", default=",".join(COLUMNS),
                        help="comma-separated variants to count (default: all of peers.py's; "
                             "torch.profiler and full backward hooks are the slow ones under "
                             "Valgrind)")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also simulate the caches and print the misses added per call "
                             "(slower)")
    parser.add_argument("--breakdown", type=int, default=0, metavar="N",
                        help="with the cache simulation, where each variant's misses are: by "
                             "shared object and in the N functions adding the most")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.breakdown < 0:
        parser.error("--breakdown takes a number of functions, 0 or more")
    columns = [name.strip() for name in args.columns.split(",") if name.strip()]
    unknown = [name for name in columns if name not in COLUMNS]
    if unknown or not columns:
        parser.error(f"--columns takes names among {', '.join(COLUMNS)}; got {args.columns!r}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # missing FLOP rules, backward hooks on dict outputs
    if args.child:
        (work,) = select_work(args.child)
        print(json.dumps(run_child(work, args.steps, columns)))
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("instructions.py needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    works = select_work(args.rows)
    print(f"torch {torch.__version__}, 1 thread, batch 1, callgrind instruction counts")
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(
            lambda work: count_row(work, args.steps, columns, valgrind, args.cache_sim,
                                   breakdown=args.breakdown > 0), works))
    report(list(zip(works, results)), args.steps)
    if args.breakdown:
        report_breakdown(list(zip(works, results)), args.steps, args.breakdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
