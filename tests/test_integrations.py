"""The training-framework callbacks with the real frameworks: ``transformers.Trainer`` and
``lightning.Trainer`` train tiny models on CPU for a few optimizer steps, with gradient
accumulation and a schedule, and the profile must count exactly those steps, calls and FLOPs;
after training, also training that raises mid-way, nothing of tracetorch may be left installed.

transformers, accelerate and lightning are required under ``CI=true`` (a missing one fails the
tests); locally the tests of a missing framework skip.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

import tracetorch as tt
from tracetorch.engine.hotpath import current_frame
from tracetorch.engine.patches import BOARD
from tracetorch.integrations import ProfilingCallback

# The schedule of the runs below: 4 optimizer steps, the first skipped, 2 recorded, 1 after.
SCHEDULE = tt.schedule(wait=1, active=2, repeat=1)
ACTIVE, ACCUMULATE = 2, 2


def _require(*names: str) -> ModuleType:
    """The first module named, after every one was imported: required in CI, else skipped."""
    modules = [importlib.import_module(n) if os.environ.get("CI") == "true"
               else pytest.importorskip(n) for n in names]
    return modules[0]


@pytest.fixture(scope="module")
def torch() -> ModuleType:
    module = _require("torch")
    module.set_num_threads(2)
    return module


@pytest.fixture(scope="module")
def hf(torch: ModuleType) -> ModuleType:
    return _require("transformers", "accelerate")


@pytest.fixture(scope="module")
def pl(torch: ModuleType) -> ModuleType:
    return _require("lightning")


@pytest.fixture
def untouched(torch: ModuleType) -> Any:
    """After the test: ``Linear.forward`` the original object, nothing patched, no tracetorch
    frame in this context, no torch mode left on a stack."""
    forward = vars(torch.nn.Linear)["forward"]
    yield
    assert vars(torch.nn.Linear)["forward"] is forward
    assert not BOARD.patched()
    assert current_frame() is None
    assert torch._C._len_torch_dispatch_stack() == 0
    assert torch._C._len_torch_function_stack() == 0


def _linear_flops(rows: int, n_in: int, n_out: int) -> int:
    return 2 * rows * n_in * n_out


# ---------------------------------------------------------------------------- Hugging Face
def _hf_args(hf: ModuleType, tmp_path: Any, **extra: Any) -> Any:
    return hf.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4,
                                per_device_train_batch_size=2, report_to=[], use_cpu=True,
                                save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                **extra)


class _Tokens:
    """16 sequences of 8 token ids, with a label each."""

    def __init__(self, torch: ModuleType) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 50, (16, 8), generator=generator)
        self.torch = torch

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.torch.tensor(i % 2)}


def test_hf_trainer_profiles_optimizer_steps_with_a_schedule(hf, torch, tmp_path, capsys,
                                                              untouched):
    from tracetorch.integrations.huggingface import TracetorchCallback

    config = hf.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                           num_attention_heads=2, intermediate_size=64,
                           max_position_embeddings=16, num_labels=2)
    model = hf.BertForSequenceClassification(config)
    callback = TracetorchCallback(SCHEDULE, output=tmp_path / "run.json",
                                  html=tmp_path / "run.html")
    trainer = hf.Trainer(model=model, train_dataset=_Tokens(torch), callbacks=[callback],
                         args=_hf_args(hf, tmp_path, gradient_accumulation_steps=ACCUMULATE))
    trainer.train()

    prof = callback.profile
    assert not callback.running
    assert prof.step_count == trainer.state.global_step == 4  # every optimizer step marked
    assert prof.step_times.count == ACTIVE
    forwards = ACTIVE * ACCUMULATE  # micro-batches of the recorded steps
    query = prof.find("bert.encoder.layer.0.attention.self.query")
    assert query.calls == forwards
    assert query.flops == forwards * _linear_flops(2 * 8, 32, 32)
    assert prof.find("bert.encoder.layer.0.intermediate.dense").flops == (
        forwards * _linear_flops(2 * 8, 32, 64))
    assert prof.find("classifier").flops == forwards * _linear_flops(2, 32, 2)
    assert prof.find("backward").calls == forwards
    assert prof.find("AdamW.step").calls == ACTIVE  # one optimizer step per recorded step
    assert query.backward_flops == 2 * query.flops  # the gradients of input and weight

    out = capsys.readouterr().out
    assert "AdamW.step" in out and f"Steps:          {ACTIVE} steps" in out
    saved = tt.load(str(tmp_path / "run.json"))
    assert saved.find("bert.encoder.layer.0.attention.self.query").calls == forwards
    assert (tmp_path / "run.html").read_text().startswith("<!DOCTYPE html>")


class _Regressor:
    """A model of 4 features for Trainer, raising on its ``fail_at``-th call (if given)."""

    @staticmethod
    def make(torch: ModuleType, fail_at: int | None = None) -> Any:
        nn = torch.nn

        class Regressor(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.Linear(4, 1)
                self.calls = 0

            def forward(self, x: Any, labels: Any) -> dict[str, Any]:
                self.calls += 1
                if self.calls == fail_at:
                    raise RuntimeError("boom")
                return {"loss": nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)}

        return Regressor()


class _Rows:
    """12 rows of 4 features; the ``fail_at``-th read raises (if given)."""

    def __init__(self, torch: ModuleType, fail_at: int | None = None) -> None:
        self.x, self.y = torch.ones(12, 4), torch.zeros(12)
        self.fail_at, self.reads = fail_at, 0

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.reads += 1
        if self.reads == self.fail_at:
            raise KeyError(i)
        return {"x": self.x[i], "labels": self.y[i]}


@pytest.mark.parametrize("added", ["constructor", "add_callback"])
def test_hf_training_that_raises_in_the_model_leaves_nothing(hf, torch, tmp_path, added,
                                                              untouched):
    from tracetorch.integrations.huggingface import TracetorchCallback

    callback = TracetorchCallback(print_report=False)
    model = _Regressor.make(torch, fail_at=3)
    trainer = hf.Trainer(model=model, args=_hf_args(hf, tmp_path), train_dataset=_Rows(torch),
                         callbacks=[callback] if added == "constructor" else None)
    if added == "add_callback":
        trainer.add_callback(callback)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert not callback.running
    assert callback.profile.step_count == 2  # two optimizer steps before the third forward
    assert callback.profile.find("lin").calls == 2
    assert callback.profile.find("").errors == 1
    assert "training_step" not in vars(trainer)  # the run's guard removed again


def test_hf_training_that_raises_outside_the_step_leaves_nothing(hf, torch, tmp_path,
                                                                 untouched):
    from tracetorch.integrations.huggingface import TracetorchCallback

    callback = TracetorchCallback(print_report=False)
    trainer = hf.Trainer(model=_Regressor.make(torch), args=_hf_args(hf, tmp_path),
                         train_dataset=_Rows(torch, fail_at=6), callbacks=[callback])
    with pytest.raises(KeyError):  # the third batch's second row: raised by the data loader
        trainer.train()
    assert not callback.running
    # Raised between steps (where the loader prefetches depends on accelerate): every step
    # that started finished, with its one forward call.
    assert callback.profile.find("lin").calls == callback.profile.step_count >= 1
    trainer.train_dataset = _Rows(torch)
    trainer.train()  # the trainer trains again, profiled afresh
    assert callback.profile.step_count == 4
    assert callback.profile.find("lin").calls == 4


def test_hf_mixed_precision_forward_keeps_the_model_and_its_paths(hf, torch, tmp_path,
                                                                   untouched):
    # bf16 makes accelerate set the model's forward on the instance (its autocast wrapped in
    # convert_outputs_to_fp32), so the class's forward, which the profile wraps, never runs.
    from tracetorch.engine.patches import is_instrumented
    from tracetorch.integrations.huggingface import TracetorchCallback

    callback = TracetorchCallback(print_report=False)
    model = _Regressor.make(torch)
    trainer = hf.Trainer(model=model, args=_hf_args(hf, tmp_path, bf16=True),
                         train_dataset=_Rows(torch), callbacks=[callback])
    trainer.train()
    prof = callback.profile
    assert [(n.path, n.depth, n.calls) for n in prof.nodes() if n.kind == "module"] == [
        ("", 1, 4), ("lin", 2, 4)]  # the model's call, its layer inside it
    forward = vars(model)["forward"]
    assert "convert_outputs_to_fp32" in forward.__qualname__ and not is_instrumented(forward)


# ---------------------------------------------------------------------------- Lightning
def _module(prof: Any, path: str) -> Any:
    """A module's row over every call site (Lightning calls the model below ``SGD.step``)."""
    rows = [row for key, row in prof.by_module().items() if key.split(".")[-len(
        path.split(".")):] == path.split(".")]
    assert len(rows) == 1, list(prof.by_module())
    return rows[0]


