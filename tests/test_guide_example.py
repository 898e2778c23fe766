"""The TinyTorch profiling guide's example, verbatim with ``tinytorch`` -> ``tracetorch``."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

GUIDE_EXAMPLE = '''\
from tracetorch.perf.profiling import Profiler
from tracetorch.core.layers import Linear
from tracetorch.core.tensor import Tensor
import numpy as np

# Initialize model and profiler

model = Linear(1024, 512)
profiler = Profiler()

# 1. Static analysis: parameter count and FLOPs

params = profiler.count_parameters(model)
print(f"Total parameters: {params:,}")

# For FLOPs, we use the internal helper (batch_size=1)

flops = profiler._count_linear_flops(model, input_shape=(1, 1024))
print(f"FLOPs per forward pass: {flops:,}")

# 2. Dynamic analysis: latency measurement

input_tensor = Tensor(np.random.randn(1, 1024))
avg_latency = profiler.measure_latency(
    model,
    input_tensor,
    warmup=5,
    iterations=100
)
print(f"Average latency: {avg_latency*1000:.3f} ms")
'''


@pytest.mark.slow
def test_guide_example_runs_as_a_script(tmp_path):
    script = tmp_path / "guide_example.py"
    script.write_text(GUIDE_EXAMPLE)
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "Total parameters: 524,800"
    assert lines[1] == "FLOPs per forward pass: 1,048,576"
    match = re.fullmatch(r"Average latency: (\d+\.\d{3}) ms", lines[2])
    assert match and 0 < float(match.group(1)) < 1000
