# shellcheck shell=bash
# Sourced by the scripts that run Python: sets PY to the interpreter of the project's virtual
# environment, .venv/ at the repository root, and puts .venv/bin first on PATH, so that python3,
# pip and CMake's FindPython3 in these scripts and in the tests they run all mean that interpreter.
# Why a venv: the distribution's Python is EXTERNALLY-MANAGED (PEP 668), pip refuses to install
# into it, and whatever python3 comes first on PATH (pyenv, conda) must not decide what is built.
# .venv/ is made once with the distribution's /usr/bin/python3 and its python3-venv package
# (scripts/bootstrap.sh installs both) and reused after; one that no longer runs (its base Python
# was upgraded away) is made again. PYTHON=/path/to/python3 uses that interpreter instead, as it is
# (it must let pip install into it); PATH is then left alone.

if [[ -n "${PYTHON:-}" ]]; then
  PY=$PYTHON
  if ! "$PY" -c 'import sys' 2>/dev/null; then
    echo "venv: PYTHON=$PYTHON does not run; unset PYTHON to use the project's .venv" >&2
    return 1
  fi
else
  TERAIO_VENV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv"
  PY="$TERAIO_VENV/bin/python3"
  if ! "$PY" -c 'import pip' 2>/dev/null; then
    base=/usr/bin/python3
    if [[ ! -x $base ]]; then
      echo "venv: the distribution's Python ($base) is not installed; run scripts/bootstrap.sh" \
           "as root (it installs python3-venv), or set PYTHON=/path/to/python3" >&2
      return 1
    fi
    if [[ -e $TERAIO_VENV ]]; then
      echo "venv: $TERAIO_VENV does not run (its Python changed?); making it again"
      rm -rf "$TERAIO_VENV"
    fi
    echo "venv: creating $TERAIO_VENV with $base ($("$base" --version 2>&1))"
    if ! "$base" -m venv "$TERAIO_VENV" >/dev/null 2>&1; then
      rm -rf "$TERAIO_VENV"
      echo "venv: '$base -m venv' failed: the python3-venv package is missing; run" \
           "scripts/bootstrap.sh as root, or as root: apt-get install python3-venv" >&2
      return 1
    fi
  fi
  export VIRTUAL_ENV=$TERAIO_VENV
  [[ $PATH == "$TERAIO_VENV/bin:"* ]] || export PATH="$TERAIO_VENV/bin:$PATH"
  unset PYTHONHOME
fi
