#!/usr/bin/env bash
# Installs what teraio needs on a fresh Debian/Ubuntu machine. Idempotent: installs only what is
# missing, so running it again costs a second. docs/dependencies.md says why each package is here.
# Installing needs root, or sudo; without either it names the missing packages and stops.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git xz-utils
  libfmt-dev libsimdjson-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  liburing-dev libglpk-dev libxxhash-dev
  clang libclang-rt-14-dev
  chromium
  python3-venv python3-dev
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "bootstrap: these Debian packages are missing: ${missing[*]}" >&2
      echo "bootstrap: installing them needs root; as root run: apt-get install ${missing[*]}" >&2
      exit 1
    fi
    SUDO=(sudo)
  fi
  echo "bootstrap: installing ${missing[*]}"
  "${SUDO[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "bootstrap: system packages ready"
