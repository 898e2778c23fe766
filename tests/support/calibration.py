"""A fake calibration for command-line tests: no matmul is timed, each measurement returns the
given peaks and is remembered with the facts it was asked for, in a fresh cache."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tracetorch
from tracetorch.tools import calibrate as calibration


def fake_measurements(monkeypatch: pytest.MonkeyPatch, cache: Path, peak_flops: float,
                      bandwidth: float) -> list[dict[str, Any]]:
    """Replace the measurement; the list of the facts each measurement was asked for."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    asked: list[dict[str, Any]] = []

    def measure(facts: dict[str, Any]) -> tracetorch.Machine:
        asked.append(facts)
        return tracetorch.Machine(peak_flops, bandwidth, 5_000, source="measured now",
                                  facts=facts)

    monkeypatch.setattr(calibration, "measure", measure)
    return asked
