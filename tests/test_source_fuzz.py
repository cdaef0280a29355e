"""Fuzzing every source parser: damaged netCDF-4/HDF5, netCDF-3, TIFF and GRIB2 files end in success or in
an nczmap error, in bounded time and memory, through ``nczmap virtualize`` (and a read of every variable
through its manifest), ``nczmap ncdump FILE`` and ``nczmap copy FILE`` (see :mod:`source_fuzz`).

``NCZMAP_FUZZ_CASES`` sets the mutations per format (a nightly run: thousands); by default a few hundred,
run in one child process a format (restarted after a case that kills it).
"""

from __future__ import annotations

import os

import pytest
from source_fuzz import (
    FORMATS,
    WRITERS,
    Case,
    failures,
    fresh_mutate,
    paths_cases,
    run_cases,
    seeds,
    suite_cases,
    table,
)

CASES = int(os.environ.get("NCZMAP_FUZZ_CASES", "200"))
FRESH_CASES = int(os.environ.get("NCZMAP_FUZZ_FRESH_CASES", "60"))
PATHS_CASES = int(os.environ.get("NCZMAP_FUZZ_PATHS_CASES", "20"))


@pytest.fixture(scope="module")
def seed_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("seeds")


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_sources_end_in_success_or_an_nczmap_error(fmt, seed_folder, tmp_path):
    pytest.importorskip(WRITERS[fmt])
    seed_files = seeds(seed_folder / fmt, [fmt])
    results = run_cases(suite_cases(seed_files, CASES, [fmt]), tmp_path)
    unexpected = failures(results)
    shown = "\n".join(f"{r.case.label}: {r.outcome}: {r.detail}" for r in unexpected[:10])
    assert not unexpected, f"{table(results)}\n{shown}"
    outcomes = {result.outcome for result in results}
    assert outcomes == {"ok", "error"}, table(results)  # the mutations both damage and spare the files


@pytest.mark.parametrize("fmt", FORMATS)
def test_mutations_made_another_way_end_in_success_or_an_nczmap_error(fmt, seed_folder, tmp_path):
    """Inserted and deleted runs (every offset after them shifted), zeroed blocks, single bits, repeats and
    shuffled windows anywhere in the file: what the suite's mutations do not make."""
    pytest.importorskip(WRITERS[fmt])
    seed_files = seeds(seed_folder / f"fresh-{fmt}", [fmt])
    results = run_cases(suite_cases(seed_files, FRESH_CASES, [fmt], fresh_mutate), tmp_path)
    unexpected = failures(results)
    shown = "\n".join(f"{r.case.label}: {r.outcome}: {r.detail}" for r in unexpected[:10])
    assert not unexpected, f"{table(results)}\n{shown}"


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_sources_on_threads_processes_dask_and_the_xarray_engine_end_in_an_nczmap_error(
    fmt, seed_folder, tmp_path
):
    """The paths that parse sources elsewhere than the commands: a damaged file joined after its intact
    seed on a thread pool, a process pool and a dask client, and opened by the xarray engine."""
    pytest.importorskip(WRITERS[fmt])
    seed_files = seeds(seed_folder / f"paths-{fmt}", [fmt])
    results = run_cases(paths_cases(seed_files, PATHS_CASES, [fmt]), tmp_path)
    unexpected = failures(results)
    shown = "\n".join(f"{r.case.label}: {r.outcome}: {r.detail}" for r in unexpected[:10])
    assert not unexpected, f"{table(results)}\n{shown}"
    assert "error" in {result.outcome for result in results}, table(results)


def test_a_child_out_of_memory_is_reported_against_its_case_and_the_rest_still_run(tmp_path):
    """The harness itself: cases run in a child whose address space is too small for nczmap end as
    ``memory`` (a MemoryError) or ``crash`` (the child died), never as passes; each case is reported."""
    seed = seeds(tmp_path / "seeds", ["netcdf3"])["netcdf3"]
    cases = [Case("netcdf3#seed", ".nc", seed.read_bytes())] * 2
    results = run_cases(cases, tmp_path / "run", memory_limit=32 << 20)
    assert [r.case for r in results] == cases
    assert {r.outcome for r in results} <= {"memory", "crash"}, [r.outcome for r in results]
    assert failures(results) == results
    assert all("exit status" in r.detail for r in results if r.outcome == "crash")
