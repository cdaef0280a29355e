#!/usr/bin/env bash
# Set up nczmap, then show what it does on a small collection in example/: virtualize netCDF-4 files and COGs
# without copying them, open them with xarray, write NCZarr that netcdf-c 4.9.0 reads, and plot a field.
# Each step is printed as you would type it ($ in a shell with .venv/bin on PATH, >>> at the Python prompt).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" MPLBACKEND=Agg
out=example
rm -rf "$out"
step() { echo; echo "== $*"; }
quote() { case $1 in *[\ \*\?\[\#\&]*) echo "'$1'" ;; *) echo "$1" ;; esac; }
show() { local words=() w; for w in "$@"; do words+=("$(quote "$w")"); done; echo "\$ ${words[*]}"; "$@"; }

step "1. A small collection: 5 daily netCDF-4 files and 3 daily COGs of sea surface temperature"
show python examples/make_example.py "$out"

step "2. Virtualize each into one dataset: a manifest of byte-range references, no data copied"
show nczmap virtualize "$out/daily/*.nc" "$out/daily.json" --concat time
show nczmap virtualize "$out/cog/*.tif" "$out/cogs.parq" --new-dim time=%Y%m%d
show du -sh "$out/daily" "$out/daily.json" "$out/cog" "$out/cogs.parq"

python examples/explore.py "$out"  # steps 3 to 5, at the Python prompt

step "6. netcdf-c's own ncdump reads the directory store; nczmap's ncdump prints the zip's header the same"
dir="file://$PWD/$out/sst.file#mode=nczarr,file" zip="file://$PWD/$out/sst.zip#mode=nczarr,zip"
if command -v ncdump >/dev/null 2>&1; then
  show ncdump -h "$dir"
  echo "\$ nczmap ncdump -h '$zip' | diff - <(ncdump -h '$dir') && echo same"
  nczmap ncdump -h "$zip" | diff - <(ncdump -h "$dir") && echo same
else
  echo "(netcdf-c's ncdump is not installed: scripts/setup.sh installs Debian's netcdf-bin where it can)"
  show nczmap ncdump -h "$zip"
fi
echo; echo "The plot: $out/sst.png"
