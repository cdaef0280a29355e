"""A stuck server ends a run within the documented bound: the request deadline plus the source's retry
budget, on every path a source is read by.

Two servers (``stuck_server.py``): one trickling (its headers, then one byte every 2 s) and one silent
(it accepts and never answers), in front of local files or of moto's S3. Each run uses a small policy
(deadline 1 s, retry budget 3 s) and must end, with an nczmap error naming the source, the attempts and
the time spent, within deadline + budget + a small margin, however many paths read the source: a web
source's first read made together with the others' (``fetch_each``) and then by its parse; the parses'
own reads past the first blocks (netCDF-4 files whose metadata lies beyond them); reads through an
HTTP-backed manifest opened by xarray's ``nczmap`` engine; S3 objects. Nothing is mocked; nothing but
127.0.0.1 is contacted.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from stuck_server import StuckServer
from test_manifest_http import PROXY_VARIABLES
from test_virtualize import manifest_url

from nczmap.errors import StorageError
from nczmap.integrations.virtualize import virtualize
from nczmap.integrations.virtualize.sources import FIRST_BLOCK
from nczmap.zmap import http as http_reader
from nczmap.zmap.byteranges import RequestPolicy

netCDF4 = pytest.importorskip("netCDF4")
rasterio = pytest.importorskip("rasterio")
from rasterio.transform import from_origin  # noqa: E402

DEADLINE, BUDGET = 1.0, 3.0
# the last attempt starts within the budget and ends at its deadline (1 s + 1 s a MB); the margin is for
# the test's own work (parsing, writing nothing) and a loaded machine
BOUND = BUDGET + DEADLINE + FIRST_BLOCK / 1e6 + 1.5
S3_BOUND = BUDGET + DEADLINE + (1 << 20) / 1e6 + 1.5  # S3 reads of up to 1 MiB time out at its deadline
MODES = ["trickle", "silent"]
pytestmark = pytest.mark.filterwarnings("ignore::nczmap.integrations.virtualize.VirtualizeWarning")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """``sst_20210301.tif`` (a small COG: its metadata in its first block) and ``day0.nc``... (netCDF-4
    files whose second variable's metadata lies past their first block)."""
    root = tmp_path_factory.mktemp("stuck")
    profile = {
        "driver": "COG",
        "width": 256,
        "height": 256,
        "count": 1,
        "dtype": "int16",
        "crs": "EPSG:32633",
        "transform": from_origin(399960.0, 5500020.0, 250.0, 250.0),
        "blocksize": 128,
    }
    with rasterio.open(root / "sst_20210301.tif", "w", **profile) as dataset:
        dataset.write(np.arange(256 * 256, dtype="int16").reshape(1, 256, 256))
    for day in range(3):
        with netCDF4.Dataset(root / f"day{day}.nc", "w") as ds:
            ds.createDimension("time", None)
            ds.createDimension("y", 200)
            ds.createDimension("x", 300)
            ds.createVariable("time", "f8", ("time",))[:] = [day]
            noise = np.random.default_rng(day).random((1, 200, 300), dtype="f4")
            ds.createVariable("a", "f4", ("time", "y", "x"))[:] = noise
            ds.sync()
            ds.createVariable("b", "f4", ("time", "y", "x"))[:] = noise + 1
    return root


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch):
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def first_blocks(method: str, target: str, wanted: str | None) -> bool:
    """Spare the first reads (and listings): only what a parse reads past them is held up."""
    return wanted is None or wanted.startswith("bytes=0-") or "list-type" in target


def ends_in_time(run, *names: str, bound: float = BOUND) -> tuple[StorageError, float]:
    """``run()`` fails with a StorageError naming one of ``names``, its attempts and its time, within
    ``bound`` seconds."""
    began = time.monotonic()
    with pytest.raises(StorageError) as info:
        run()
    took = time.monotonic() - began
    message = str(info.value)
    assert any(name in message for name in names), message
    assert "attempt" in message and " s" in message, message
    assert took < bound, f"{took:.1f} s: {message}"
    return info.value, took


@pytest.mark.parametrize("mode", MODES)
def test_a_stuck_web_source_ends_the_run_within_deadline_and_budget(tmp_path, data, mode):
    """One source: its first read made with the others' (none here), then again by its parse, retried:
    one budget for both (it was spent twice: 2 x (budget + deadline) and more)."""
    with StuckServer(mode, directory=data) as server:
        url = server.url_of(data / "sst_20210301.tif")
        run = lambda: virtualize(  # noqa: E731
            [url], tmp_path / "refs.json", new_dim="time=sst_%Y%m%d", deadline=DEADLINE, retry_budget=BUDGET
        )
        error, _ = ends_in_time(run, url)
        assert "retry budget of 3 s is spent" in str(error)
        assert 2 <= server.held <= 4  # attempts a deadline apart, no more once the budget is spent
    assert not (tmp_path / "refs.json").exists()


