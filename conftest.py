"""Hypothesis profiles for every test folder.

``ci`` (the default, what the README's test command and CI run): derandomized, no example database, so
every run of a fresh clone draws the same examples. ``explore``: fresh randomness, for the separate runs
that look for new failures (``NCZMAP_HYPOTHESIS=explore``, as ``bench/explore.py`` sets it); what they find
becomes a fixed example (``@example``) in the test.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("NCZMAP_HYPOTHESIS", "ci"))
