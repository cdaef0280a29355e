"""Opening a 1,000,000-reference manifest and serving its first chunk, in a fresh process each time.

nczmap on kerchunk Parquet (the scalable form) and on kerchunk JSON, beside fsspec's ReferenceFileSystem on
the same JSON. Each run is its own process, so time and peak RSS are the whole cost of that open; the time
is counted after the libraries are imported (numpy alone costs ~0.2 s here), and the RSS includes them.
Targets: Parquet open + first chunk ≤ 0.25 s and ≤ 150 MiB; the JSON form no slower than fsspec.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
which, path = sys.argv[1], sys.argv[2]
import numpy, nczmap, fsspec
from nczmap.zmap import manifest  # the driver's modules, imported before the clock starts
from nczmap.manifest import kerchunk_json, kerchunk_parquet
start = time.perf_counter()
if which == "fsspec":
    fs = fsspec.filesystem("reference", fo=path)
    data = fs.cat_file("v/0")
else:
    zmap = nczmap.open_map(path + "#mode=zarr,manifest", "r")
    data = zmap.read("/v/0")
seconds = time.perf_counter() - start
assert len(data) == 16 * 8, len(data)
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "rss": int(peak.split()[1]) * 1024}))
"""


def build(directory: Path, count: int) -> tuple[str, str]:
    """The same references as kerchunk JSON and as kerchunk Parquet (written by nczmap)."""
    import numpy as np

    from nczmap.manifest import kerchunk_json, kerchunk_parquet
    from nczmap.manifest.model import ArrayReferences

    data = directory / "data.bin"
    data.write_bytes(b"\0" * 16 * 8)
    zarray = {
        "zarr_format": 2,
        "shape": [count * 16],
        "chunks": [16],
        "dtype": "<f8",
        "compressor": None,
        "filters": None,
        "fill_value": None,
        "order": "C",
    }
    refs = {".zgroup": json.dumps({"zarr_format": 2}), "v/.zarray": json.dumps(zarray)}
    url = data.as_uri()
    refs.update({f"v/{i}": [url, 0, 128] for i in range(count)})
    json_path = directory / "refs.json"
    json_path.write_text(json.dumps({"version": 1, "refs": refs}))
    manifest = kerchunk_json.load(json_path.read_bytes(), "refs.json")
    table = ArrayReferences(
        (count,),
        [url],
        np.zeros(count, dtype=np.int32),
        np.zeros(count, dtype=np.int64),
        np.full(count, 128, dtype=np.int64),
    )
    for key in [k for k in manifest.entries if k.startswith("v/") and not k.endswith(".zarray")]:
        del manifest.entries[key]
    manifest.arrays["v"] = table
    parquet = directory / "refs.parq"

    def write(name: str, content: bytes) -> None:
        target = parquet / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)

    kerchunk_parquet.dump(manifest, write)
    return str(json_path), str(parquet)


def run(which: str, path: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, which, path], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def main() -> None:
    if sys.argv[1:2] == ["--build"]:
        print(*build(Path(sys.argv[2]), int(sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--references", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10,000 references, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.references, args.rounds = 10_000, 1
    with tempfile.TemporaryDirectory() as tmp:
        # built in a process of its own: children forked from a parent holding a million references
        # would start with its resident size
        built = subprocess.run(
            [sys.executable, __file__, "--build", tmp, str(args.references)],
            capture_output=True,
            text=True,
            check=True,
        )
        json_path, parquet_path = built.stdout.split()
        cases = {"nczmap parquet": ("nczmap", parquet_path), "nczmap JSON": ("nczmap", json_path)}
        cases["fsspec JSON"] = ("fsspec", json_path)
        results = {name: [run(*case) for _ in range(args.rounds)] for name, case in cases.items()}
    print(f"{args.references} references: open + first chunk in a fresh process (median of {args.rounds})")
    medians = {}
    for name, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        rss = statistics.median(r["rss"] for r in runs) / 2**20
        medians[name] = seconds
        print(f"  {name:16s} {seconds * 1000:8.0f} ms   peak RSS {rss:6.0f} MiB")
    parquet = results["nczmap parquet"]
    fast = statistics.median(r["seconds"] for r in parquet) <= 0.25
    small = statistics.median(r["rss"] for r in parquet) <= 150 * 2**20
    print(f"  parquet ≤ 0.25 s and ≤ 150 MiB: {'TARGET MET' if fast and small else 'TARGET MISSED'}")
    ratio = medians["fsspec JSON"] / medians["nczmap JSON"]
    verdict = "TARGET MET" if ratio >= 1 else "TARGET MISSED"
    print(f"  JSON load speed nczmap/fsspec   {ratio:6.2f}×  (target ≥ 1)  {verdict}")


if __name__ == "__main__":
    main()
