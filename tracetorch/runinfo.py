"""What a profile notes about its run, in ``meta``: when, how it was started, on what.

:func:`run_facts` gives the date (local time with its UTC offset), the command line, the Python,
numpy, tracetorch (and torch) versions, the platform, and the framework, device, CPU and thread
count as :func:`tracetorch.analysis.calibrate.machine_facts` states them for calibrations (the
host name is left out: a profile is shared more often than a calibration cache). torch is only
looked at when the program has imported it; then ``device`` is ``cuda`` once CUDA is
initialised. A profile records these once, the first time it closes, so they describe the run
and reports (the HTML page's header and Run table) can show them.

Example:
    >>> facts = run_facts()
    >>> sorted(facts["versions"])[:2], facts["device"] in ("cpu", "cuda")
    (['numpy', 'python'], True)
"""
from __future__ import annotations

import platform
import shlex
import sys
from datetime import datetime, timezone
from typing import Any

import numpy as np

from tracetorch.analysis.calibrate import machine_facts

__all__ = ("run_facts",)


def run_facts() -> dict[str, Any]:
    """The date, command line, versions, platform, framework, device, cpu and threads of this
    process, JSON-ready (see the module docstring).

    Example:
        >>> run_facts()["framework"] in ("numpy", "torch")
        True
    """
    from tracetorch import __version__  # the package imports this module while it loads

    torch = sys.modules.get("torch")  # never imported here: only seen if the program did
    framework = "torch" if torch is not None else "numpy"
    device = "cuda" if torch is not None and torch.cuda.is_initialized() else "cpu"
    facts = machine_facts(framework, device)
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "tracetorch": __version__}
    if torch is not None:
        versions["torch"] = str(torch.__version__)
    return {
        "date": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv),
        "versions": versions,
        # Not platform.platform(): it asks `uname -p` in a subprocess for the processor.
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        **{k: v for k, v in facts.items() if k not in ("host", "dtype")},
    }
