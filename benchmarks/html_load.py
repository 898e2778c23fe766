"""How fast the HTML report opens in a real browser, for a big tree; and the README screenshot.

A synthetic profile of ``--nodes`` call paths (default 10,000: a model of 10-way nested blocks
with three calls each, FLOPs, MACs, backward and memory figures on every node) is written with
``save_html`` and opened ``--runs`` times in headless Chromium (/usr/bin/chromium, driven by
playwright), each time in a fresh browser context, so nothing is cached. The time is read from
the page's own performance marks, from navigation start: ``tt-table-icicle`` (the table and the
icicle are built and drawn) and ``tt-ready`` (the whole page, roofline and metadata included).
A 10-node profile is opened the same way as the baseline: what any page costs to parse and lay
out, whatever its size. Printed: file sizes, the median of each mark, and the big page's ratio to
the baseline. Goal: the 10,000-node page ready in under 1,000 ms.

``--screenshot PATH`` instead writes a PNG of the report of a real profile (the ``tracetorch
demo`` CNN's training steps): the picture in the README, regenerated with
``python benchmarks/html_load.py --screenshot docs/report.png``.

Run: ``python benchmarks/html_load.py [--nodes 10000] [--runs 5] [--quick]``
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from tracetorch.cli.demo import run_demo
from tracetorch.records.result import ProfileResult
from tracetorch.records.tree import CallNode

CHROMIUM = "/usr/bin/chromium"
#: No network, no first-run work, no GPU: the browser only opens the local file.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
MARKS = ("tt-table-icicle", "tt-ready")


def synthetic(nodes: int, fanout: int = 10, calls: int = 3, seed: int = 0) -> ProfileResult:
    """A profile of exactly ``nodes`` call paths, filled breadth first, ``fanout`` children each.

    Leaves get random times, FLOPs and bytes; a parent's time is its children's plus a little of
    its own, as a real layer's is.
    """
    rng = random.Random(seed)
    root = CallNode.root()
    model = root.child("", "Model", "m0")
    made, queue, order = 1, deque([model]), [model]
    while made < nodes:
        parent = queue.popleft()
        for i in range(fanout):
            if made == nodes:
                break
            kind = ("Linear", "GELU", "LayerNorm", "Attention", "Block")[rng.randrange(5)]
            child = parent.child(str(i), kind, f"m{made}")
            made += 1
            queue.append(child)
            order.append(child)
    own_ns: dict[int, int] = {}
    for node in reversed(order):
        below = sum(own_ns[id(c)] for c in node.children.values())
        per_call = below // calls + rng.randrange(2_000, 60_000)
        own_ns[id(node)] = per_call * calls
        for _ in range(calls):
            node.time.add(per_call)
            node.backward_time.add(per_call * 2)
        if not node.children:
            node.flops = node.gemm_flops = rng.randrange(1, 10**9) * 2
            node.macs = node.flops // 2
            node.backward_flops = node.flops * 2
            node.flops_source = "rule"
            node.memory.input_bytes = rng.randrange(10**3, 10**8)
            node.memory.output_bytes = rng.randrange(10**3, 10**8)
            node.memory.param_bytes = rng.randrange(0, 10**7)
    return ProfileResult(root, meta={"name": f"synthetic {nodes:,}-node tree"})


def open_times(browser: Any, path: Path, runs: int) -> dict[str, list[float]]:
    """ms from navigation start to each of :data:`MARKS`, one fresh context per run."""
    times: dict[str, list[float]] = {mark: [] for mark in MARKS}
    for _ in range(runs):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_selector("html[data-tt-ready]", timeout=60_000)
        if errors:
            raise RuntimeError(f"{path.name}: {errors[0]}")
        for mark in MARKS:
            times[mark].append(page.evaluate(
                f"performance.getEntriesByName({mark!r})[0].startTime"))
        context.close()
    return times


def launch(pw: Any) -> Any:
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def benchmark(nodes: int, runs: int) -> None:
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as pw:
        browser = launch(pw)
        pages = {}
        for label, count in (("baseline", 10), ("big", nodes)):
            path = Path(folder) / f"{label}.html"
            synthetic(count).save_html(path)
            pages[label] = (count, path.stat().st_size, open_times(browser, path, runs))
        browser.close()
    print(f"HTML report load in headless Chromium, median of {runs} runs (ms from navigation "
          "start)")
    print("| tree | file size | table + icicle drawn | page ready |")
    print("|---|---|---|---|")
    medians = {}
    for label, (count, size, times) in pages.items():
        medians[label] = {mark: statistics.median(values) for mark, values in times.items()}
        print(f"| {count:,} nodes | {size / 1e6:.2f} MB | "
              f"{medians[label]['tt-table-icicle']:.0f} ms | {medians[label]['tt-ready']:.0f} ms |")
    ratio = medians["big"]["tt-ready"] / max(medians["baseline"]["tt-ready"], 1e-9)
    verdict = "met" if medians["big"]["tt-ready"] < 1000 else "NOT met"
    print(f"{nodes:,} nodes: ready in {medians['big']['tt-ready']:.0f} ms, {ratio:.1f}x the "
          f"10-node page; goal < 1000 ms {verdict}")


def screenshot(path: Path) -> None:
    """The README's picture: the demo CNN's report, first screen, at a laptop's width."""
    result = run_demo(steps=6).profile
    result.meta.setdefault("name", "tracetorch demo (CNN training)")
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as pw:
        page_path = Path(folder) / "report.html"
        result.save_html(page_path)
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 1600, "height": 1000}, device_scale_factor=1)
        page.goto(page_path.as_uri())
        page.wait_for_selector("html[data-tt-ready]")
        # The whole page in the viewport (a full-page capture resizes it, which ends the hover).
        page.set_viewport_size({"width": 1600, "height": page.evaluate(
            "document.documentElement.scrollHeight")})
        page.screenshot(path=str(path))
        browser.close()
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} KB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000, help="call paths in the big tree")
    parser.add_argument("--runs", type=int, default=5, help="page loads per tree (median)")
    parser.add_argument("--quick", action="store_true", help="2,000 nodes, 2 runs (smoke test)")
    parser.add_argument("--screenshot", type=Path, metavar="PNG",
                        help="write the README screenshot instead of timing")
    args = parser.parse_args(argv)
    if args.screenshot is not None:
        screenshot(args.screenshot)
        return 0
    if args.quick:
        args.nodes, args.runs = 2_000, 2
    benchmark(args.nodes, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
