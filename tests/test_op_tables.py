"""Each node's op table: the operations that ran directly in its calls, exact."""
from __future__ import annotations

import numpy as np
import pytest

import tracetorch
from tracetorch.cli.main import main
from tracetorch.core import Linear, Module, Tensor


class CoreGate(Module):
    def __init__(self):
        super().__init__()
        self.fc = Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        return h.sigmoid() * x + h.relu()


def test_a_core_custom_layer_lists_its_own_operations():
    layer = CoreGate()
    x = Tensor(np.ones((4, 8), dtype=np.float32))
    with tracetorch.profile(layer) as prof:
        layer(x)
        layer(x)
    own = {op.name: (op.calls, op.flops) for op in prof.find("").op_table()}
    # 4x8 elements: sigmoid 4 FLOPs each (core's convention), mul, add and relu 1 each.
    assert own == {"sigmoid": (2, 2 * 4 * 32), "mul": (2, 2 * 32), "add": (2, 2 * 32),
                   "relu": (2, 2 * 32)}
    # The Linear's matmul and bias add are its own, not its parent's.
    assert {op.name for op in prof.find("fc").op_table()} == {"matmul", "add"}


def test_a_torch_custom_layer_lists_every_operation(torch):
    class Gate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.fc(x)
            return torch.sigmoid(h) * x + h.relu().view(4, 8)

    layer = Gate()
    with tracetorch.profile(layer) as prof:
        layer(torch.ones(4, 8))
    table = {op.name: (op.calls, op.flops) for op in prof.find("").op_table()}
    assert table == {"sigmoid": (1, 4 * 32), "mul": (1, 32), "add": (1, 32), "relu": (1, 32),
                     "view": (1, 0)}
    assert prof.find("").flops == sum(flops for _, flops in table.values())
    assert all(op.time_ns == 0 for op in prof.find("").op_table())


def test_op_timing_times_each_operation_with_the_profile_clock(torch):
    ticks = iter(range(0, 10**9, 1_000))

    class Two(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    layer = Two()
    with tracetorch.profile(layer, op_timing=True, clock=lambda: next(ticks)) as prof:
        layer(torch.ones(3))
    assert [(op.name, op.calls, op.time_ns) for op in prof.find("").op_table()] == [
        ("add", 1, 1_000), ("relu", 1, 1_000)]


def test_op_tables_survive_save_and_the_cli_prints_them(tmp_path, capsys):
    layer = CoreGate()
    with tracetorch.profile(layer) as prof:
        layer(Tensor(np.ones((4, 8), dtype=np.float32)))
    path = str(tmp_path / "run.json")
    prof.save(path)
    assert tracetorch.load(path).find("").op_table() == prof.find("").op_table()
    assert main(["report", path, "--ops", ""]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Operations run directly in <model> (CoreGate)")
    assert "sigmoid" in out and "relu" in out and "matmul" not in out
    assert main(["report", path, "--ops", "nope"]) == 2
    assert "no call path 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [["x", 1, 2], ["x", -1, 0, 0]])
def test_a_damaged_op_row_is_refused(bad):
    model = Linear(2, 2)
    with tracetorch.profile(model) as prof:
        model(Tensor(np.ones((1, 2))))
    data = prof.to_dict()
    data["root"]["children"][0]["ops"] = [bad]
    with pytest.raises(ValueError, match=r"root.children\[0\].ops\[0\]"):
        tracetorch.ProfileResult.from_dict(data)
