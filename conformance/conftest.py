"""Fixtures shared by the conformance tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def stores(tmp_path_factory):
    """The engine corpus' stores (``_engine_corpus.Stores``), built once each for the whole session."""
    from _engine_corpus import Stores

    return Stores(tmp_path_factory.mktemp("xarray_engine"))
