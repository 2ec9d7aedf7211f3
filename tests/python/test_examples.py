"""The Python examples (examples/*.py) run on CPU with tiny settings, so that they do not rot: each
trains, offloads (the budget is below its training state) and prints the Session's stats."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def run_example(name, *args):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def offloaded(text):
    found = [int(x) for x in re.findall(r"bytes_offloaded (\d+)", text)]
    assert found, text
    return found


def test_plain_loop(tmp_path):
    text = run_example("plain_loop.py", "--steps", "4", "--hidden", "64", "--layers", "1",
                       "--seq", "16", "--tier-dir", str(tmp_path))
    assert "teraio: mode planned, 4 steps" in text, text
    assert all(b > 0 for b in offloaded(text)), text
    assert [f for f in os.listdir(tmp_path) if f != "model.pt"] == []  # tier files removed


def test_hf_trainer(tmp_path):
    pytest.importorskip("accelerate")
    text = run_example("hf_trainer.py", "--steps", "4", "--hidden", "64", "--layers", "1",
                       "--seq", "16", "--output-dir", str(tmp_path))
    assert all(b > 0 for b in offloaded(text)) and len(offloaded(text)) == 2, text
    run = re.search(r"run: losses of steps 1-4: \[(.*)\]", text).group(1).split(", ")
    resumed = re.search(r"resumed: losses of steps 3-4: \[(.*)\]", text).group(1).split(", ")
    assert run[2:] == resumed, text  # resumed from the mid-run checkpoint: the same losses
    assert "tier directory after training: []" in text, text
