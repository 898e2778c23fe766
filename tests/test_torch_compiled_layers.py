"""A torch.compile'd model's tree: the eager rows and per-layer FLOPs, compilations as facts.

Compiled and eager runs of the same step must give the same call paths with the same forward
and backward FLOPs; the region's row keeps its measured time, the rows under it are listed as
estimated; graphs, recompilations and graph breaks agree with ``torch._dynamo.utils.counters``;
the profile compiles nothing more and leaves the model as it was.
"""
from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

import tracetorch
from support.dynamo import fresh_dynamo  # noqa: F401 - the fixture, used by pytestmark

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
transformers = (pytest.importorskip("transformers") if os.environ.get("CI") != "true"
                else __import__("transformers"))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def counted(group: str, name: str) -> int:
    return int(torch._dynamo.utils.counters[group][name])


def mlp() -> Any:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


class Block(torch.nn.Module):
    """A child whose forward breaks the graph."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: Any) -> Any:
        x = torch.relu(self.conv(x))
        torch._dynamo.graph_break()
        return x + 1


class CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.block = Block()
        self.head = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: Any) -> Any:
        return self.head(self.block(self.stem(x)).flatten(1))


def rows(prof: Any) -> dict[str, tuple[int, int, int]]:
    """Each layer row (not the region's, typed differently): calls, forward and backward FLOPs."""
    return {n.path: (n.calls, n.flops, n.backward_flops) for n in prof.nodes()
            if n.kind == "module" and n.path}


def step(model: Any, x: Any) -> None:
    out = model(x)
    if not isinstance(out, torch.Tensor):  # a transformers output: a gradient into each output
        out = out.last_hidden_state.sum() + out.pooler_output.sum()
    out.sum().backward()


def eager_and_compiled(model: Any, x: Any, backend: str) -> tuple[Any, Any]:
    """Profiles of one eager step and one compiled step (compiled, forward and backward, before
    the block; the model as torch.compile left it is unchanged by the block)."""
    with tracetorch.profile() as eager:
        step(model, x)
    compiled = torch.compile(model, backend=backend)
    step(compiled, x)
    before = snapshot(model)
    with tracetorch.profile() as prof:
        step(compiled, x)
    assert snapshot(model) == before
    return eager, prof


def snapshot(model: Any) -> Any:
    return [(name, sorted(vars(m)), dict(m._forward_hooks), dict(m._forward_pre_hooks),
             dict(m._backward_hooks), type(m).__dict__.get("forward"))
            for name, m in model.named_modules()]


def test_a_compiled_mlp_step_has_the_eager_rows_and_flops() -> None:
    model, x = mlp(), torch.randn(8, 16)
    eager, prof = eager_and_compiled(model, x, "aot_eager")
    graphs = counted("stats", "unique_graphs")
    # Linear(16, 32) on 8 rows: 2·8·16·32 forward; backward its weight's gradient only (x needs
    # none); ReLU 8·32 (one per element); Linear(32, 4): 2·8·32·4 and twice that backward.
    assert rows(prof) == rows(eager) == {
        "0": (1, 2 * 8 * 16 * 32, 2 * 8 * 16 * 32), "1": (1, 8 * 32, 0),
        "2": (1, 2 * 8 * 32 * 4, 2 * (2 * 8 * 32 * 4))}
    region = prof.find("")
    assert region.type_name == "Sequential" and region.calls == 1  # typed as the model compiled
    assert region.subtree_flops == eager.find("").subtree_flops
    assert graphs == 1 and counted("frames", "ok") == 1  # the profile compiled nothing
    assert all(type(p.grad) is torch.Tensor for p in model.parameters())


def test_the_regions_time_is_measured_and_its_layers_times_are_estimated() -> None:
    model, x = mlp(), torch.randn(8, 16)
    _, prof = eager_and_compiled(model, x, "aot_eager")
    region = prof.find("")
    assert prof.meta["compiled"]["estimated"] == ["0", "1", "2"]
    assert prof.meta["compiled"]["regions"][""]["layers"] == "replayed"
    # Shares of the region's measured time: never more than it, forward or backward.
    assert sum(c.total_ns for c in region.children.values()) <= region.total_ns
    assert region.backward_time.total_ns >= 0
    assert prof.find("0").backward_time.count == 1
    summary = "\n".join(prof.summary_lines()) if hasattr(prof, "summary_lines") else str(prof)
    assert "Compiled:" in summary and "estimated" in summary


def test_a_cnn_with_a_graph_break_has_the_eager_rows_and_the_break_as_a_fact() -> None:
    torch.manual_seed(0)
    model, x = CNN(), torch.randn(2, 3, 6, 6)
    with tracetorch.profile() as eager:
        step(model, x)
    compiled = torch.compile(model, backend="aot_eager")
    with tracetorch.profile() as prof:  # compiled inside the block, breaks and all
        step(compiled, x)
    assert rows(prof) == rows(eager)
    assert rows(prof)["block.conv"][1] == 2 * 2 * 36 * 4 * 4 * 9  # 2·N·HW·Cout·Cin·k²
    region = prof.meta["compiled"]["regions"][""]
    assert region["graph_breaks"] == sum(torch._dynamo.utils.counters["graph_break"].values())
    assert region["graph_breaks"] >= 1 and "graph_break()" in region["break_reasons"][0]
    assert region["graphs"] == counted("stats", "unique_graphs")
    assert region["frames"] == counted("frames", "ok") and region["recompiles"] == 0
    assert region["compile_ns"] > 0


def test_a_new_input_shape_is_a_recompilation_counted_as_dynamo_counts_it() -> None:
    model = mlp()
    compiled = torch.compile(model, backend="aot_eager")
    compiled(torch.randn(8, 16))
    frames = counted("frames", "ok")
    with tracetorch.profile() as prof:
        compiled(torch.randn(8, 16))
        compiled(torch.randn(5, 16))  # another batch size: Dynamo compiles again
    region = prof.meta["compiled"]["regions"][""]
    assert region["recompiles"] == region["frames"] == counted("frames", "ok") - frames >= 1
    assert region["calls"] == 2
    # Each call's rows from its own replay: 8 and 5 rows through Linear(16, 32).
    assert prof.find("0").flops == 2 * (8 + 5) * 16 * 32


def test_a_compiled_bert_has_the_eager_rows_and_flops() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100,
                                     max_position_embeddings=32)
    model, ids = transformers.BertModel(config).train(), torch.randint(0, 100, (2, 8))
    eager, prof = eager_and_compiled(model, ids, "aot_eager")
    assert rows(prof) == rows(eager)
    assert len(rows(prof)) > 30 and prof.find("encoder.layer.0.attention.self.query").flops > 0
    assert counted("stats", "unique_graphs") == 1


