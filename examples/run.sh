#!/usr/bin/env bash
# Set up nczmap, write a small NCZarr example dataset, and look at it with the nczmap tools.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=example
rm -rf "$out"
.venv/bin/python examples/make_example.py "$out"
url="file://$PWD/$out/obs.zip#mode=nczarr,zip"
show() { echo; echo "\$ nczmap $*"; .venv/bin/nczmap "$@"; }
show ncdump "$url"
show search "$url"
show dump -t int "$out/obs.file"
show copy "$url" "$out/for-netcdf-4.9.0.file" --netcdf-version 4.9.0
if command -v ncdump >/dev/null 2>&1; then
  echo; echo "\$ ncdump file://$PWD/$out/for-netcdf-4.9.0.file#mode=nczarr,file   (netcdf-c's own ncdump)"
  ncdump "file://$PWD/$out/for-netcdf-4.9.0.file#mode=nczarr,file"
fi
