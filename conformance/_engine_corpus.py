"""The corpus of the engine conformance tests, shared by the tests reading it through xarray.

Each CDL of the corpus (``cdl/*.cdl`` and the netcdf-c fixture CDLs that ``ncgen`` builds) is compiled to
``x.nc`` by ``ncgen -4``, and written as NCZarr stores by every :data:`KINDS` writer (real netcdf-c and
nczmap's copier in every dialect); :class:`Stores` builds each of them once, when first needed.
"""

from __future__ import annotations

import shutil
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from _fixtures import FIXTURES

from nczmap.format.dialects import Dialect
from nczmap.integrations.copy import copy as nczmap_copy

NCGEN = shutil.which("ncgen")
CDL_DIR = Path(__file__).resolve().parent / "cdl"
TIMEOUT = 60


# ------------------------------------------------------------------------------------------ the corpus
# netcdf-c fixture CDLs that are not built: ncgen -4 cannot compile them, or they are not datasets
NOT_BUILT = {
    "ref_any": "needs HDF5 filter plugins (_Filter) that Debian's ncgen does not have",
    "ref_bzip2": "needs the bzip2 HDF5 filter plugin",
    "ref_filtered": "needs HDF5 filter plugins",
    "ref_multi": "needs HDF5 filter plugins",
    "ref_byte": "a variable named 'byte' (a CDL keyword): compared through its zip below, renamed",
    "ref_ut_map_create": "zmap unit-test dump, not a dataset",
    "ref_ut_map_writedata": "zmap unit-test dump, not a dataset",
    "ref_ut_map_writemeta": "zmap unit-test dump, not a dataset",
    "ref_ut_map_writemeta2": "zmap unit-test dump, not a dataset",
    "ref_ut_mapapi_create": "zmap unit-test dump, not a dataset",
    "ref_ut_mapapi_data": "zmap unit-test dump, not a dataset",
    "ref_ut_mapapi_meta": "zmap unit-test dump, not a dataset",
}


def corpus() -> dict[str, Path]:
    cdls = {p.stem: p for p in sorted(CDL_DIR.glob("*.cdl"))}
    if FIXTURES.is_dir():
        cdls |= {p.stem: p for p in sorted(FIXTURES.glob("ref_*.cdl")) if p.stem not in NOT_BUILT}
    return cdls


CORPUS = corpus()
# netCDF4-python cannot open it (a variable uses a dimension of a non-ancestor group): there is no oracle
NO_ORACLE = {"foreign_dim": "netCDF4-python fails to open a variable using a non-ancestor group's dimension"}


@dataclass(frozen=True)
class Kind:
    """A writer of NCZarr stores and the dialect it writes."""

    name: str
    dialect: Dialect
    netcdf_version: str | None = None  # nczmap's copier only

    @property
    def by_netcdf_c(self) -> bool:
        return not self.name.startswith("nczmap")

    @property
    def mode(self) -> str:
        return "nczarr" if self.dialect.is_nczarr else "zarr"


KINDS = {
    k.name: k
    for k in (
        Kind("ncgen-4.9.0", Dialect.NCZARR_UPPER_KEYS),
        Kind("ncgen-4.9.0-zarr", Dialect.PURE_ZARR),
        Kind("libnetcdf-4.10.1", Dialect.NCZARR_ATTRIBUTES),
        Kind("nczmap-4.8.0", Dialect.NCZARR_OBJECTS, "4.8.0"),
        Kind("nczmap-4.9.0", Dialect.NCZARR_UPPER_KEYS, "4.9.0"),
        Kind("nczmap-4.9.1", Dialect.NCZARR_LOWER_KEYS, "4.9.1"),
        Kind("nczmap-4.9.3", Dialect.NCZARR_ATTRIBUTES),
        Kind("nczmap-zarr", Dialect.PURE_ZARR),
    )
}

