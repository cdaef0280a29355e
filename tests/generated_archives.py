"""Archives generated to vary every way real ones vary, built by nczmap and compared with an oracle.

An :class:`Archive` is a series of small netCDF-4 files joined along ``time``, as operational archives
write them: the time coordinate in any dtype and unit, its units shared by every file (values 0, 1, 2...
from one reference date), each file's own (``days since`` the file's first step) or mixed, whole or
fractional, in any CF calendar; bounds and climatology bounds with and without units of their own; 1-5
records a file; an unlimited or fixed ``time``; chunks that line up with the files or not; a data variable
plain, packed alike in every file, packed differently a file, with ``missing_value`` or ``_Unsigned``;
dtypes differing between files; a variable in a group, char and string variables, per-file attributes, and
now and then a variable missing from some files.

:func:`build` makes the virtual dataset all at once, or from the first files with the rest appended (in
one append, in k appends of random sizes, or one file at a time), into JSON, Parquet or Icechunk.
:func:`check` compares it with ``xr.open_mfdataset(files, engine="netcdf4")`` (dims, coordinates, raw and
decoded values, the attributes that change decoding) and an append with virtualizing every file at once;
a refusal must be one the README states, name a file and change nothing.

Used by ``tests/test_generated_archives.py`` (a fixed seed, in CI) and ``bench/explore_archives.py``
(fresh randomness, any number of examples, failures counted by class).
"""

from __future__ import annotations

import hashlib
import itertools
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import cftime
import netCDF4
import numpy as np
import pandas as pd
import xarray as xr
from hypothesis import strategies as st

from nczmap import FormatError
from nczmap.integrations.virtualize import VirtualizeWarning, virtualize

UNIT_SECONDS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}
CALENDARS = ("standard", "proleptic_gregorian", "noleap", "360_day", "julian")
BASES = ("1981-01-01", "1900-01-01 00:00:00", "2001-03-01 06:00")
TIME_DTYPES = ("i2", "i4", "i8", "f4", "f8")
PACKINGS = ("plain", "fill", "fills", "same", "differ", "missing_value", "unsigned", "dtypes")
X = 3  # the data variable's second dimension

# Refusals the README states (a file, a variable and the attribute named), by the words that tell them
ALLOWED_REFUSALS = {  # each names the variable, and the attribute where one is the cause
    "a variable missing from a file": r"variables of '[^']*' differ \(missing \['\w+'\]",
    "calendars differ": r"variable '[^']+' has calendar '[^']+' there but '[^']+'",
    "fills among re-encoded times": r"'[^']+' of \S+ holds fill values among times",
    "an append's encoding": r"variable '[^']+' has (scale_factor|add_offset|_FillValue|missing_value"
    r"|_Unsigned|dtype) .* an append adds values in the dataset's own encoding",
}


REFUSALS_SEEN: dict[str, str] = {}  # a refusal's text for each class seen (what exploration shows)


@dataclass
class FileSpec:
    records: int
    time_dtype: str
    unit: str
    per_file: bool  # units "<unit> since <this file's first step>", else the archive's shared reference
    calendar: str
    scale: float  # the packed variable's scale_factor in this file
    v_dtype: str
    has_extra: bool  # holds the variable some files lack


@dataclass
class Archive:
    files: list[FileSpec]
    base: str
    step: tuple[int, int]  # the step between records: numerator, denominator, in the first file's unit
    bounds: str  # "none", "bounds", "bounds_units", "climatology", "climatology_units"
    packing: str
    chunk: int  # the data variable's chunk length along time (0: contiguous)
    unlimited: bool
    group: bool
    text: bool
    masked: bool  # some data values are fill values
    seed: int
    splits: list[int] = field(default_factory=list)  # append after these many files (empty: all at once)
    output: str = ".json"
    join: str = "concat"  # or "new_dim": files with no time, stacked by the dates in their names
    gaps: list[int] = field(default_factory=list)  # new_dim: days between one file's date and the next

    @property
    def unit(self) -> str:
        return self.files[0].unit

    def describe(self) -> str:
        units = (
            "shared"
            if not any(f.per_file for f in self.files)
            else ("per file" if all(f.per_file for f in self.files) else "mixed")
        )
        return (
            f"{len(self.files)} files {[f.records for f in self.files]}, time "
            f"{sorted({f.time_dtype for f in self.files})} {sorted({f.unit for f in self.files})} units "
            f"{units} step {self.step[0]}/{self.step[1]}, calendar {self.files[0].calendar}, bounds "
            f"{self.bounds}, packing {self.packing}, chunk {self.chunk}, "
            f"{'unlimited' if self.unlimited else 'fixed'}, group {self.group}, text {self.text}, "
            f"splits {self.splits}, output {self.output}, join {self.join} {self.gaps}"
        )


