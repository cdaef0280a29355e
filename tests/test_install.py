"""The first minute of a pip install: the wheel built from this checkout, installed in a fresh virtual
environment with its base dependencies only, then with each user-facing extra added in turn (netcdf4,
virtual, icechunk, plot: one environment, extras installed incrementally, the base state checked before
any). In each state every command runs on small inputs (an NCZarr store the installed package itself
writes, netCDF-4, netCDF-3, TIFF and GRIB2 files this process writes): what the installed extras allow must
succeed with nothing at all on standard error (numcodecs' crc32c deprecation warning was printed by every
command of a plain install), and what needs an extra not installed must fail with one line naming it.
The xarray engine is checked where xarray is installed: xarray is no dependency of nczmap, so plain
``xarray`` is installed for it, last into the environment with every extra, and into a second fresh
environment with the base dependencies only.

pip installs from the package indexes it is configured with (and its cache); the test is skipped only when
pip reaches no index at all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)  # not the venv's: a venv of its own
EXTRAS = ("netcdf4", "virtual", "icechunk", "plot")
PIP_TIMEOUT = 900  # one install; the whole test takes a few minutes with a warm pip cache


def _version() -> str:
    text = (REPO / "nczmap" / "_version.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


# ------------------------------------------------------------------------------------- environments
def _environ(venv: Path | None = None) -> dict[str, str]:
    """The environment a user of ``venv`` has: its bin first on PATH, nothing of this test's venv, no
    warning filters of its own, no user site-packages."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONWARNINGS", "PYTHONSTARTUP")
        and not name.startswith(("PYTHONDEV", "PYTEST"))
    }
    ours = str(Path(sys.prefix) / "bin")
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
    if venv is not None:
        path.insert(0, str(venv / "bin"))
    env["PATH"] = os.pathsep.join(path)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(args, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _pip_reaches_an_index(work: Path) -> str | None:
    """None when pip finds numpy on some index it is configured with; else why not (asked once, without
    retries, so a machine without a network says so in seconds)."""
    args = [sys.executable, "-m", "pip", "index", "versions", "numpy", "--retries", "0", "--timeout", "10"]
    try:
        done = _run(args, work, _environ(), timeout=90)
    except subprocess.TimeoutExpired:
        return "pip index versions numpy took more than 90 s"
    if done.returncode == 0 and "Available versions" in done.stdout:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"pip exited with {done.returncode}"


def _pip_install(venv: Path, *requirements: str, work: Path) -> float:
    start = time.monotonic()
    args = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = _run([*args, *requirements], work, _environ(venv), timeout=PIP_TIMEOUT)
    if done.returncode != 0:
        pytest.fail(
            f"pip install {' '.join(requirements)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return time.monotonic() - start


def _new_venv(path: Path, work: Path) -> Path:
    done = _run([BASE_PYTHON, "-m", "venv", path], work, _environ(), timeout=120)
    assert done.returncode == 0, done.stderr
    return path


# --------------------------------------------------------------------------------------------- inputs
STORE_SCRIPT = """
import sys
import nczmap
with nczmap.create_dataset(sys.argv[1]) as ds:
    ds.create_dimension("x", 3)
    v = ds.create_variable("v", ("x",), "i4", fill_value=-1, compression="zlib")
    v.attrs["units"] = "m"
    v[:2] = [1, 2]
"""

SST = [np.random.default_rng(day).random((2, 512), dtype="f4") for day in range(2)]  # referenced, not inlined


def _write_sources(inputs: Path) -> None:
    """netCDF-4 (two days to join along time), netCDF-3, TIFF and GRIB2 files, written here (this test's
    own environment has every library), and a Parquet manifest and a GRIB2 manifest written by the
    checkout's nczmap for the environments that cannot write them."""
    netCDF4 = pytest.importorskip("netCDF4")
    tifffile = pytest.importorskip("tifffile")
    inputs.mkdir()
    for day, name in enumerate(("a.nc", "b.nc")):
        with netCDF4.Dataset(inputs / name, "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("x", 512)
            t = ds.createVariable("time", "f8", ("time",))
            t.units = "days since 2000-01-01"
            t[:] = [2 * day, 2 * day + 1]
            v = ds.createVariable("sst", "f4", ("time", "x"), zlib=True)
            v.units = "K"
            v[:] = SST[day]
    with netCDF4.Dataset(inputs / "c3.nc", "w", format="NETCDF3_CLASSIC") as ds:
        ds.createDimension("x", 4)
        ds.createVariable("h", "i2", ("x",))[:] = [1, 2, 3, 4]
    tifffile.imwrite(inputs / "t.tif", np.arange(64, dtype="u1").reshape(8, 8))
    pytest.importorskip("eccodes")
    import grib_samples

    grib_samples.pressure_levels(inputs / "g.grib2", steps=(0,), levels=(500,), names=("t",))

    from nczmap.integrations.virtualize import virtualize

    virtualize([str(inputs / "a.nc"), str(inputs / "b.nc")], str(inputs / "m.parq"), concat="time")
    virtualize([str(inputs / "a.nc"), str(inputs / "b.nc")], str(inputs / "m.json"), concat="time")
    virtualize([str(inputs / "g.grib2")], str(inputs / "g.json"))


# ------------------------------------------------------------------------------------------- commands
@dataclass
class Step:
    args: list[str]
    needs: frozenset[str] = frozenset()  # the extras this step needs (those of the steps before it too)
    contains: tuple[str, ...] = ()  # text its standard output must hold
    same_as: str | None = None  # a step (by label) whose output this one's equals, past the netcdf line
    label: str | None = None


def _chains(w: Path, store: str, inputs: Path) -> list[list[Step]]:
    """Every command on the inputs copied into ``w``: lists of steps, each step using what the ones
    before it in its list made."""
    v, i, n = frozenset({"virtual"}), frozenset({"icechunk"}), frozenset({"netcdf4"})

    def manifest(name: str, where: Path = w) -> str:
        return f"file://{where}/{name}#mode=nczarr,manifest"

    def repo(name: str) -> str:
        return f"file://{w}/{name}#mode=icechunk"

    commands = ("search", "dump", "copy", "ncdump", "virtualize")
    chains: list[list[Step]] = [
        [Step(["--help"], contains=commands)],
        [Step(["--version"], contains=(f"nczmap {_version()}",))],
        *[[Step([c, "--help"], contains=("usage: nczmap " + c,))] for c in commands],
        # the store the installed package wrote
        [Step(["search", store], contains=(".zgroup", "v"))],
        [Step(["search", store, "v"], contains=(".zarray",))],
        [Step(["dump", store], contains=("/v/.zarray",))],
        [Step(["dump", "-t", "int", store], contains=("(int)",))],
        [Step(["ncdump", "-h", "-s", store], contains=("_Storage",))],
        [
            Step(["ncdump", store], contains=("v = 1, 2, _ ;",), label="store"),
            Step(["copy", "-q", store, w / "s.zip"]),
            Step(["ncdump", w / "s.zip"], same_as="store"),
            Step(["copy", "-q", store, f"file://{w}/z.file#mode=zarr,file"]),
            Step(["ncdump", f"file://{w}/z.file#mode=zarr,file"], same_as="store"),
            Step(["virtualize", f"{w}/s.file", w / "s.json"]),
            Step(["ncdump", manifest("s.json")], same_as="store"),
            Step(["copy", "-q", store, repo("srepo")], needs=i),
            Step(["ncdump", repo("srepo")], same_as="store"),
            Step(["search", repo("srepo")], contains=("v",)),
        ],
        # netCDF-3 and TIFF: read by nczmap's own parsers
        [
            Step(["ncdump", w / "c3.nc"], contains=("h = 1, 2, 3, 4 ;",), label="c3"),
            Step(["virtualize", w / "c3.nc", w / "c3.json"]),
            Step(["ncdump", manifest("c3.json")], same_as="c3"),
            Step(["copy", "-q", manifest("c3.json"), w / "c3.zip"]),
            Step(["ncdump", w / "c3.zip"], same_as="c3"),
            Step(["copy", "-q", manifest("c3.json"), repo("c3repo")], needs=i),
            Step(["ncdump", "--allow", w, repo("c3repo")], same_as="c3"),
        ],
        [
            Step(["ncdump", w / "t.tif"], label="tif"),
            Step(["virtualize", w / "t.tif", w / "t.json"]),
            Step(["ncdump", manifest("t.json")], same_as="tif"),
        ],
        # netCDF-4: written to stores through netCDF4-python, virtualized through h5py
        [
            Step(["copy", "-q", w / "a.nc", w / "a.zip"], needs=n),
            Step(["ncdump", w / "a.zip"], contains=("time = 0, 1 ;",)),
        ],
        [Step(["ncdump", "-h", "-s", w / "a.nc"], needs=v, contains=('sst:_Storage = "chunked" ;',))],
        [
            Step(["ncdump", w / "a.nc"], needs=v, contains=("time = 0, 1 ;",)),
            Step(["virtualize", w / "a.nc", w / "b.nc", w / "ab.json", "--concat", "time"]),
            Step(["ncdump", manifest("ab.json")], contains=("time = 0, 1, 2, 3 ;",), label="ab"),
            Step(["search", manifest("ab.json"), "sst"], contains=(".zarray",)),
            Step(["dump", "-H", manifest("ab.json")], contains=("/sst/.zarray",)),
            Step(["copy", "-q", manifest("ab.json"), w / "ab.zip"]),
            Step(["ncdump", w / "ab.zip"], same_as="ab"),
            Step(["virtualize", w / "a.nc", w / "b.nc", w / "ab.parq", "--concat", "time"]),
            Step(["ncdump", manifest("ab.parq")], same_as="ab"),
        ],
        [
            Step(["ncdump", manifest("m.parq", inputs)], needs=v, contains=("time = 0, 1, 2, 3 ;",))
        ],  # Parquet written elsewhere
        [
            Step(["ncdump", "-h", w / "g.grib2"], needs=v, contains=("t(",), label="grib"),
            Step(["virtualize", w / "g.grib2", w / "g.json"]),
            Step(["ncdump", "-h", manifest("g.json")], same_as="grib"),
            Step(["ncdump", manifest("g.json")], contains=("data:",)),
        ],
        [Step(["ncdump", manifest("g.json", inputs)], needs=v)],  # GRIB2 references written elsewhere
        # Icechunk repositories
        [
            Step(["virtualize", w / "a.nc", w / "b.nc", repo("vrepo"), "--concat", "time"], needs=v | i),
            Step(["ncdump", "--allow", w, repo("vrepo")], contains=("time = 0, 1, 2, 3 ;",)),  # pure Zarr v3
        ],
    ]
    return chains


def _check_state(venv: Path, w: Path, inputs: Path, installed: frozenset[str], outputs: dict) -> list[str]:
    """Every command in the state ``installed`` (the extras in ``venv``), in ``w``; the problems found."""
    w.mkdir()
    for entry in inputs.iterdir():  # the source files, beside the manifests made of them
        if entry.suffix in (".nc", ".tif", ".grib2"):
            shutil.copy2(entry, w / entry.name)
    store = f"file://{w}/s.file#mode=nczarr,file"
    made = _run([venv / "bin" / "python", "-c", STORE_SCRIPT, store], w, _environ(venv))
    problems = []
    if made.returncode != 0 or made.stderr:
        return [f"writing the store with the installed package: {made.stderr}"]
    nczmap = venv / "bin" / "nczmap"
    env = _environ(venv)

    def run_chain(chain: list[Step]) -> None:
        needs: frozenset[str] = frozenset()
        for step in chain:
            needs = needs | step.needs
            done = _run([nczmap, *step.args], w, env)
            shown = "nczmap " + " ".join(str(a) for a in step.args)
            missing = needs - installed
            if missing:  # one line naming a missing extra; the rest of the chain needs what this made
                line = done.stderr
                named = [e for e in missing if f"pip install 'nczmap[{e}]'" in line]
                if (
                    done.returncode != 1
                    or not line.startswith("nczmap: error: ")
                    or line.count("\n") != 1
                    or not named
                ):
                    problems.append(
                        f"{shown}: without nczmap[{'/'.join(sorted(missing))}] it exited with "
                        f"{done.returncode}, standard error:\n{done.stderr}"
                    )
                break
            if done.returncode != 0 or done.stderr:
                problems.append(f"{shown}: exited with {done.returncode}, standard error:\n{done.stderr}")
                break
            absent = [text for text in step.contains if text not in done.stdout]
            if absent:
                problems.append(f"{shown}: its output lacks {absent}:\n{done.stdout[:2000]}")
            body = done.stdout.partition("\n")[2]  # past "netcdf NAME {"
            if step.same_as is not None and body != outputs[step.same_as]:  # a label of a step before
                problems.append(
                    f"{shown}: its output differs from {step.same_as}'s:\n{done.stdout[:2000]}\n"
                    f"---\n{outputs[step.same_as][:2000]}"
                )
            if step.label is not None:
                earlier = outputs.setdefault(step.label, body)  # the same in every state
                if earlier != body:
                    problems.append(f"{shown}: its output changed with nczmap[{','.join(sorted(installed))}]")

    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:  # the chains at once, one per core
        for finished in [pool.submit(run_chain, chain) for chain in _chains(w, store, inputs)]:
            finished.result()
    return problems


def _check_engine(venv: Path, w: Path, cases: list[dict], mplconfig: Path) -> str:
    """The xarray engine on ``cases`` (see install_engine_child.py); problems found, or ''."""
    spec = w / "engine.json"
    spec.write_text(json.dumps({"datasets": cases}))
    env = _environ(venv) | {"MPLCONFIGDIR": str(mplconfig)}
    done = _run([venv / "bin" / "python", HERE / "install_engine_child.py", spec], w, env)
    if done.returncode != 0 or done.stderr:
        return f"the xarray engine in {venv.name}: exited with {done.returncode}:\n{done.stdout}{done.stderr}"
    return ""


def _engine_cases(w: Path, inputs: Path, installed: frozenset[str]) -> list[dict]:
    """The store in ``w`` and the manifests of ``inputs`` (and, with icechunk, the repositories the
    commands made in ``w``) through the engine; those needing an extra not installed, refused."""
    sst = np.concatenate(SST).tolist()
    ab = {"time": [0, 1, 2, 3], "sst": sst}
    raw = {"decode_times": False}

    def case(url: str, values: dict, needs: str | None = None, **more) -> dict:
        if needs is not None and needs not in installed:
            return {"url": url, "needs": needs}
        return {"url": url, "values": values, **more}

    cases = [
        case(f"file://{w}/s.file#mode=nczarr,file", {"v": [1, 2, -1]}, options={"mask_and_scale": False}),
        case(f"file://{w}/s.file#mode=nczarr,file", {"v": [1, 2, np.nan]}),
        case(f"file://{inputs}/m.json#mode=nczarr,manifest", ab, options=raw),
        case(f"file://{inputs}/m.parq#mode=nczarr,manifest", ab, "virtual", options=raw),
        case(f"file://{inputs}/g.json#mode=nczarr,manifest", {}, "virtual"),
        case(f"file://{w}/srepo#mode=icechunk", {"v": [1, 2, np.nan]}, "icechunk"),
    ]
    if "icechunk" in installed and "virtual" in installed:
        grant = {"map_options": {"containers": [f"{w}/"]}}
        cases.append(case(f"file://{w}/vrepo#mode=icechunk", ab, options=raw | grant))
    if "plot" in installed:
        png = str(w / "sst.png")
        cases.append(
            case(f"file://{inputs}/m.json#mode=nczarr,manifest", {}, plot={"variable": "sst", "png": png})
        )
    return cases


# ----------------------------------------------------------------------------------------------- test
def test_wheel_installs_and_every_command_runs_quietly(tmp_path):
    """Build the wheel; in a fresh venv, base then each extra added: every command, no warning, and one
    line naming the extra a command needs; the xarray engine with plain xarray added, on top of every
    extra and in a second venv of the base dependencies only."""
    why = _pip_reaches_an_index(tmp_path)
    if why is not None:
        pytest.skip(f"pip reaches no package index to install the wheel's dependencies from: {why}")
    timings: dict[str, float] = {}
    start = time.monotonic()
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", REPO],
        tmp_path,
        _environ(),
        timeout=PIP_TIMEOUT,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (tmp_path / "dist").glob("nczmap-*.whl")
    timings["build the wheel"] = time.monotonic() - start

    inputs = tmp_path / "inputs"
    _write_sources(inputs)
    mplconfig = tmp_path / "mplconfig"

    start = time.monotonic()
    venv = _new_venv(tmp_path / "venv", tmp_path)
    _pip_install(venv, str(wheel), work=tmp_path)
    timings["venv + base install"] = time.monotonic() - start
    problems: list[str] = []
    outputs: dict[str, str] = {}
    installed: frozenset[str] = frozenset()
    states = [None, *EXTRAS]
    for extra in states:
        if extra is not None:
            start = time.monotonic()
            _pip_install(venv, f"{wheel}[{extra}]", work=tmp_path)
            timings[f"install [{extra}]"] = time.monotonic() - start
            installed = installed | {extra}
        start = time.monotonic()
        name = extra or "base"
        found = _check_state(venv, tmp_path / f"state-{name}", inputs, installed, outputs)
        problems += [f"[{name}] {p}" for p in found]
        timings[f"commands [{name}]"] = time.monotonic() - start
        if extra is None:  # the base state: xarray is not there, nor anything the extras bring
            listed = _run([venv / "bin" / "python", "-m", "pip", "list"], tmp_path, _environ(venv))
            for module in ("xarray", "h5py", "netCDF4", "pyarrow", "icechunk", "matplotlib", "eccodes"):
                assert f"\n{module.lower()} " not in listed.stdout.lower(), listed.stdout

    # the engine: plain xarray on top of every extra (matplotlib's plot included) ...
    start = time.monotonic()
    _pip_install(venv, "xarray", work=tmp_path)
    mpl = _environ(venv) | {"MPLCONFIGDIR": str(mplconfig)}
    _run([venv / "bin" / "python", "-c", "import matplotlib.pyplot"], tmp_path, mpl)  # its font cache, once
    w = tmp_path / "state-plot"
    problems.append(_check_engine(venv, w, _engine_cases(w, inputs, installed), mplconfig))
    if not (w / "sst.png").is_file():
        problems.append("the engine's plot made no PNG")
    timings["xarray + engine [all extras]"] = time.monotonic() - start

    # ... and on the base dependencies only
    start = time.monotonic()
    bare = _new_venv(tmp_path / "venv-xarray", tmp_path)
    _pip_install(bare, str(wheel), "xarray", work=tmp_path)
    w = tmp_path / "engine-base"
    w.mkdir()
    made = _run(
        [bare / "bin" / "python", "-c", STORE_SCRIPT, f"file://{w}/s.file#mode=nczarr,file"],
        w,
        _environ(bare),
    )
    assert made.returncode == 0 and not made.stderr, made.stderr
    problems.append(_check_engine(bare, w, _engine_cases(w, inputs, frozenset()), mplconfig))
    timings["venv + base + xarray + engine"] = time.monotonic() - start

    print("\n".join(f"{what}: {seconds:.1f} s" for what, seconds in timings.items()))
    problems = [p for p in problems if p]
    assert not problems, "\n\n".join(problems)
