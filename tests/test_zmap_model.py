"""Random sequences of zmap operations on the file and zip drivers agree with the memory model."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from nczmap import EmptyError, open_map
from nczmap.errors import KeyConflictError
from nczmap.zmap import MemoryMap

SEGMENTS = st.sampled_from(["a", "b", ".zarray", "é"])
KEYS = st.lists(SEGMENTS, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
PREFIXES = st.one_of(st.just("/"), KEYS)
DATA = st.binary(max_size=64)


def outcome(call):
    """The result of a call, or the nczmap error class it raised (compared across drivers)."""
    try:
        return call()
    except (EmptyError, KeyConflictError) as exc:
        return type(exc)


class DriverAgreesWithModel(RuleBasedStateMachine):
    driver = "file"
    written = Bundle("written")

    s3 = None  # the moto server, for the s3 machine

    @initialize()
    def open_maps(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="nczmap-model-"))
        suffix = "zip" if self.driver == "zip" else "file"
        self.url = (self.directory / f"ds.{suffix}").as_uri() + f"#mode=nczarr,{self.driver}"
        if self.driver == "s3":
            self.url = self.s3.url()
        self.model = MemoryMap()
        self.real = open_map(self.url, "w")

    def teardown(self) -> None:
        if hasattr(self, "real"):
            self.real.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def both(self, name: str, *args):
        expected = outcome(lambda: getattr(self.model, name)(*args))
        actual = outcome(lambda: getattr(self.real, name)(*args))
        assert actual == expected, f"{name}{args}: {actual!r} != model {expected!r}"

    @rule(target=written, key=KEYS, data=DATA)
    def write(self, key, data):
        self.both("write", key, data)
        return key

    @rule(key=st.one_of(written, KEYS))
    def delete(self, key):
        self.both("delete", key)

    @rule(key=written, depth=st.integers(1, 2))
    def delete_ancestor(self, key, depth):
        self.both("delete", key.rsplit("/", depth)[0] or "/")

    @rule(
        key=st.one_of(written, KEYS), start=st.integers(0, 70), count=st.one_of(st.none(), st.integers(0, 70))
    )
    def read(self, key, start, count):
        self.both("read", key, start, count)

    @rule(key=KEYS)
    def size(self, key):
        self.both("len", key)

    @rule(prefix=PREFIXES)
    def search(self, prefix):
        self.both("search", prefix)

    @rule()
    def reopen(self):
        self.real.close()
        self.real = open_map(self.url, "a")

    @rule(dice=st.integers(0, 9))
    def truncate(self, dice):
        if dice == 0:  # rarely: an empty store explores little
            self.both("truncate")

    @invariant()
    def same_objects(self):
        if hasattr(self, "real"):
            assert list(self.real.objects()) == list(self.model.objects())


class ZipAgreesWithModel(DriverAgreesWithModel):
    driver = "zip"


class S3AgreesWithModel(DriverAgreesWithModel):
    driver = "s3"


MODEL_SETTINGS = settings(
    max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("machine", [DriverAgreesWithModel, ZipAgreesWithModel], ids=["file", "zip"])
def test_driver_agrees_with_memory_model(machine):
    run_state_machine_as_test(machine, settings=MODEL_SETTINGS)


def test_s3_driver_agrees_with_memory_model(s3_server):
    S3AgreesWithModel.s3 = s3_server
    run_state_machine_as_test(S3AgreesWithModel, settings=settings(MODEL_SETTINGS, max_examples=25))
