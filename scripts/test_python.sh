#!/usr/bin/env bash
# The PyTorch integration's CPU tests: installs torch 2.11 and the test dependencies if missing,
# builds and installs teraio (`pip install .`), runs tests/python with pytest (about 5 s of tests
# after a build of a few minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_torch.sh
cd tests/python
exec "${PYTHON:-python3}" -m pytest -q .
