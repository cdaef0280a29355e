#!/usr/bin/env bash
# Set up nczmap, write a small NCZarr example dataset, and look at it with the nczmap tools.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out=example
.venv/bin/python examples/make_example.py "$out"
url="file://$PWD/$out/obs.zip#mode=nczarr,zip"
echo; echo "\$ nczmap search '$url'"
.venv/bin/nczmap search "$url"
echo; echo "\$ nczmap search '$url' /v"
.venv/bin/nczmap search "$url" /v
echo; echo "\$ nczmap dump -t int $out/obs.file"
.venv/bin/nczmap dump -t int "$out/obs.file"
