"""Fixtures shared by the conformance tests."""

from __future__ import annotations

import contextlib

import pytest

with contextlib.suppress(ImportError):  # ecCodes into its own scope first: see tests/conftest.py
    from nczmap.format.gribcodec import import_eccodes

    import_eccodes()


@pytest.fixture(scope="session")
def stores(tmp_path_factory):
    """The engine corpus' stores (``_engine_corpus.Stores``), built once each for the whole session."""
    from _engine_corpus import Stores

    return Stores(tmp_path_factory.mktemp("xarray_engine"))
