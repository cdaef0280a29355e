"""Hypothesis profiles for every test folder.

``ci`` (the default, what the README's test command and CI run): derandomized, no example database, so
every run of a fresh clone draws the same examples. ``explore``: fresh randomness, for the separate runs
that look for new failures (``NCZMAP_HYPOTHESIS=explore``, as ``bench/explore.py`` sets it); what they find
becomes a fixed example (``@example``) in the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("NCZMAP_HYPOTHESIS", "ci"))


# ------------------------------------------------------------------------------- no process outlives
SESSION_MARK = "NCZMAP_TEST_SESSION"
# helpers multiprocessing starts for this process, which end when it ends (they watch its pipe)
ENDS_WITH_US = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _marked_processes(mark: str) -> list[tuple[int, str]]:
    """Processes other than this one whose environment carries ``mark`` (inherited from this session,
    whoever their parent is now: an orphan is reparented to init)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(helper in command for helper in ENDS_WITH_US):
            continue
        if f"{SESSION_MARK}={mark}".encode() in environ.split(b"\0") and command:
            found.append((int(entry), command))
    return found


@pytest.fixture(scope="session", autouse=True)
def no_process_outlives_the_session():
    """Every process a test starts (servers, pools, children of children) has ended when the session
    ends: those still running are listed as an error, and killed."""
    if not os.path.isdir("/proc"):
        yield
        return
    mark = uuid.uuid4().hex
    os.environ[SESSION_MARK] = mark
    yield
    deadline = time.monotonic() + 10
    left = _marked_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _marked_processes(mark)
    for pid, _ in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, "processes the tests started outlive them:\n" + "\n".join(
        f"{pid}: {command[:200]}" for pid, command in left
    )