# (case, kind) -> why that writer cannot write that CDL (the test is skipped with the reason)
STRINGS_BEFORE_491 = "NCZarr before 4.9.1 has no string type (spec §4.1)"
UNLIMITED_BEFORE_493 = "NCZarr before 4.9.3 has no unlimited dimensions (spec §4.8)"
NO_TRUNCATION = "nczmap refuses to truncate '0123456789' to _nczarr_maxstrlen = 4 (netcdf-c does, bug 26)"
CANNOT_WRITE: dict[tuple[str, str], str] = {
    **{(case, kind): STRINGS_BEFORE_491
       for case in ("strings", "empty_strings", "ref_string", "ref_newformatpure")
       for kind in ("ncgen-4.9.0", "ncgen-4.9.0-zarr", "nczmap-4.8.0", "nczmap-4.9.0")},
    **{("unlimited", kind): UNLIMITED_BEFORE_493
       for kind in ("ncgen-4.9.0", "ncgen-4.9.0-zarr", "nczmap-4.8.0", "nczmap-4.9.0", "nczmap-4.9.1")},
    **{("ref_string", kind): NO_TRUNCATION for kind in ("nczmap-4.9.1", "nczmap-4.9.3", "nczmap-zarr")},
}  # fmt: skip


# ------------------------------------------------------------------------------------------ the stores
def run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, timeout=TIMEOUT, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.decode(errors='replace')}")


def url_of(path: Path, mode: str) -> str:
    return f"file://{path}#mode={mode},file"


# These CDLs reach nczmap's writers through the D3 store rather than the .nc:
COPY_FROM_D3 = {
    # the never-written elements of the no-fill 'ff' are uninitialised memory in HDF5, different at each
    # read of the .nc; in NCZarr they are zeros
    "nofill",
}


class Stores:
    """The .nc and the stores of every CDL, each built once, when a test first needs it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[tuple[str, str], str] = {}

    def nc(self, case: str) -> Path:
        path = self.root / case / f"{case}.nc"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            run(NCGEN, "-4", "-o", str(path), str(CORPUS[case]))
        return path

    def store(self, case: str, kind_name: str) -> str:
        if (case, kind_name) not in self.built:
            kind = KINDS[kind_name]
            url = url_of(self.nc(case).parent / f"{kind.name}.file", kind.mode)
            self._write(case, kind, url)
            self.built[case, kind_name] = url
        return self.built[case, kind_name]

    def _write(self, case: str, kind: Kind, url: str) -> None:
        if kind.name.startswith("ncgen"):
            run(NCGEN, "-4", "-lb", "-o", url, str(CORPUS[case]))
        elif kind.name == "libnetcdf-4.10.1":
            from test_ncdump_conformance import copy_to_nczarr

            copy_to_nczarr(self.nc(case), url)
        else:
            source = self.store(case, "libnetcdf-4.10.1") if case in COPY_FROM_D3 else str(self.nc(case))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                nczmap_copy(source, url, netcdf_version=kind.netcdf_version)


# The marks of every test module reading the corpus.
CORPUS_MARKS = [
    pytest.mark.skipif(NCGEN is None, reason="netcdf-c ncgen not on PATH"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # nczmap's warnings about old releases' limits
]


def open_oracle(stores: Stores, case: str, group: str | None = None, **options):
    """netCDF4-python's reading of the case's .nc through xarray's ``netcdf4`` engine, loaded."""
    import xarray as xr

    with xr.open_dataset(stores.nc(case), engine="netcdf4", group=group, **options) as theirs:
        return theirs.load()


# ------------------------------------------------------------------------------------------ groups
def has_groups(case: str) -> bool:
    return "group:" in CORPUS[case].read_text()


def group_paths(nc: Path) -> list[str]:
    import netCDF4

    def walk(group) -> list[str]:
        return [group.path] + [p for child in group.groups.values() for p in walk(child)]

    with netCDF4.Dataset(nc) as dataset:
        return walk(dataset)
