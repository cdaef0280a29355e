#!/usr/bin/env bash
# Installs what nczmap's tests and examples need: Debian's netcdf-bin (real ncgen/ncdump), zip/unzip, and a
# virtual environment in .venv with nczmap and its test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v ncdump >/dev/null 2>&1 || missing+=(netcdf-bin)
command -v zip >/dev/null 2>&1 || missing+=(zip)
command -v unzip >/dev/null 2>&1 || missing+=(unzip)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else sudo="none"; fi
  if [ "$sudo" = none ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: cannot install ${missing[*]} (no apt-get or no root): tests needing them will be skipped" >&2
  else
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

# Python 3.12 or later: current zarr, VirtualiZarr and Icechunk need it (.python-version picks pyenv's).
python=${PYTHON:-python3}
newer() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
if ! newer "$python"; then
  for candidate in python3.12 python3.13 "$HOME/.pyenv/versions/3.12.1/bin/python"; do
    if command -v "$candidate" >/dev/null 2>&1 && newer "$candidate"; then python=$candidate; break; fi
  done
fi
newer "$python" || { echo "setup: nczmap's tests need Python 3.12 or later (found $("$python" -V 2>&1))" >&2; exit 1; }
if [ -x .venv/bin/python ] && ! newer .venv/bin/python; then rm -rf .venv; fi  # an older Python's venv
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
