"""Run by tests/test_install.py in a virtual environment where the nczmap wheel and xarray are installed:
opens each dataset the spec (a JSON file, the first argument) names with ``xr.open_dataset(url,
engine="nczmap")``, compares its variables with the values given, or checks that a dataset needing an
extra not installed is refused with one line naming it; then, if asked, plots a field to a PNG through
matplotlib. Prints nothing when everything is as expected (the test asserts an empty standard error)."""

from __future__ import annotations

import json
import sys

import numpy as np
import xarray as xr

from nczmap.errors import NCZError


def main() -> int:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    failures = []
    for case in spec["datasets"]:
        url, options = case["url"], case.get("options", {})
        try:
            with xr.open_dataset(url, engine="nczmap", **options) as ds:
                ds.load()
                for name, expected in case.get("values", {}).items():
                    got = ds[name].values
                    if not np.array_equal(got, np.asarray(expected), equal_nan=True):
                        failures.append(f"{url}: {name} is {got.tolist()}, not {expected}")
                if case.get("plot"):
                    import matplotlib

                    matplotlib.use("Agg")
                    import matplotlib.pyplot as plt

                    fig, ax = plt.subplots()
                    ds[case["plot"]["variable"]].isel(time=-1).plot(ax=ax)
                    fig.savefig(case["plot"]["png"])
                    plt.close(fig)
            if "needs" in case:
                failures.append(f"{url}: opened, though nczmap[{case['needs']}] is not installed")
        except NCZError as exc:
            text = str(exc)
            wanted = f"pip install 'nczmap[{case['needs']}]'" if "needs" in case else None
            if wanted is None or wanted not in text or "\n" in text:
                failures.append(f"{url}: {type(exc).__name__}: {text}")
        except Exception as exc:  # anything else is a failure, reported in full
            import traceback

            failures.append(f"{url}: {''.join(traceback.format_exception(exc))}")
    for failure in failures:
        print(failure)  # on standard output: standard error is kept for warnings
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
