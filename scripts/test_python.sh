#!/usr/bin/env bash
# The PyTorch integration's CPU tests: installs torch 2.11 and the test dependencies into the
# project's .venv if missing, builds and installs teraio there (`pip install .`), runs tests/python
# with pytest (about 5 s of tests after a build of a few minutes on 2 cores). PYTHON=... runs them
# with another interpreter (scripts/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_torch.sh
source scripts/venv.sh
cd tests/python
exec "$PY" -m pytest -q .
