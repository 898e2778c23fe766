"""Wrappers reused from block to block, and values the board installs over its own."""
from __future__ import annotations

from tracetorch.engine.patches import PatchBoard, PatchTarget, is_instrumented, reusable_wrapper


class Layer:
    def forward(self, x):
        return x + 1


def test_the_same_callable_gets_the_same_wrapper_until_it_changes():
    original = vars(Layer)["forward"]
    first = reusable_wrapper(Layer, "forward", original, "module")
    assert reusable_wrapper(Layer, "forward", original, "module") is first
    assert reusable_wrapper(Layer, "forward", original, "function") is not first

    def other(self, x):
        return x

    assert reusable_wrapper(Layer, "forward", other, "module").__wrapped__ is other
    assert is_instrumented(first) and first(Layer(), 1) == 2


def test_each_opening_of_a_board_installs_the_wrapper_built_the_first_time():
    original = vars(Layer)["forward"]
    installed = []
    board = PatchBoard()
    for _ in range(2):
        board.acquire([PatchTarget(Layer, "forward", "module")])
        installed.append(vars(Layer)["forward"])
        board.release()
        assert vars(Layer)["forward"] is original
    assert installed[0] is installed[1]


def test_install_replaces_only_its_own_value_and_restores_the_first_original():
    class Owner:
        pass

    board = PatchBoard()
    assert board.install(Owner, "hook", 1) is False  # no profile open: nothing set
    board.acquire([])
    assert board.install(Owner, "hook", 1) and board.install(Owner, "hook", 2)
    assert vars(Owner)["hook"] == 2
    Owner.hook = 3  # the user's own: kept, and not replaced
    assert board.install(Owner, "hook", 4) is False and vars(Owner)["hook"] == 3
    board.release()
    assert vars(Owner)["hook"] == 3
    del Owner.hook
    board.acquire([])
    board.install(Owner, "hook", 1)
    board.install(Owner, "hook", 2)
    board.release()
    assert "hook" not in vars(Owner)  # it had none of its own
