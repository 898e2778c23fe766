"""The text tree and flat views, on trees built by hand with round numbers."""
from __future__ import annotations

import re

import pytest

from support.trees import add_flops, encoder_tree
from tracetorch.records.result import ProfileResult
from tracetorch.records.stats import TimeStats
from tracetorch.records.tree import CallNode
from tracetorch.report.flat_table import render_flat
from tracetorch.report.table import node_label, render_table


def build(steps: list[int] | None = None, **extra: object) -> ProfileResult:
    """One forward pass of a 1 ms model:

    Sequential ""      1.0 ms  (self 0.1 ms)
      encoder          0.6 ms  (self 0.1 ms)
        0 Linear       0.4 ms  2000 FLOPs GEMM, 1000 MACs
        1 ReLU         0.1 ms   100 FLOPs
      head Linear      0.3 ms   600 FLOPs GEMM, 300 MACs
    """
    tree = root, model, encoder, fc, relu, head = encoder_tree()
    for node, ns in ((model, 1_000_000), (encoder, 600_000), (fc, 400_000), (relu, 100_000),
                     (head, 300_000)):
        node.time.add(ns)
    add_flops(tree)
    step_times = TimeStats()
    for ns in steps or []:
        step_times.add(ns)
    return ProfileResult(root, step_times=step_times, **extra)  # type: ignore[arg-type]


def rows(text: str) -> list[str]:
    """The table's body: lines between the dashed rule and the first blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line and set(line) <= {"-", " "}) + 1
    return lines[start:lines.index("", start)]


def cells(text: str) -> list[dict[str, str]]:
    """Each row as {header: cell}; columns are at least two spaces apart, cells never are."""
    header = re.split(r"\s{2,}", text.splitlines()[0].strip())
    return [dict(zip(header, re.split(r"\s{2,}", line.strip()))) for line in rows(text)]


def labels(text: str) -> list[str]:
    """Each row's name cell with its indentation."""
    return [line[: len(line) - len(line.lstrip())] + cell["Name"]
            for line, cell in zip(rows(text), cells(text))]


def row_of(text: str, name: str) -> dict[str, str]:
    matches = [c for c in cells(text) if next(iter(c.values())) == name]  # the first column
    assert len(matches) == 1, (name, text)
    return matches[0]


GOLDEN = """\
Name                 Calls        FLOPs        MACs  Self time  Total time  % time        FLOP/s
-------------------  -----  -----------  ----------  ---------  ----------  ------  ------------
Sequential               1  2.70 KFLOPs  1.30 KMACs     100 us     1.00 ms  100.0%  2.70 MFLOP/s
  encoder (Encoder)      1  2.10 KFLOPs  1.00 KMACs     100 us      600 us   60.0%  3.50 MFLOP/s
    0 (Linear)           1  2.00 KFLOPs  1.00 KMACs     400 us      400 us   40.0%  5.00 MFLOP/s
    1 (ReLU)             1    100 FLOPs           -     100 us      100 us   10.0%  1.00 MFLOP/s
  head (Linear)          1    600 FLOPs    300 MACs     300 us      300 us   30.0%  2.00 MFLOP/s

FLOPs, MACs, FLOP/s, Total time and the Bwd columns include children; Self time excludes them.
FLOP/s = FLOPs / Total time; % time = Total time / profile total.
Forward FLOPs: 2.70 KFLOPs (GEMM/conv 2.60 KFLOPs, other 100 FLOPs)
Total time:    1.00 ms in 1 top-level call"""


def test_golden_table() -> None:
    assert render_table(build()) == GOLDEN


def test_tree_order_indentation_and_model_type() -> None:
    text = render_table(build())
    assert labels(text) == ["Sequential", "  encoder (Encoder)", "    0 (Linear)",
                            "    1 (ReLU)", "  head (Linear)"]


def test_rows_are_inclusive_and_percentages_of_the_whole() -> None:
    text = render_table(build())
    encoder = row_of(text, "encoder (Encoder)")
    assert (encoder["FLOPs"], encoder["MACs"]) == ("2.10 KFLOPs", "1.00 KMACs")
    assert encoder["FLOP/s"] == "3.50 MFLOP/s"  # 2100 FLOPs in 600 us
    assert (encoder["Self time"], encoder["Total time"]) == ("100 us", "600 us")
    assert [c["% time"] for c in cells(text)] == ["100.0%", "60.0%", "40.0%", "10.0%", "30.0%"]
    assert row_of(text, "1 (ReLU)")["MACs"] == "-"  # no MACs for an activation
    assert "include children" in text


