"""``Optimizer.zero_grad`` runs without the profile's function mode, and a step's results stay."""
from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.filterwarnings("ignore:tracetorch has no FLOP rule")

#: Row fields that depend on the clock, not on what ran.
_TIMED = ("self_ns", "total_ns", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "min_ns", "max_ns",
          "std_ns", "backward_ns")


def _model(torch: Any) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), torch.ones(2, 5)


def _seen_by_the_mode(torch: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The functions the profiles' modes are handed from now on, in order."""
    from tracetorch.adapters.torch.ops import OpCountingMode

    seen: list[Any] = []
    handler = OpCountingMode.__torch_function__

    def recording(self: Any, func: Any, types: Any, args: tuple[Any, ...] = (),
                  kwargs: dict[str, Any] | None = None) -> Any:
        seen.append(func)
        return handler(self, func, types, args, kwargs)

    monkeypatch.setattr(OpCountingMode, "__torch_function__", recording)
    return seen


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_is_not_seen_by_the_mode_and_still_resets(torch, monkeypatch, set_to_none):
    import tracetorch

    model, opt, _ = _model(torch)
    torch_zero_grad = vars(torch.optim.Optimizer)["zero_grad"]
    seen = _seen_by_the_mode(torch, monkeypatch)
    with tracetorch.profile(model):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        before = len(seen)
        opt.zero_grad(set_to_none=set_to_none)
        during = seen[before:]
        after_grads = [p.grad for p in model.parameters()]
        depth = torch._C._len_torch_function_stack()
    # Through the mode: the record_function enter and exit, and each parameter's .grad read and
    # write (no FLOPs, no op table at the root): none of it reaches it now.
    assert during == []
    assert depth == 1  # the mode is back on the stack after zero_grad
    if set_to_none:
        assert after_grads == [None] * 4
    else:
        assert all(g is not None and not g.any() for g in after_grads)
    assert vars(torch.optim.Optimizer)["zero_grad"] is torch_zero_grad
    assert torch._C._len_torch_function_stack() == 0


def test_a_training_step_counts_what_it_did_before(torch):
    # The same steps with torch's zero_grad and with the gradients dropped by hand at the root,
    # where the mode saw (and counted nothing of) every .grad write: the same results.
    import tracetorch

    def profile(reset: str) -> tuple[list[dict[str, Any]], tuple[int, ...]]:
        model, opt, w = _model(torch)
        with tracetorch.profile(model) as prof:
            for _ in range(3):
                x = torch.ones(2, 4)
                loss = (model(x) @ w[:2]).square().mean()  # a product at the root: counted
                loss.backward()
                opt.step()
                if reset == "zero_grad":
                    opt.zero_grad()
                else:
                    for p in model.parameters():
                        p.grad = None
        rows = [{k: v for k, v in row.items() if k not in _TIMED} for row in prof.to_rows()]
        totals = (prof.forward_gemm_flops, prof.backward_gemm_flops, prof.forward_flops,
                  prof.backward_flops)
        return rows, totals

    rows, totals = profile("zero_grad")
    assert (rows, totals) == profile("by hand")
    # Per step, forward: Linear(4,3) 2·2·4·3, Linear(3,2) 2·2·3·2, the root's product 2·2·2·5;
    # backward: the first Linear's weight gradient only (its input needs none), the second's
    # input and weight gradients, the root product's input gradient only (w needs none).
    assert totals[:2] == (3 * (48 + 24 + 40), 3 * (48 + 2 * 24 + 40))
    assert [row["calls"] for row in rows if row["kind"] == "optimizer"] == [3]