# ----------------------------------------------------------------------------------------- strategies
@st.composite
def archives(draw, outputs=(".json", ".parq", ".icechunk")) -> Archive:
    count = draw(st.integers(2, 5))
    unit = draw(st.sampled_from(tuple(UNIT_SECONDS)))
    time_dtype = draw(st.sampled_from(TIME_DTYPES))
    fractional = time_dtype[0] == "f" and draw(st.booleans())
    step = (1, 2) if fractional else (draw(st.sampled_from((1, 1, 2, 6, 24))), 1)
    mode = draw(st.sampled_from(("shared", "per file", "mixed")))
    calendar = draw(st.sampled_from(CALENDARS))
    if draw(st.sampled_from([False] * 19 + [True])):
        calendars = [calendar] + [draw(st.sampled_from(CALENDARS)) for _ in range(count - 1)]
    else:
        calendars = [calendar] * count
    packing = draw(st.sampled_from(PACKINGS))
    dtypes_differ = draw(st.sampled_from([False] * 4 + [True]))
    missing = draw(st.sampled_from([False] * 9 + [True]))
    files = []
    for index in range(count):
        per_file = mode == "per file" or (mode == "mixed" and draw(st.booleans()))
        files.append(
            FileSpec(
                records=draw(st.integers(1, 5)),
                time_dtype=draw(st.sampled_from(TIME_DTYPES)) if dtypes_differ else time_dtype,
                unit=draw(st.sampled_from(tuple(UNIT_SECONDS))) if per_file and index else unit,
                per_file=per_file,
                calendar=calendars[index],
                scale=draw(st.sampled_from((0.01, 0.02, 0.5))) if packing in ("differ", "fills") else 0.01,
                v_dtype=draw(st.sampled_from(("f4", "f8", "i4"))) if packing == "dtypes" else "f4",
                has_extra=not (missing and index and draw(st.booleans())),
            )
        )
    splits = []
    how = draw(st.sampled_from(("all", "first", "random", "daily")))
    if how == "first":
        splits = [1]
    elif how == "daily":
        splits = list(range(1, count))
    elif how == "random":
        splits = sorted(draw(st.sets(st.integers(1, count - 1), min_size=1)))
    return Archive(
        files=files,
        base=draw(st.sampled_from(BASES)),
        step=step,
        bounds=draw(st.sampled_from(("none", "bounds", "bounds_units", "climatology", "climatology_units"))),
        packing=packing,
        chunk=draw(st.sampled_from((0, 1, 2, 3))),
        unlimited=draw(st.booleans()),
        group=draw(st.sampled_from([False] * 3 + [True])),
        text=draw(st.sampled_from([False] * 3 + [True])),
        masked=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
        splits=splits,
        output=draw(st.sampled_from(outputs)),
        join=draw(st.sampled_from(["concat"] * 3 + ["new_dim"])),
        gaps=[draw(st.sampled_from((1, 1, 1, 2, 7))) for _ in range(count - 1)],
    )


# ------------------------------------------------------------------------------------------- writing
def _date_text(date) -> str:
    return (
        f"{date.year:04d}-{date.month:02d}-{date.day:02d} {date.hour:02d}:{date.minute:02d}:{date.second:02d}"
    )


def _fits(values: np.ndarray, dtype: str) -> bool:
    if dtype[0] == "f":
        return bool(np.array_equal(values.astype(dtype).astype("f8"), values))
    info = np.iinfo(dtype)
    return bool(np.all(values == np.round(values))) and values.min() >= info.min and values.max() <= info.max


NEW_DIM = ("time", "%Y%m%d")
Y = 2  # new_dim: the data variable's first dimension


def dates(archive: Archive) -> list[np.datetime64]:
    """new_dim: each file's date."""
    days = np.cumsum([0, *archive.gaps])
    return [np.datetime64("2024-02-27") + np.timedelta64(int(day), "D") for day in days]


