"""A profile's marks on autograd nodes live alongside what other code hangs on the same graph:
a user's ``Tensor.register_hook`` (Grad-CAM), torch's ``ModuleTracker``, ``FlopCounterMode`` and
``torch.profiler``, each inside a block and around one. The other tool sees what it sees
without tracetorch; tracetorch records what it records without the other tool."""
import os

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402

nn = torch.nn
torch.set_num_threads(1)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))


def _input():
    torch.manual_seed(1)
    return torch.randn(2, 4)


def _numbers(prof):
    """What tracetorch recorded, less the times: per node its calls, forward and backward FLOPs."""
    return [(n.path, n.calls, n.flops, n.backward_flops) for n in prof.nodes()]


def _plain_profile(model, x):
    with tracetorch.profile(model) as prof:
        model(x).sum().backward()
    return _numbers(prof)


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def _hooked_step(model, x):
    """Forward, a hook on the first layer's output (doubling its gradient, as Grad-CAM's hooks
    may change it), backward, then the hook removed and backward again: the gradients of each
    pass, and the gradients the hook saw."""
    seen = []

    def hook(grad):
        seen.append(grad.clone())
        return grad * 2

    hidden = model[0](x)
    out = model[2](model[1](hidden))
    handle = hidden.register_hook(hook)
    out.sum().backward(retain_graph=True)
    first = _grads(model)
    model.zero_grad()
    handle.remove()
    out.sum().backward()
    return first, _grads(model), seen


def test_register_hook_on_a_layer_output_inside_a_block():
    model, x = _model(), _input()
    expected = _hooked_step(model, x)
    model.zero_grad()
    with tracetorch.profile(model) as prof:
        got = _hooked_step(model, x)
    for a, b in zip(expected, got):
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b))
    assert len(got[2]) == 1  # ran once, then removed
    # The first Linear's weight gradient doubled by the hook, not in the second pass.
    assert torch.equal(got[0][0], 2 * got[1][0])
    # Our own marks still charged both passes: 2·2·5·3 (input and weight of the second Linear),
    # 2·2·4·5 (the first's weight; the input needs no gradient).
    first, second = (n for n in prof.nodes() if n.type_name == "Linear")
    assert first.backward_flops == 2 * (2 * 2 * 4 * 5)
    assert second.backward_flops == 2 * (2 * (2 * 2 * 5 * 3))


def test_register_hook_after_the_block_on_an_output_made_in_it():
    model, x = _model(), _input()
    with tracetorch.profile(model):
        hidden = model[0](x)
        out = model[2](model[1](hidden))
    seen = []
    handle = hidden.register_hook(lambda grad: seen.append(grad) or grad * 2)
    out.sum().backward(retain_graph=True)
    doubled = model[0].weight.grad.clone()
    model.zero_grad()
    handle.remove()
    out.sum().backward()
    assert len(seen) == 1
    assert torch.equal(doubled, 2 * model[0].weight.grad)
    plain = _model()
    plain(x).sum().backward()
    assert torch.equal(model[0].weight.grad, plain[0].weight.grad)


def test_layer_outputs_carry_no_hook_dict_of_ours():
    # Marks reach each node through a tensor of our own (marks._HOOK_CARRIER): a layer output's
    # hook dict stays the user's alone, and their hook runs beside ours.
    seen = []

    def layer_by_layer(hook):
        model, x = _model(), _input()
        with tracetorch.profile(model) as prof:
            hidden = model[0](x)
            activated = model[1](hidden)
            handle = activated.register_hook(hook) if hook else None
            out = model[2](activated)
            assert hidden._backward_hooks is None and out._backward_hooks is None
            assert len(activated._backward_hooks or ()) == (1 if hook else 0)
            out.sum().backward()
        if handle is not None:
            handle.remove()
            assert not activated._backward_hooks
        return _numbers(prof)

    assert layer_by_layer(lambda grad: seen.append(grad.shape)) == layer_by_layer(None)
    assert seen == [torch.Size([2, 5])]


class _SecondHalf(nn.Module):
    def forward(self, x):
        return x.chunk(2, dim=-1)[1]  # the second output of a two-output autograd node


def test_a_layer_returning_a_later_output_of_a_node_is_reached_in_backward():
    model = nn.Sequential(nn.Linear(4, 6), _SecondHalf(), nn.Linear(3, 2))
    with tracetorch.profile(model) as prof:
        model(_input()).sum().backward()
    half = next(n for n in prof.nodes() if n.type_name == "_SecondHalf")
    first, last = (n for n in prof.nodes() if n.type_name == "Linear")
    assert half.backward_time.count == 1  # its node's hook ran: a boundary of its own
    assert (first.backward_flops, last.backward_flops) == (2 * 2 * 4 * 6, 2 * 2 * 2 * 3 * 2)


# ----------------------------------------------------------------------------- torch's tools
def _tracked(model, x):
    """What ModuleTracker says around each aten op of a forward and backward: (op, parents,
    is_bw), from a dispatch mode under the tracker. Not ``detach``: tracetorch reads what a
    layer's node saved for backward, which detaches it."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.module_tracker import ModuleTracker

    model.zero_grad()
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is not torch.ops.aten.detach.default:
                seen.append((str(func), frozenset(tracker.parents), tracker.is_bw))
            return func(*args, **(kwargs or {}))

    with ModuleTracker() as tracker, Record():
        model(x).sum().backward()
    return seen


def test_module_tracker_inside_a_block_sees_what_it_sees_alone():
    model, x = _model(), _input()
    alone = _tracked(model, x)
    assert any(is_bw for _, _, is_bw in alone)  # it saw the backward modules
    with tracetorch.profile(model):
        inside = _tracked(model, x)
    assert inside == alone


def test_a_block_inside_module_tracker_records_as_alone():
    from torch.utils.module_tracker import ModuleTracker

    model, x = _model(), _input()
    alone = _plain_profile(model, x)
    with ModuleTracker() as tracker:
        assert _plain_profile(model, x) == alone
        assert tracker.parents == {"Global"}


def _fcm(model, x):
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    return counter.get_total_flops(), counter.get_flop_counts()


def test_flop_counter_mode_inside_a_block_counts_as_alone():
    model, x = _model(), _input()
    alone = _fcm(model, x)
    assert alone[0] == 2 * 2 * 4 * 5 * 2 + 2 * 2 * 5 * 3 * 3  # 0: forward, weight; 2: all three
    with tracetorch.profile(model):
        assert _fcm(model, x) == alone


def test_a_block_inside_flop_counter_mode_records_as_alone():
    from torch.utils.flop_counter import FlopCounterMode

    model, x = _model(), _input()
    alone, counted = _plain_profile(model, x), _fcm(model, x)
    with FlopCounterMode(display=False) as counter:
        assert _plain_profile(model, x) == alone
    assert (counter.get_total_flops(), counter.get_flop_counts()) == counted


def test_torch_profiler_inside_and_around_a_block():
    model, x = _model(), _input()
    alone = _plain_profile(model, x)
    with tracetorch.profile(model) as prof:
        with torch.profiler.profile():
            model(x).sum().backward()
    assert _numbers(prof) == alone
    with torch.profiler.profile() as outer:
        assert _plain_profile(model, x) == alone
    assert any(e.name == "aten::mm" for e in outer.events())


def test_saving_an_output_made_in_a_block_warns_of_no_hook_of_ours():
    # torch.save warns of each backward hook on a tensor it cannot serialize; ours are on the
    # tensor's autograd node only, none on the tensor.
    import io
    import warnings

    model, x = _model(), _input()
    with tracetorch.profile(model):
        out = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.save(out, io.BytesIO())
