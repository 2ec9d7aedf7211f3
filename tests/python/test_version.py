"""The version is written once, in VERSION at the repository root: the installed package's metadata
(setup.py) and the compiled extension (`teraio.__version__`) must both say it."""
import importlib.metadata
import os

import teraio

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def test_version_is_the_version_file():
    with open(os.path.join(ROOT, "VERSION")) as f:
        want = f.readline().strip()
    assert teraio.__version__ == want
    assert importlib.metadata.version("teraio") == want