def write(archive: Archive, folder: Path) -> list[Path]:
    """The archive's files in ``folder`` (written by netCDF4-python)."""
    rng = np.random.default_rng(archive.seed)
    if archive.join == "new_dim":
        paths = []
        for index, (spec, date) in enumerate(zip(archive.files, dates(archive), strict=True)):
            path = folder / f"f{index:03d}_{str(date).replace('-', '')}.nc"
            _write_stacked(path, archive, spec, rng, index)
            paths.append(path)
        return paths
    first_unit = archive.unit
    step_seconds = UNIT_SECONDS[first_unit] * archive.step[0] / archive.step[1]
    shared_units = f"{first_unit} since {archive.base}"
    paths, record = [], 0
    for index, spec in enumerate(archive.files):
        seconds = (record + np.arange(spec.records + 1)) * step_seconds  # since base; one more: bounds
        if spec.per_file:
            whole = float(np.floor(seconds[0]))  # a reference date in whole seconds
            start = cftime.num2date(whole, f"seconds since {archive.base}", spec.calendar)
            units = f"{spec.unit} since {_date_text(start)}"
            local = (seconds - whole) / UNIT_SECONDS[spec.unit]
        else:
            units = shared_units if spec.unit == first_unit else f"{spec.unit} since {archive.base}"
            local = seconds / UNIT_SECONDS[spec.unit]
        dtype = spec.time_dtype
        if not _fits(local, dtype):  # as a writer would: a type that holds the values
            dtype = "f8" if not _fits(local, "i8") else "i8"
        path = folder / f"f{index:03d}.nc"
        _write_file(path, archive, spec, units, local, dtype, rng, record)
        paths.append(path)
        record += spec.records
    return paths


def _write_file(path, archive: Archive, spec: FileSpec, units, local, dtype, rng, record: int) -> None:
    n = spec.records
    with netCDF4.Dataset(path, "w") as ds:
        ds.history = f"written for file {path.name}"  # differs a file: the first file's is kept
        ds.createDimension("time", None if archive.unlimited else n)
        ds.createDimension("x", X)
        time = ds.createVariable("time", dtype, ("time",))
        time.units = units
        time.calendar = spec.calendar
        time.standard_name = "time"
        time[:] = local[:n].astype(dtype)
        if archive.bounds != "none":
            ds.createDimension("nv", 2)
            name = "time_bnds" if archive.bounds.startswith("bounds") else "climatology_bnds"
            setattr(time, "bounds" if archive.bounds.startswith("bounds") else "climatology", name)
            bounds = ds.createVariable(name, dtype, ("time", "nv"))
            if archive.bounds.endswith("_units"):
                bounds.units = units
                bounds.calendar = spec.calendar
            bounds[:] = np.stack([local[:n], local[1 : n + 1]], axis=1).astype(dtype)
        x = ds.createVariable("x", "f4", ("x",))
        x[:] = np.arange(X, dtype="f4") * 0.5
        _write_data(ds, archive, spec, rng)
        _write_companions(ds, archive, spec, rng, "time", [f"{record + i}" for i in range(n)])


def _write_stacked(path: Path, archive: Archive, spec: FileSpec, rng, index: int) -> None:
    """new_dim: one file of a series with no time at all, its date only in its name."""
    with netCDF4.Dataset(path, "w") as ds:
        ds.history = f"written for file {path.name}"
        ds.createDimension("y", Y)
        ds.createDimension("x", X)
        x = ds.createVariable("x", "f4", ("x",))
        x[:] = np.arange(X, dtype="f4") * 0.5
        _write_data(ds, archive, spec, rng, ("y", "x"))
        _write_companions(ds, archive, spec, rng, "y", [f"{index}{i}" for i in range(Y)])