def test_a_users_exception_passes_through_a_compiled_call() -> None:
    class Fails(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            raise ValueError("user error")

    compiled = torch.compile(Fails(), backend="eager")
    optimized = torch._dynamo.eval_frame.OptimizedModule
    original = vars(optimized).get("__call__")
    with pytest.raises(ValueError, match="user error"):
        with tracetorch.profile():
            compiled(torch.ones(2))
    assert vars(optimized).get("__call__") is original


def test_a_model_that_reads_data_keeps_one_row_with_its_dispatched_flops() -> None:
    class ReadsData(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.fc(x) * float(x.abs().max())  # a value fake tensors do not have

    model, x = ReadsData(), torch.randn(3, 4)
    compiled = torch.compile(model, backend="aot_eager")
    with tracetorch.profile() as prof:
        compiled(x)
    region = prof.meta["compiled"]["regions"][""]
    assert region["layers"] == "dispatched" and region["why_not"]
    assert prof.find("").flops == 2 * 3 * 4 * 4 and prof.meta["compiled"]["estimated"] == []


@pytest.mark.slow  # inductor compiles C++: about 15 s
def test_an_inductor_compiled_step_has_the_eager_rows_and_flops() -> None:
    model, x = mlp(), torch.randn(8, 16)
    eager, prof = eager_and_compiled(model, x, "inductor")
    assert rows(prof) == rows(eager)
    assert counted("stats", "unique_graphs") == 1


def test_compiled_and_eager_profiles_diff_row_for_row_and_the_facts_survive_json(
        tmp_path: Any) -> None:
    model, x = mlp(), torch.randn(8, 16)
    eager, prof = eager_and_compiled(model, x, "aot_eager")
    prof.save(tmp_path / "compiled.json")
    loaded = tracetorch.load(str(tmp_path / "compiled.json"))
    assert loaded.meta["compiled"] == prof.meta["compiled"]
    compared = tracetorch.diff(eager, loaded)
    assert compared.only_base == [] and compared.only_new == []
    assert {row.path for row in compared.layers} == {"(Sequential)", "0", "1", "2", "backward"}
    assert all(row.change("subtree_flops") == row.change("subtree_backward_flops") == 0
               for row in compared.layers)
    table = str(loaded)
    # The estimated times are marked in the table (the region's and the pass's are measured).
    assert [line.split()[0] for line in table.splitlines() if "~ " in line + " "] == [
        "0", "2", "1", "~"]
    assert "Compiled:" in table and "1 graph compiled" not in table  # compiled before the block


@pytest.mark.parametrize("ops", [True, False])
def test_each_step_charges_its_layers_backward_once(ops: bool) -> None:
    model, x = mlp(), torch.randn(8, 16)
    with tracetorch.profile(ops=ops) as eager:
        step(model, x)
    compiled = torch.compile(model, backend="aot_eager")
    step(compiled, x)
    # The parameters' gradient accumulators kept alive, the same each step (as a trainer's
    # gradient hooks keep them): a hook put there would run again in every later step.
    accumulators = [p.view_as(p).grad_fn.next_functions[0][0] for p in model.parameters()]
    with tracetorch.profile(ops=ops) as prof:
        for _ in range(3):
            step(compiled, x)
    assert all(type(a).__name__ == "AccumulateGrad" for a in accumulators)
    # The passes' own totals count the layers' gradients; no estimate makes a time negative.
    assert prof.find("backward").flops == 3 * eager.find("backward").flops > 0
    assert all(n.backward_time.min_ns >= 0 for n in prof.nodes() if n.backward_time.count)
    assert {path: (calls, flops, backward) for path, (calls, flops, backward)
            in rows(prof).items()} == {
        path: (3 * calls, 3 * flops, 3 * backward) for path, (calls, flops, backward)
        in rows(eager).items()}


@pytest.mark.slow  # two Trainer runs, one compiling: about 25 s
def test_the_hf_trainer_with_torch_compile_has_the_eager_rows_and_flops(tmp_path: Any) -> None:
    from tracetorch.integrations.huggingface import TracetorchCallback

    class Tokens:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": torch.arange(8) + i, "labels": torch.tensor(i % 2)}

    config = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=16, num_labels=2)

    def train(**compiling: Any) -> Any:
        torch.manual_seed(0)
        callback = TracetorchCallback(tracetorch.schedule(wait=1, active=1, repeat=1))
        args = transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
            report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
            disable_tqdm=True, **compiling)
        transformers.Trainer(model=transformers.BertForSequenceClassification(config),
                             train_dataset=Tokens(), callbacks=[callback], args=args).train()
        return callback.profile

    eager = train()
    compiled = train(torch_compile=True, torch_compile_backend="aot_eager")
    assert rows(compiled) == rows(eager)  # the first step (compiling) is not recorded
    assert compiled.meta["compiled"]["regions"][""]["graphs"] == 0


