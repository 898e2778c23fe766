"""torch layer classes wrapped at their first call in a block: what is wrapped when, and that
every call is still recorded and nothing stays behind."""
import os
import threading

import pytest

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")

import tracetorch  # noqa: E402
from test_torch_tracers import run_case  # noqa: E402
from tracetorch.adapters.torch.tracing import tracing  # noqa: E402
from tracetorch.engine.patches import BOARD, is_instrumented  # noqa: E402
from tracetorch.profiler.block import ADAPTERS  # noqa: E402

nn = torch.nn
CALL_IMPL = vars(nn.Module)["_call_impl"]
MODULE_CALL = vars(nn.Module)["__call__"]


class Base(nn.Module):
    def forward(self, x):
        return x + 1


class Child(Base):
    def forward(self, x):
        return super().forward(x) * 2


class Heir(Base):
    """Inherits ``forward``."""


class Mixin(nn.Module):
    def forward(self, x):
        return x - 1


class Mixed(Mixin, Base):
    """A direct subclass of ``Base`` whose ``forward`` is ``Mixin``'s."""


class Grandchild(Child):
    def forward(self, x):
        return x * 3


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Mixin()

    def forward(self, x):
        return self.inner.forward(x)  # skips __call__: only profile(model) sees it


def test_entering_wraps_no_layer_class_until_one_is_called():
    with tracetorch.profile():
        assert (nn.Linear, "forward") not in BOARD.patched()
        assert vars(nn.Module)["__call__"] is MODULE_CALL  # fx and quantization patch it
        nn.Linear(2, 2)(torch.ones(1, 2))
        assert is_instrumented(vars(nn.Linear)["forward"])
        assert vars(nn.Linear)["_call_impl"] is CALL_IMPL  # torch's own, as Dynamo checks
        assert "forward" not in vars(nn.LazyLinear)
    assert "_call_impl" not in vars(nn.Linear) and not is_instrumented(vars(nn.Linear)["forward"])
    assert vars(nn.Module)["_call_impl"] is CALL_IMPL and not BOARD.patched()


def test_subclasses_of_a_class_called_first_are_recorded():
    x = torch.ones(2)
    with tracetorch.profile(warn_unsupported=False) as prof:
        Base()(x)  # Base now skips the first-call function; its subclasses must not
        outputs = [Child()(x), Heir()(x), Mixed()(x), Grandchild()(x)]
        # Each class seen now calls torch's own _call_impl, not the first-call function.
        assert all(vars(cls)["_call_impl"] is CALL_IMPL for cls in (Base, Child, Heir, Mixed))
    assert [out.tolist() for out in outputs] == [[4.0, 4.0], [2.0, 2.0], [0.0, 0.0], [3.0, 3.0]]
    # Base, called first at the top, stands for the model: "".
    assert [prof.find(name).calls for name in ("", "Child", "Heir", "Mixed", "Grandchild")] \
        == [1, 1, 1, 1, 1]
    assert len(prof.nodes()) == 5  # super().forward() is the same call, not a level
    for cls in (Base, Child, Heir, Mixed, Grandchild, Mixin):
        assert "_call_impl" not in vars(cls) and not is_instrumented(vars(cls).get("forward"))


def test_each_block_rewraps_with_the_same_wrapper():
    layer = nn.ReLU()
    wrappers = []
    for _ in range(2):
        with tracetorch.profile() as prof:
            layer(torch.ones(1))
            wrappers.append(vars(nn.ReLU)["forward"])
        assert prof.find("").calls == 1
    assert wrappers[0] is wrappers[1] and is_instrumented(wrappers[0])


def test_a_models_classes_are_wrapped_on_entry_with_the_torch_guard():
    model = Outer()
    with tracetorch.profile(model, warn_unsupported=False) as prof:
        assert is_instrumented(vars(Mixin)["forward"])
        model(torch.ones(2))
    assert prof.find("inner").calls == 1
    with tracetorch.profile():
        targets = [t for t in ADAPTERS.targets(model)
                   if t.attr == "forward" and issubclass(t.cls, nn.Module)]
    assert {t.cls for t in targets} == {Outer, Mixin}
    assert all(t.guard is tracing for t in targets)


def test_fx_traces_the_same_graph_after_the_layers_ran_in_the_block():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    expected = torch.fx.symbolic_trace(model).code
    with tracetorch.profile() as prof:
        model(torch.ones(1, 3))
        inside = torch.fx.symbolic_trace(model).code  # Linear and ReLU stay leaf modules
    assert inside == expected
    assert [n.path for n in prof.nodes()] == ["", "0", "1"]


def test_a_call_in_another_thread_wraps_but_is_not_recorded():
    class Fresh(nn.Module):
        def forward(self, x):
            return x

    with tracetorch.profile() as prof:
        worker = threading.Thread(target=lambda: Fresh()(torch.ones(1)))
        worker.start()
        worker.join()
        assert is_instrumented(vars(Fresh)["forward"])
    assert prof.nodes() == [] and "_call_impl" not in vars(Fresh)
    assert not is_instrumented(vars(Fresh)["forward"])


@pytest.mark.slow
def test_compilers_after_the_layers_ran_in_the_block(torch_installed, tmp_path):
    code = """
with tracetorch.profile(warn_unsupported=False):
    model(x)
    scripted = torch.jit.script(model)
    traced = torch.fx.symbolic_trace(model)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    outs = [same(scripted(x), expected), same(traced(x), expected), same(compiled(x), expected)]
    codes = [scripted.code, traced.code]
torch._dynamo.reset()
print(json.dumps({"outs": outs, "after": same(torch.compile(model, backend="eager")(x), expected),
                  "code_same": [codes[0] == torch.jit.script(model).code,
                                codes[1] == torch.fx.symbolic_trace(model).code]}))
"""
    assert run_case(code, tmp_path) == {"outs": [True, True, True], "after": True,
                                        "code_same": [True, True]}