def _write_companions(ds, archive: Archive, spec: FileSpec, rng, dim: str, steps: list[str]) -> None:
    """The variables along ``dim`` beside the data: one some files lack, one in a group, char and string
    text (``steps`` name each step)."""
    n = len(steps)
    if spec.has_extra:
        extra = ds.createVariable("extra", "f8", (dim,))
        extra[:] = np.array([float(step) for step in steps])
    if archive.group:
        group = ds.createGroup("g")
        w = group.createVariable("w", "f8", (dim,))
        w.units = "m"
        w[:] = rng.normal(size=n)
    if archive.text:
        ds.createDimension("nchar", 4)
        label = ds.createVariable("label", "S1", (dim, "nchar"))
        label[:] = netCDF4.stringtochar(np.array([f"r{step}" for step in steps], dtype="S4"))
        name = ds.createVariable("name", str, (dim,))
        name[:] = np.array([f"step {step}" for step in steps], dtype=object)


def _write_data(ds, archive: Archive, spec: FileSpec, rng, dims=("time", "x")) -> None:
    n, packing = (spec.records if dims[0] == "time" else Y), archive.packing
    if archive.chunk == 0 and not (archive.unlimited and dims[0] == "time"):
        chunking = {"contiguous": True}
    else:  # a fixed dimension holds chunks no longer than itself; an unlimited one needs chunks
        length = archive.chunk or 2
        fixed = not archive.unlimited or dims[0] != "time"
        chunking = {"chunksizes": (min(length, n) if fixed else length, X)}
    decoded = rng.normal(15, 5, size=(n, X))
    mask = rng.random((n, X)) < 0.2 if archive.masked else np.zeros((n, X), dtype=bool)
    if packing in ("same", "differ"):
        v = ds.createVariable("v", "i2", dims, fill_value=-32768, zlib="chunksizes" in chunking,
                              **chunking)  # fmt: skip
        v.scale_factor = np.float32(spec.scale)
        v.add_offset = np.float32(20)
        raw = np.round((decoded - 20) / spec.scale).clip(-32000, 32000).astype("i2")
        raw[mask] = -32768
    elif packing == "unsigned":
        v = ds.createVariable("v", "i2", dims, fill_value=-1, **chunking)
        v._Unsigned = "true"
        raw = rng.integers(-32768, 32767, size=(n, X)).astype("i2")
        raw[raw == -1] = 0
        raw[mask] = -1
    elif packing == "missing_value":
        v = ds.createVariable("v", "f4", dims, **chunking)
        v.missing_value = np.float32(-999)
        raw = decoded.astype("f4")
        raw[mask] = -999
    elif packing == "dtypes":
        v = ds.createVariable("v", spec.v_dtype, dims, **chunking)
        raw = (decoded * 10).astype(spec.v_dtype)
    else:  # "fills": each file its own _FillValue (chosen by its scale)
        number = {0.01: -1e30, 0.02: -999.0, 0.5: 9.96921e36}[spec.scale] if packing == "fills" else -1e30
        fill = {"fill_value": np.float32(number)} if packing in ("fill", "fills") else {}
        v = ds.createVariable("v", "f4", dims, **chunking, **fill)
        raw = decoded.astype("f4")
        if packing in ("fill", "fills"):
            raw[mask] = number
    v.units = "K"
    v.set_auto_maskandscale(False)
    v[:] = raw


# ------------------------------------------------------------------------------------------ building
def url_of(destination: Path) -> str:
    if destination.suffix == ".icechunk":
        return f"file://{destination}#mode=icechunk"
    return f"file://{destination}#mode=nczarr,manifest"


def open_ours(destination: Path, **options) -> xr.Dataset:
    map_options = {"containers": [str(destination.parent) + "/"]} if destination.suffix == ".icechunk" else {}
    with xr.open_dataset(url_of(destination), engine="nczmap", map_options=map_options, **options) as ds:
        return ds.load()