@pytest.mark.parametrize("sort_by, expected", [
    ("total", ["Sequential", "encoder", "0", "1", "head"]),
    ("self", ["Sequential", "head", "encoder", "0", "1"]),
    ("flops", ["Sequential", "encoder", "0", "1", "head"]),
    ("call_order", ["Sequential", "encoder", "0", "1", "head"]),
    ("name", ["Sequential", "encoder", "0", "1", "head"]),
])
def test_sort_by_orders_siblings_only(sort_by: str, expected: list[str]) -> None:
    names = [label.split()[0] for label in labels(render_table(build(), sort_by=sort_by))]
    assert names == expected


def test_sort_by_self_puts_the_heaviest_self_time_first() -> None:
    # head's self time (300 us) beats encoder's (100 us) though encoder's total is larger.
    names = [label.split()[0] for label in labels(render_table(build(), sort_by="self"))]
    assert names.index("head") < names.index("encoder")
    # Children stay under their parent whatever the key.
    assert names.index("encoder") < names.index("0") and names.index("encoder") < names.index("1")


def test_sort_by_name_is_natural_and_calls_largest_first() -> None:
    root = CallNode.root()
    for name, calls in (("10", 1), ("2", 3), ("1", 2)):
        node = root.child(name, "Linear", name)
        for _ in range(calls):
            node.time.add(10)
    result = ProfileResult(root)
    assert [lab.split()[0] for lab in labels(render_table(result, sort_by="name"))] == \
        ["1", "2", "10"]
    assert [lab.split()[0] for lab in labels(render_table(result, sort_by="calls"))] == \
        ["2", "1", "10"]
    assert [lab.split()[0] for lab in labels(render_table(result, sort_by="call_order"))] == \
        ["10", "2", "1"]


def test_depth_limits_levels_and_says_so() -> None:
    text = render_table(build(), depth=1)
    assert labels(text) == ["Sequential"]
    assert "4 rows deeper than depth=1 folded into their parents." in text
    two = render_table(build(), depth=2)
    assert [lab.strip() for lab in labels(two)] == ["Sequential", "encoder (Encoder)",
                                                    "head (Linear)"]
    assert "2 rows deeper than depth=2" in two
    assert "deeper than" not in render_table(build(), depth=3)


def test_row_limit_caps_rows_with_a_footer() -> None:
    text = render_table(build(), row_limit=2)
    assert len(rows(text)) == 2
    assert "3 more rows not shown (row_limit=2)." in text
    assert "not shown" not in render_table(build(), row_limit=5)


def test_min_percent_hides_small_subtrees() -> None:
    text = render_table(build(), min_percent=20)
    assert [lab.strip() for lab in labels(text)] == [
        "Sequential", "encoder (Encoder)", "0 (Linear)", "head (Linear)"]
    assert "1 row under 20% of total time hidden (min_percent=20)." in text
    text = render_table(build(), min_percent=35)
    assert [lab.strip() for lab in labels(text)] == ["Sequential", "encoder (Encoder)",
                                                     "0 (Linear)"]
    assert "2 rows under 35%" in text


def test_min_percent_counts_a_hidden_subtree_once_per_row() -> None:
    # encoder (60%) and both of its children go when the bar is above 60%.
    text = render_table(build(), min_percent=70)
    assert [lab.strip() for lab in labels(text)] == ["Sequential"]
    assert "4 rows under 70%" in text


