"""examples/train_cnn.py trains: run it as a script and check that the loss falls."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_train_cnn_loss_falls():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_cnn.py"), "--epochs", "3"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    losses = [float(v) for v in re.findall(r"^epoch \d+/\d+\s+loss ([0-9.]+)", result.stdout, re.M)]
    assert len(losses) == 3, result.stdout
    assert losses[-1] < losses[0], result.stdout


def test_build_model_is_importable():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_cnn
    finally:
        sys.path.remove(str(ROOT / "examples"))
    model = train_cnn.build_model()
    images, labels = train_cnn.make_dataset(8)
    assert model(images).shape == (8, 4)
    assert labels.shape == (8,)