def _lightning_module(pl: ModuleType, torch: ModuleType, fail_at: int | None = None) -> Any:
    nn = torch.nn

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def forward(self, x: Any) -> Any:
            return self.net(x)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if batch_idx == fail_at:
                raise RuntimeError("boom")
            x, y = batch
            return nn.functional.mse_loss(self(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny()


def _loader(torch: ModuleType) -> Any:
    data = torch.utils.data.TensorDataset(torch.ones(32, 8), torch.zeros(32, 1))
    return torch.utils.data.DataLoader(data, batch_size=4)


def _fit(trainer_module: ModuleType, module: Any, loader: Any, callback: Any,
         **extra: Any) -> Any:
    trainer = trainer_module.Trainer(
        max_steps=4, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback], **extra)
    trainer.fit(module, loader)
    return trainer


def test_lightning_profiles_optimizer_steps_with_a_schedule(pl, torch, capsys, untouched):
    from tracetorch.integrations.lightning import TracetorchCallback

    callback = TracetorchCallback(SCHEDULE)
    trainer = _fit(pl, _lightning_module(pl, torch), _loader(torch), callback,
                   accumulate_grad_batches=ACCUMULATE)

    prof = callback.profile
    assert prof.step_count == trainer.global_step == 4
    assert prof.step_times.count == ACTIVE
    forwards = ACTIVE * ACCUMULATE
    # Lightning runs an optimizer step's last forward and backward inside `optimizer.step`
    # (its closure): the module is one row over both call sites.
    first = _module(prof, "net.0")
    assert first.calls == forwards
    assert first.flops == forwards * _linear_flops(4, 8, 16)
    assert prof.find("SGD.step").calls == ACTIVE
    assert prof.find("SGD.step.backward").calls + prof.find("backward").calls == forwards
    assert "SGD.step" in capsys.readouterr().out


def test_lightning_training_that_raises_leaves_nothing(pl, torch, untouched):
    from tracetorch.integrations.lightning import TracetorchCallback

    callback = TracetorchCallback(print_report=False)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(pl, _lightning_module(pl, torch, fail_at=2), _loader(torch), callback)
    assert not callback.running
    assert callback.profile.step_count == 2
    assert _module(callback.profile, "net.0").calls == 2


def test_pytorch_lightning_has_its_own_callback(torch, untouched):
    legacy = _require("pytorch_lightning")
    from tracetorch.integrations.pytorch_lightning import TracetorchCallback

    callback = TracetorchCallback(print_report=False)
    _fit(legacy, _lightning_module(legacy, torch), _loader(torch), callback)
    assert callback.profile.step_count == 4
    assert _module(callback.profile, "net.2").flops == 4 * _linear_flops(4, 16, 1)


# ---------------------------------------------------------------------------- the common part
def test_a_process_group_gathers_to_a_merged_report(torch, capsys, untouched):
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Linear(3, 2)
        callback = ProfilingCallback()
        callback.start(model)
        for _ in range(3):
            model(torch.ones(5, 3)).sum().backward()
            callback.step()
        prof = callback.finish()
    finally:
        dist.destroy_process_group()
    assert prof.merged is not None and prof.merged.find("").calls == 3
    assert "Ranks: 1 of 1" in capsys.readouterr().out


def test_a_stale_run_is_closed_when_the_next_starts(torch, untouched):
    callback = ProfilingCallback(print_report=False)
    callback.start(torch.nn.Linear(2, 2))
    first = callback.profile
    callback.start(torch.nn.Linear(2, 2))
    assert not first.running and callback.profile is not first
    callback.close()
    assert callback.close() is callback.profile  # closing twice is harmless


@pytest.mark.parametrize("kwargs,message", [
    ({"schedule": 3}, "schedule must be a tracetorch.schedule"),
    ({"model": object()}, "unknown option.*model"),
    ({"output": 3}, "output must be a path"),
    ({"gather": 1.5}, "gather must be"),
])
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(TypeError, match=message):
        ProfilingCallback(**kwargs)


@pytest.mark.slow
def test_importing_the_integrations_imports_no_framework():
    code = ("import sys, tracetorch, tracetorch.integrations; print(sorted(m for m in "
            "('torch', 'transformers', 'lightning', 'pytorch_lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "[]"