@pytest.mark.parametrize("kwargs, argument", [
    ({"sort_by": "bogus"}, "sort_by"),
    ({"sort_by": None}, "sort_by"),
    ({"depth": 0}, "depth"),
    ({"depth": -1}, "depth"),
    ({"depth": 1.5}, "depth"),
    ({"depth": True}, "depth"),
    ({"row_limit": 0}, "row_limit"),
    ({"row_limit": "10"}, "row_limit"),
    ({"min_percent": -1}, "min_percent"),
    ({"min_percent": 101}, "min_percent"),
    ({"min_percent": "5"}, "min_percent"),
    ({"min_percent": float("nan")}, "min_percent"),
])
def test_bad_arguments_raise_naming_the_argument(kwargs: dict, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        render_table(build(), **kwargs)


def test_bad_sort_by_lists_the_allowed_values() -> None:
    with pytest.raises(ValueError) as info:
        render_table(build(), sort_by="time")
    for allowed in ("'total'", "'self'", "'flops'", "'calls'", "'name'", "'call_order'"):
        assert allowed in str(info.value)


def test_backward_columns_appear_only_with_backward_data() -> None:
    plain = build()
    assert "Bwd time" not in render_table(plain)
    assert "Bwd time" in render_table(plain, show_backward=True)
    with_bwd = build()
    fc = with_bwd.find("encoder.0")
    fc.backward_time.add(800_000)
    fc.backward_flops = fc.backward_gemm_flops = 4000
    text = render_table(with_bwd)
    assert "Bwd time" in text and "Bwd FLOPs" in text
    assert row_of(text, "0 (Linear)")["Bwd time"] == "800 us"
    encoder = row_of(text, "encoder (Encoder)")
    # Like Total time and FLOPs, the Bwd columns include the children.
    assert (encoder["Bwd time"], encoder["Bwd FLOPs"]) == ("800 us", "4.00 KFLOPs")
    assert row_of(text, "head (Linear)")["Bwd time"] == "-"  # no backward timed there
    assert "Backward FLOPs: 4.00 KFLOPs (GEMM/conv 4.00 KFLOPs, other 0 FLOPs)" in text
    assert "Total FLOPs:    6.70 KFLOPs" in text
    assert "Bwd time" not in render_table(with_bwd, show_backward=False)


def test_footer_steps_unsupported_errors_and_cap() -> None:
    result = build(steps=[ms * 1_000_000 for ms in range(1, 11)],
                   unsupported={"MyLayer": 3, "Odd": 1}, dropped_events=5)
    result.find("head").errors = 2
    text = render_table(result)
    steps = next(line for line in text.splitlines() if line.startswith("Steps:"))
    assert steps.startswith("Steps:         10 steps, mean 5.50 ms, p50 4.96 ms, p90 8.98 ms")
    assert "spread 52.2% (std/mean, noisy)" in steps
    assert ("Unsupported:   MyLayer (3 calls), Odd (1 call); no FLOP rule and no counted "
            "operation: unknown FLOPs (marked ? in the table, + above them)") in text
    assert "Errors:        2 calls raised (head)" in text
    assert text.splitlines()[-1] == "Timeline capped: 5 events dropped (max_events reached)"


def test_footer_omits_what_is_not_there() -> None:
    text = render_table(build())
    for absent in ("Steps:", "Unsupported:", "Errors:", "Timeline capped", "Backward FLOPs"):
        assert absent not in text


def test_steady_steps_are_not_flagged_noisy() -> None:
    text = render_table(build(steps=[1_000_000, 1_010_000, 990_000]))
    assert "spread 0.8% (std/mean)" in text


def test_empty_profile() -> None:
    text = render_table(ProfileResult(CallNode.root()))
    assert text.splitlines()[0] == "No calls were recorded."
    assert "Total time:    0 ns in 0 top-level calls" in text


def test_node_label() -> None:
    root = CallNode.root()
    assert node_label(root.child("", "Sequential", "a")) == "Sequential"
    assert node_label(root.child("fc", "Linear", "b")) == "fc (Linear)"
    assert node_label(root.child("matmul", "matmul", "c", kind="function")) == "matmul"


# -------------------------------------------------------------------------- flat views
def shared() -> ProfileResult:
    """One Linear module (key "lin") called from two parents, plus another Linear."""
    root = CallNode.root()
    model = root.child("", "Net", "net")
    model.time.add(1_000)
    for parent_name, parent_key in (("a", "pa"), ("b", "pb")):
        parent = model.child(parent_name, "Block", parent_key)
        parent.time.add(400)
        lin = parent.child("lin", "Linear", "lin")
        lin.time.add(300)
        lin.flops = lin.gemm_flops = 50
    other = model.child("out", "Linear", "out")
    other.time.add(100)
    other.flops = 7
    return ProfileResult(root)


def test_flat_by_type_rows_add_up() -> None:
    result = shared()
    text = render_flat(result, view="type")
    assert text.splitlines()[0].split()[:3] == ["Type", "Sites", "Calls"]
    linear = row_of(text, "Linear")
    assert (linear["Sites"], linear["Calls"], linear["FLOPs"]) == ("3", "3", "107 FLOPs")
    # Sorted by total time (Net 1000, Block 800, Linear 700 ns), but the share is of self
    # time (Net 100, Block 200, Linear 700 ns), so the column adds up to 100%.
    assert [c["Type"] for c in cells(text)] == ["Net", "Block", "Linear"]
    assert [c["% time"] for c in cells(text)] == ["10.0%", "20.0%", "70.0%"]
    assert sum(int(c["FLOPs"].split()[0]) for c in cells(text)) == result.forward_flops
    assert "each row's own" in text


def test_flat_by_module_folds_a_shared_module_into_one_row() -> None:
    text = render_flat(shared(), view="module", sort_by="name")
    assert [c["Module"] for c in cells(text)] == ["a", "a.lin", "b", "Net", "out"]
    lin = row_of(text, "a.lin")
    assert (lin["Type"], lin["Sites"], lin["Calls"], lin["FLOPs"]) == \
        ("Linear", "2", "2", "100 FLOPs")


def test_flat_sort_and_bad_view() -> None:
    text = render_flat(shared(), view="type", sort_by="flops")
    assert [c["Type"] for c in cells(text)] == ["Linear", "Net", "Block"]
    with pytest.raises(ValueError, match="view"):
        render_flat(shared(), view="layer")
    with pytest.raises(ValueError, match="sort_by"):
        render_flat(shared(), sort_by="size")


def test_flat_empty_profile() -> None:
    assert render_flat(ProfileResult(CallNode.root())).startswith("No calls were recorded.")


def test_control_characters_in_names_are_escaped():
    from tracetorch.records.result import ProfileResult
    from tracetorch.records.tree import CallNode
    from tracetorch.report.flat_table import render_flat
    from tracetorch.report.table import render_table

    root = CallNode.root()
    node = root.child("evil\x1b[2J\x07", "Bell\nType", "m0")
    node.time.add(10)
    result = ProfileResult(root)
    for text in (render_table(result), render_flat(result, view="module"),
                 render_flat(result, view="type")):
        assert "\x1b" not in text and "\x07" not in text
        assert "Bell\nType" not in text
    assert "evil\\x1b[2J\\x07 (Bell\\nType)" in render_table(result)


def test_time_stats_and_aggregate_rows_read_well():
    from tracetorch.records.stats import TimeStats

    stats = TimeStats()
    assert repr(stats) == "TimeStats(count=0)"
    stats.add(5)
    stats.add(7)
    assert repr(stats) == "TimeStats(count=2, total_ns=12, mean_ns=6.0, min_ns=5, max_ns=7)"


def test_flops_a_rule_cannot_give_are_marked_unknown_and_their_parents_partial():
    import warnings

    import numpy as np

    import tracetorch
    from tracetorch.core import Linear, Tensor

    class Odd:  # a duck-typed layer doing arithmetic tracetorch cannot see
        def forward(self, x):
            return x

    class Net:
        def __init__(self):
            self.fc, self.odd = Linear(4, 3), Odd()

        def forward(self, x):
            return self.odd.forward(self.fc(x))

    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracetorch.profile(model) as prof:
            model.forward(Tensor(np.ones((2, 4))))
    assert [(n.path, n.completeness) for n in prof.nodes()] == [
        ("", "partial"), ("fc", "complete"), ("odd", "unknown")]
    assert prof.completeness == "partial"
    text = str(prof)
    row = {line.split()[0]: line for line in text.splitlines()[2:5]}
    assert row["Net"].split()[2:4] == ["48", "FLOPs+"]
    assert row["odd"].split()[3] == "?"
    assert "FLOPs+ = a lower bound" in text
    assert "Forward FLOPs: 48 FLOPs (GEMM/conv 48 FLOPs, other 0 FLOPs); a lower bound" in text
    from tracetorch.records.jsonio import result_to_dict

    document = result_to_dict(prof)
    net = document["root"]["children"][0]
    assert net["completeness"] == "partial"
    assert [c["completeness"] for c in net["children"]] == ["complete", "unknown"]