def snapshot(destination: Path) -> dict[str, str]:
    """The bytes of every file of a dataset (and of its chunk files beside it), by relative path."""
    found = {}
    paths = [destination] if destination.is_file() else sorted(destination.rglob("*"))
    paths += sorted(destination.parent.glob(destination.name + ".*"))
    for path in paths:
        if path.is_file():
            found[str(path.relative_to(destination.parent))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@dataclass
class Built:
    destination: Path
    files: list[Path]  # the files in the dataset
    refusal: FormatError | None = None  # the first refusal (the dataset holds the files before it)
    refused_at: int | None = None  # the step (0: the first virtualize) refused


def build(archive: Archive, files: list[Path], folder: Path, name: str = "archive") -> Built:
    """The virtual dataset of ``files`` as ``archive.splits`` says: the first files virtualized, the rest
    appended in groups; a refused step leaves the dataset as it was (checked here)."""
    destination = folder / f"{name}{archive.output}"
    bounds = [0, *archive.splits, len(files)]
    built = Built(destination, [])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", VirtualizeWarning)
        for step, (start, stop) in enumerate(itertools.pairwise(bounds)):
            group = files[start:stop]
            before = snapshot(destination) if step else {}
            try:
                if step == 0 and archive.join == "new_dim":
                    virtualize(group, url_of(destination), new_dim=NEW_DIM)
                elif step == 0:
                    virtualize(group, url_of(destination), concat="time")
                else:
                    virtualize(group, url_of(destination), append=True)
            except FormatError as error:
                built.refusal, built.refused_at = error, step
                after = snapshot(destination) if step else {}
                assert after == before, f"a refused step {step} changed the dataset: {error}"
                return built
            built.files += group
    return built


# ------------------------------------------------------------------------------------------- oracle
def _cf_bounds(ds: xr.Dataset) -> xr.Dataset:
    """Climatology bounds take their coordinate's units and calendar where they have none (CF 7.4; xarray
    does so only for ``bounds``), in the oracle and in what is checked alike."""
    time = ds.variables.get("time")
    name = time.attrs.get("climatology") if time is not None else None
    if name in ds.variables:
        for attribute in ("units", "calendar"):
            if attribute in time.attrs:
                ds[name].attrs.setdefault(attribute, time.attrs[attribute])
    return ds


def oracle(files: list[Path], group: str | None = None, join: str = "concat") -> xr.Dataset:
    """What xarray makes of ``files``: ``open_mfdataset``'s steps (each file opened with the netcdf4 engine
    and decoded with its own attributes, then joined along ``time``), or for new_dim ``xr.concat`` of the
    files along a ``time`` index of the dates in their names."""
    opened = [
        xr.decode_cf(_cf_bounds(xr.open_dataset(f, engine="netcdf4", group=group, decode_cf=False)))
        for f in files
    ]
    try:
        if join == "new_dim":
            days = [np.datetime64(f"{f.stem[-8:-4]}-{f.stem[-4:-2]}-{f.stem[-2:]}", "ns") for f in files]
            return xr.concat(
                opened, dim=pd.Index(days, name="time"), data_vars="all", coords="minimal",
                compat="override", combine_attrs="override",
            ).load()  # fmt: skip
        return xr.combine_nested(
            opened, concat_dim="time", data_vars="minimal", coords="minimal", compat="override",
            combine_attrs="override",
        ).load()  # fmt: skip
    finally:
        for ds in opened:
            ds.close()


def ours(destination: Path, group: str | None = None, **options) -> xr.Dataset:
    raw = open_ours(destination, group=group, decode_cf=False)
    return xr.decode_cf(_cf_bounds(raw), **options).load()


DECODING = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned", "units", "calendar")


def check_values(built: Built, group: str | None = None, join: str = "concat") -> None:
    """The dataset equals the oracle's joining of its files: dims, every variable's decoded values, and
    the decoded dtype (so packing attributes kept their types)."""
    expected = oracle(built.files, group, join)
    if group is not None and join == "new_dim":
        expected = expected.drop_vars("time")  # a group's variables use the root's time (checked there)
    got = ours(built.destination, group)
    assert dict(got.sizes) == dict(expected.sizes), f"dims {dict(got.sizes)} != {dict(expected.sizes)}"
    for name, variable in expected.variables.items():
        assert name in got.variables, f"{name} missing"
        mine = got[name]
        assert mine.dims == variable.dims, f"{name}: dims {mine.dims} != {variable.dims}"
        assert mine.dtype == variable.dtype, f"{name}: dtype {mine.dtype} != {variable.dtype}"
        if variable.dtype.kind in "fc":
            np.testing.assert_array_equal(mine.values, variable.values, err_msg=name, strict=True)
        else:
            assert np.array_equal(mine.values, variable.values), f"{name}: {mine.values} != {variable.values}"


def _meaning(ds: xr.Dataset, name: str) -> dict:
    """The attributes that decide what ``name``'s numbers mean in one file: a bounds variable's units and
    calendar are its coordinate's where it has none."""
    attrs = dict(ds.variables[name].attrs)
    time = ds.variables.get("time")
    if time is not None and name in (time.attrs.get("bounds"), time.attrs.get("climatology")):
        for attribute in ("units", "calendar"):
            if attribute in time.attrs:
                attrs.setdefault(attribute, time.attrs[attribute])
    return attrs


def _same_encoding(parts: list[xr.Dataset], name: str) -> bool:
    first, meaning = parts[0].variables[name], _meaning(parts[0], name)
    for part in parts[1:]:
        theirs = _meaning(part, name)
        if part.variables[name].dtype != first.dtype:
            return False
        if not all(_same_attribute(theirs.get(a), meaning.get(a)) for a in DECODING):
            return False
    return True


def _same_attribute(a: object, b: object) -> bool:
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    x, y = np.asarray(a), np.asarray(b)
    return x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


def check_raw(built: Built, group: str | None = None) -> None:
    """Variables every file encodes alike are stored as the files store them: the same raw values (the
    files' concatenated along time, else the first file's) and the same attributes that change decoding
    (with their types)."""
    got = open_ours(built.destination, group=group, decode_cf=False)
    parts = [xr.open_dataset(f, engine="netcdf4", group=group, decode_cf=False) for f in built.files]
    try:
        for name, variable in got.variables.items():
            holding = [part for part in parts if name in part.variables]
            if not holding or not _same_encoding(holding, name):  # new_dim's time is in no file
                continue
            mine = [part.variables[name] for part in holding]
            if "time" in mine[0].dims:
                expected = xr.Variable.concat(mine, dim="time")
            elif "time" in variable.dims:  # new_dim: stacked along the new leading dimension
                expected = xr.Variable.concat(
                    [part.set_dims({"time": 1, **part.sizes}) for part in mine], "time"
                )
            else:
                expected = mine[0]
            assert variable.dtype == expected.dtype, f"{name}: raw dtype {variable.dtype} != {expected.dtype}"
            assert np.array_equal(variable.values, expected.values, equal_nan=variable.dtype.kind == "f"), (
                f"{name}: raw values differ"
            )
            for attribute in DECODING:
                if attribute in ("_FillValue", "calendar") and attribute not in expected.attrs:
                    continue  # a fill value or calendar a file does not state may be stated: the default
                assert _same_attribute(variable.attrs.get(attribute), expected.attrs.get(attribute)), (
                    f"{name}: {attribute} {variable.attrs.get(attribute)!r} != {expected.attrs[attribute]!r}"
                )
    finally:
        for part in parts:
            part.close()


def check_refusal(built: Built) -> str:
    """A refusal is one the README states and names a file: returns its class."""
    error = built.refusal
    text = str(error)
    names = [path.name for path in built.files] + [p.name for p in built.destination.parent.glob("f*.nc")]
    assert any(name in text for name in names) or str(built.destination) in text, f"no file named: {text}"
    for reason, pattern in ALLOWED_REFUSALS.items():
        if re.search(pattern, text):
            REFUSALS_SEEN.setdefault(reason, text)
            return reason
    raise AssertionError(f"refused for a reason the README does not give: {text}")


def expected_refusal(archive: Archive) -> bool:
    """Whether the archive holds a case nczmap refuses by design (checked by :func:`check_refusal`)."""
    calendars = {f.calendar for f in archive.files}
    mixed_calendar = len(calendars) > 1 and calendars != {"standard", "proleptic_gregorian"}
    missing = not all(f.has_extra for f in archive.files)
    return mixed_calendar or missing


def check(archive: Archive, folder: Path) -> str:
    """Write, build and compare one archive; the outcome's class ("joined", or the refusal's)."""
    files = write(archive, folder)
    built = build(archive, files, folder)
    if built.refusal is not None:
        reason = check_refusal(built)
        if built.files:
            check_values(built, join=archive.join)
        return f"refused: {reason}"
    check_values(built, join=archive.join)
    check_raw(built)
    if archive.group:
        check_values(built, "g", archive.join)
        check_raw(built, "g")
    if archive.splits:
        whole = Archive(**{**archive.__dict__, "splits": []})
        all_at_once = build(whole, files, folder, name="whole")
        assert all_at_once.refusal is None, f"appended, but refused all at once: {all_at_once.refusal}"
        xr.testing.assert_identical(open_ours(built.destination), open_ours(all_at_once.destination))
    return "joined"
