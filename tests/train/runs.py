"""The reports of teraio-train runs (docs/train.md) as tests/train/train_check.sh compares them."""
import json


def load(work, name):
    """The report `name`.json in the check's work directory."""
    with open(f"{work}/{name}.json") as f:
        return json.load(f)


def same_falling_losses(run, plain):
    """The run's losses are bitwise those of the plain run (what teraio changes moves bytes, never
    the numbers), and they fall. Returns the run's loss history."""
    hist = run["loss"]["history"]
    assert hist == plain["loss"]["history"], (hist, plain["loss"]["history"])
    assert hist[-1] < hist[0] - 0.5, f"loss did not fall: {hist}"
    return hist
