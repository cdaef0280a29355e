"""Write a small NCZarr dataset into a zip archive and a directory with nczmap's dataset API.

The content is the worked example of the NCZarr format notes: dims x=2, y=3; int v(x, y) with a fill
value and a units attribute; subgroup g with double d(y).

    python examples/make_example.py OUTDIR
"""

from __future__ import annotations

import sys
from pathlib import Path

import nczmap


def write(url: str) -> None:
    with nczmap.create_dataset(url) as ds:
        ds.attrs["title"] = "nczmap example"
        ds.create_dimension("x", 2)
        ds.create_dimension("y", 3)
        v = ds.create_variable("v", ("x", "y"), "i4", fill_value=-1)
        v.attrs["units"] = "m"
        v[0, :] = [1, 2, 3]
        v[1, :2] = [4, 5]
        g = ds.create_group("g")
        g.create_variable("d", ("y",), "f8", data=[1.5, 2.5, 3.5])


def main(outdir: str) -> None:
    Path(outdir).mkdir(parents=True, exist_ok=True)
    for name in ("obs.zip", "obs.file"):
        path = Path(outdir, name).resolve()
        write(str(path))
        print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "example")