def test_a_nested_profile_notes_the_regions_it_recorded() -> None:
    model, x = mlp(), torch.randn(8, 16)
    eager, _ = eager_and_compiled(model, x, "aot_eager")
    compiled = torch.compile(model, backend="aot_eager")
    with tracetorch.profile() as outer:
        with tracetorch.profile() as inner:  # recorded apart, then handed to the outer one
            step(compiled, x)
    assert rows(inner) == rows(outer) == rows(eager)
    assert inner.meta["compiled"]["regions"][""]["calls"] == 1


def test_a_model_compiled_in_place_has_the_eager_rows_and_is_not_compiled_again() -> None:
    torch.manual_seed(0)
    model, x = CNN(), torch.randn(2, 3, 6, 6)
    model.block = torch.nn.Conv2d(4, 4, 3, padding=1)  # no graph break: one graph
    with tracetorch.profile(model) as eager:
        step(model, x)
    model.compile(backend="aot_eager")  # in place: Module.__call__ runs the compiled _call_impl
    step(model, x)
    graphs, frames = counted("stats", "unique_graphs"), counted("frames", "ok")
    with tracetorch.profile(model) as prof:
        step(model, x)
    step(model, x)
    assert rows(prof) == rows(eager)
    assert (counted("stats", "unique_graphs"), counted("frames", "ok")) == (graphs, frames)
    assert graphs == frames == 1
    assert prof.meta["compiled"]["regions"][""]["type"] == "CNN"
    assert "__call__" not in vars(CNN)  # the class's own __call__, while profiling, is gone


def test_a_layer_with_a_rule_compiled_in_place_is_counted_once() -> None:
    # Its region's replay charges the layer's FLOPs: its rule must not count them again, forward
    # or backward, nor in count_flops's running total.
    model, x = mlp(), torch.randn(2, 16)
    with tracetorch.profile(model) as eager:
        step(model, x)
    forward = tracetorch.count_flops(model, x)
    model[0].compile(backend="aot_eager")  # the first Linear alone, in place
    step(model, x)
    with tracetorch.profile(model) as prof:
        step(model, x)
    assert rows(prof) == rows(eager)
    assert (prof.forward_flops, prof.backward_flops) == (eager.forward_flops,
                                                         eager.backward_flops)
    assert tracetorch.count_flops(model, x) == forward == 2 * 2 * 16 * 32 + 2 * 32 + 2 * 2 * 32 * 4


@pytest.mark.parametrize("layers", [1, 2])
def test_a_replayed_compiled_module_is_not_called_unsupported(layers: int) -> None:
    class Tiny(torch.nn.Module):  # a class of its own: warned about at most once per type
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return self.fc(x)

    model = torch.nn.Linear(4, 4) if layers == 1 else Tiny()
    compiled = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the unsupported-layer warning would raise here
        with tracetorch.profile() as prof:
            compiled(torch.ones(2, 4))
    assert prof.unsupported == {} and prof.find("").completeness == "complete"