def test_a_new_run_tries_a_source_an_earlier_run_gave_up(tmp_path, data):
    """The budget is a run's: a source given up by one run (a notebook cell) is tried again by the next
    (it was refused at once, without a request, for ``budget`` seconds)."""
    with StuckServer("silent", directory=data) as server:
        url = server.url_of(data / "sst_20210301.tif")
        run = lambda: virtualize(  # noqa: E731
            [url], tmp_path / "refs.json", new_dim="time=sst_%Y%m%d", deadline=DEADLINE, retry_budget=BUDGET
        )
        ends_in_time(run, url)
        held = server.held
        _, took = ends_in_time(run, url)
        assert server.held > held and took >= DEADLINE  # requests made again, each given its deadline


@pytest.mark.parametrize("mode", MODES)
def test_stuck_parses_of_several_sources_end_within_deadline_and_budget(tmp_path, data, mode):
    """First blocks come; what the parses read past them (netCDF-4 metadata) never does: each source's
    retries within its one budget, the first source's parse (made again after its early parse failed)
    refused at once."""
    files = sorted(data.glob("day*.nc"))
    with StuckServer(mode, directory=data, spare=first_blocks) as server:
        urls = [server.url_of(file) for file in files]
        run = lambda: virtualize(  # noqa: E731
            urls, tmp_path / "refs.json", concat="time", deadline=DEADLINE, retry_budget=BUDGET
        )
        ends_in_time(run, *urls)
        assert server.held >= 2  # the parses' reads past the first blocks were what got stuck
    assert not (tmp_path / "refs.json").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_stuck_source_of_an_http_manifest_ends_its_reads_within_deadline_and_budget(
    tmp_path, data, mode, monkeypatch
):
    """A manifest of a web source, read through xarray's engine once the server is stuck: the HEAD and
    every chunk's GET share the source's budget, and a source given up is not asked again: a second read
    (the next rows, as a caller going on after a failed read would) fails at once, where it spent another
    budget."""
    serving = {"all": True}
    spare = lambda method, target, wanted: serving["all"]  # noqa: E731
    with StuckServer(mode, directory=data, spare=spare) as server:
        refs = tmp_path / "refs.json"
        virtualize([server.url_of(data / "sst_20210301.tif")], refs, new_dim="time=sst_%Y%m%d")
        serving["all"] = False
        monkeypatch.setattr(http_reader, "DEFAULT_POLICY", RequestPolicy(deadline=DEADLINE, budget=BUDGET))

        def run() -> None:
            with xr.open_dataset(
                manifest_url(refs), engine="nczmap", map_options={"containers": [f"{server.url}/"]}
            ) as ds:
                with pytest.raises(StorageError):
                    ds["band_data"][0, :128].load()
                held = server.held
                ds["band_data"][0, 128:].load()
                assert server.held == held  # given up: no request

        error, _ = ends_in_time(run, server.url_of(data / "sst_20210301.tif"))
        assert "retry budget of 3 s is spent" in str(error)


@pytest.mark.parametrize("mode", MODES)
def test_stuck_s3_sources_end_the_run_within_deadline_and_budget(tmp_path, data, mode, s3_server):
    """S3 objects behind a stuck proxy (listing and first blocks answered, the parses' reads held): every
    request times out at the deadline of its length, obstore's retries end with the budget, and the
    source is then given up for the rest of the run."""
    prefix = uuid.uuid4().hex
    client = s3_server.client()
    files = sorted(data.glob("day*.nc"))
    for file in files:
        client.put_object(Bucket="nczbucket", Key=f"{prefix}/{file.name}", Body=file.read_bytes())
    with StuckServer(mode, upstream=s3_server.endpoint, spare=first_blocks) as proxy:
        run = lambda: virtualize(  # noqa: E731
            [f"{proxy.url}/nczbucket/{prefix}/#mode=s3"],
            tmp_path / "refs.json",
            concat="time",
            deadline=DEADLINE,
            retry_budget=BUDGET,
        )
        ends_in_time(run, *[f"s3://nczbucket/{prefix}/{file.name}" for file in files], bound=S3_BOUND)
        assert proxy.held >= 1
    assert not (tmp_path / "refs.json").exists()
