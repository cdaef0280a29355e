"""Reading byte ranges of one object: a local file (positional reads) or an object in an obstore store.

Every driver reads through here: the file driver (a file per key), the zip driver (members at offsets of
the archive), the s3 driver (GETs and range GETs), and the manifest driver (ranges of other files and of
S3 objects; HTTP(S) URLs go through ``nczmap.zmap.http``, which merges ranges here too). Reads come as
batches (:func:`read_file_ranges`, :func:`get_object_ranges`) so that neighbouring ranges can be merged
into one read (:func:`merge_ranges`) and split back; single-range functions are the fast path for a batch
of one. The S3 store set-up lives here too, so anything that reads S3 objects gets the same credentials,
timeouts and error codes.

Ranges are ``(start, length)``. A range reaching past the end of a file is cut short
(:func:`read_range`), or is an error where the caller knows how much must be there (:func:`read_exact`).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from nczmap.errors import AccessDenied, DatasetNotFound, DriverNotAvailable, NCZError, StorageError

FIRST_READ_BYTES = 1 << 16  # a whole-object read tries this much first: metadata fits, so no fstat


# -------------------------------------------------------------------------------------------- policy
@dataclass(frozen=True)
class RequestPolicy:
    """How long one request to a remote source may take, and how failures are retried.

    Every request has an overall deadline, :meth:`deadline_for` its length: ``deadline`` seconds plus
    the length at ``rate`` bytes a second (30 s + 1 s a MB by default: a 64 KiB read may take 30 s, a
    64 MiB span 97 s), whatever the server does (a server trickling one byte every few seconds included).
    A failure worth another attempt (5xx, 408, 429, a refused or reset connection, a body cut short, a
    timeout or a passed deadline) is retried up to ``attempts`` attempts in all, after an exponential
    back-off with full jitter (a random wait up to ``backoff`` seconds, doubling each time up to
    ``max_backoff``), or after the time a ``Retry-After`` answer asks for; no attempt starts more than
    ``budget`` seconds after the source's first failed attempt (since its last success): the budget is the
    source's, shared by all its requests (:class:`Failures`), so a source stuck from its first request
    fails within ``budget`` plus one request's deadline of it, whatever path reads it. Other 4xx answers are
    never retried. Picklable (sources carry it to other processes).
    """

    deadline: float = 30.0
    rate: float = 1e6
    attempts: int = 10
    budget: float = 120.0
    backoff: float = 0.1
    max_backoff: float = 2.0

    def __post_init__(self) -> None:
        for name in ("deadline", "rate", "budget"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts must be a positive whole number, not {self.attempts!r}")

    def deadline_for(self, length: int) -> float:
        """Seconds a request for ``length`` bytes may take, from sending it to its last byte."""
        return self.deadline + max(0, length) / self.rate

    def wait(self, retry: int) -> float:
        """The back-off before retry number ``retry`` (1, 2...): full jitter."""
        import random

        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (retry - 1)))


DEFAULT_POLICY = RequestPolicy()


class _Streak:
    """A source's failed attempts since its last success: when the first of them began, when the last
    ended, how many, the last one's message, and whether the source was given up."""

    __slots__ = ("attempts", "began", "failure", "last", "more", "spent")

    def __init__(self, began: float) -> None:
        self.began, self.last, self.attempts, self.failure, self.spent = began, began, 0, "", False
        self.more = False  # some attempts were a client's own retries, not counted

    def tried(self, now: float) -> str:
        count = f"at least {self.attempts}" if self.more else str(self.attempts)
        plural = "s" if self.attempts > 1 or self.more else ""
        return f"{count} attempt{plural} in {now - self.began:.1f} s"


class Failures:
    """The retry budget of each source (a URL), shared by every request made for it, whatever path makes
    them (first reads made together, parses' reads, reads through a manifest) and however many readers
    the source has: the budget counts from the start of the source's first failed attempt since its last
    success, and no attempt of the source starts past it. Once given up, the source's requests fail at
    once (no request) with the failure that ended it, the attempts and the time spent, until a success,
    until ``budget`` seconds pass with no request failing, or until a new ``virtualize`` run starts
    (:meth:`forget`). Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.streaks: dict[str, _Streak] = {}

    def refusal(self, source: str, policy: RequestPolicy, wait: float = 0.0) -> str | None:
        """None when an attempt may start after ``wait`` seconds; else why the source is given up (the
        message of its last failure, with the attempts and time spent)."""
        now = time.monotonic()
        with self.lock:
            streak = self.streaks.get(source)
            if streak is None:
                return None
            if now - streak.last > policy.budget:  # left alone that long: a fresh start
                del self.streaks[source]
                return None
            if not streak.spent and now + wait - streak.began <= policy.budget:
                return None
            streak.spent = True
            return f"{streak.failure} ({streak.tried(now)}; the retry budget of {policy.budget:g} s is spent)"

    def failed(
        self, source: str, began: float, failure: str, spent: bool = False, attempts: int | None = 1
    ) -> None:
        """An attempt that began at ``began`` (``time.monotonic()``) failed in a way that may pass (or
        ``attempts`` of it, a client's retries included; None: at least one, how many unknown); with
        ``spent``, the source is given up (its client retried it as far as the budget goes)."""
        now = time.monotonic()
        with self.lock:
            streak = self.streaks.get(source)
            if streak is None:
                streak = self.streaks[source] = _Streak(began)
            streak.began = min(streak.began, began)
            streak.last = max(streak.last, now)
            streak.attempts += attempts or 1
            streak.more = streak.more or attempts is None
            streak.failure = failure
            streak.spent = streak.spent or spent
            if len(self.streaks) > 4096:  # forget the oldest
                for old in sorted(self.streaks, key=lambda key: self.streaks[key].last)[:1024]:
                    del self.streaks[old]

    def forget(self) -> None:
        """Every source starts afresh (a new run: a source given up by an earlier one is tried again)."""
        with self.lock:
            self.streaks.clear()

    def succeeded(self, source: str) -> None:
        if self.streaks:
            with self.lock:
                self.streaks.pop(source, None)

    def summary(self, source: str, failure: str) -> str:
        """``failure`` with the source's attempts and time spent since its failures began."""
        with self.lock:
            streak = self.streaks.get(source)
            if streak is None or streak.attempts <= 1:
                return failure
            return f"{failure} ({streak.tried(time.monotonic())})"


FAILURES = Failures()  # the process's sources


def run_concurrently(tasks: Sequence[Callable[[], object]], width: int = 16) -> list:
    """Every task's result, in order, run ``width`` at a time on a pool of I/O threads (the caller runs
    the first itself, so a task never waits for a thread that cannot start); the first failure (in task
    order) is raised once every task started has ended. For requests: each thread mostly waits."""
    if len(tasks) <= 1 or width <= 1:
        return [task() for task in tasks]
    from concurrent.futures import wait

    pool = _fetchers()
    futures = [pool.submit(task) for task in tasks[1:]]
    results: list = [None] * len(tasks)
    error: BaseException | None = None
    try:
        results[0] = tasks[0]()
    except BaseException as exc:
        error = exc
        for future in futures:
            future.cancel()
    wait(futures)
    for index, future in enumerate(futures, 1):
        if future.cancelled():
            continue
        failure = future.exception()
        if failure is not None:
            error = error or failure
        else:
            results[index] = future.result()
    if error is not None:
        raise error
    return results


FETCH_THREADS = 64  # threads that wait on requests for run_concurrently (shared by the process)
_fetch_pool = None
_fetch_lock = threading.Lock()


def _fetchers():
    global _fetch_pool
    with _fetch_lock:
        if _fetch_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            _fetch_pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="nczmap-fetch")
        return _fetch_pool


def _forget_fetchers() -> None:  # in a forked child: the parent's threads are not there
    global _fetch_pool, _fetch_lock
    _fetch_pool, _fetch_lock = None, threading.Lock()
    FAILURES.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_fetchers)


# -------------------------------------------------------------------------------------------- merging
class Span(NamedTuple):
    """One read covering several requested ranges: ``[start, end)`` and the indices of those ranges."""

    start: int
    end: int
    members: list[int]


def merge_ranges(ranges: Sequence[tuple[int, int]], gap: int = 0, max_span: int = 64 << 20) -> list[Span]:
    """Group ranges whose gaps are at most ``gap`` bytes into spans no longer than ``max_span``.

    Overlapping and adjacent ranges always merge (gap 0); the result is in file order whatever the order
    of ``ranges``.
    """
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    spans: list[Span] = []
    for index in order:
        start, length = ranges[index]
        end = start + length
        if spans and start - spans[-1].end <= gap and max(end, spans[-1].end) - spans[-1].start <= max_span:
            last = spans[-1]
            last.members.append(index)
            spans[-1] = Span(last.start, max(last.end, end), last.members)
        else:
            spans.append(Span(start, end, [index]))
    return spans


# -------------------------------------------------------------------------------------------- local files
def read_range(fd: int, start: int, count: int | None) -> bytes:
    """``count`` bytes from ``start`` (to the end when None), cut short at the end of the file."""
    if count is None:
        first = os.pread(fd, FIRST_READ_BYTES, start)
        if len(first) < FIRST_READ_BYTES:
            return first
        # a big object: read it whole in one piece (gluing the first part on would copy it all again)
        return read_range(fd, start, max(0, os.fstat(fd).st_size - start))
    parts, wanted = [], count
    while wanted:
        part = os.pread(fd, wanted, start + count - wanted)
        if not part:
            break
        parts.append(part)
        wanted -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_into(fd: int, buffer: memoryview, start: int) -> int:
    """Fill ``buffer`` from ``start``; returns the bytes read (fewer at the end of the file)."""
    done = 0
    while done < len(buffer):
        count = os.preadv(fd, [buffer[done:]], start + done)
        if not count:
            break
        done += count
    return done


def read_exact(fd: int, length: int, offset: int, what: str) -> bytes:
    """Exactly ``length`` bytes at ``offset``; a file too short for them is a StorageError naming ``what``."""
    data = os.pread(fd, length, offset) if length else b""
    if len(data) != length:
        raise StorageError(f"{what!r} is truncated: {len(data)} of {length} bytes at offset {offset}")
    return data


def read_file_ranges(fd: int, ranges: Sequence[tuple[int, int]], what: str, gap: int = 0) -> list[bytes]:
    """Every range exactly (a short file is an error naming ``what``), neighbours read together."""
    results: list[bytes] = [b""] * len(ranges)
    for span in merge_ranges(ranges, gap):
        block = read_exact(fd, span.end - span.start, span.start, what)
        view = memoryview(block)
        for index in span.members:
            start, length = ranges[index]
            results[index] = bytes(view[start - span.start : start - span.start + length])
    return results


# -------------------------------------------------------------------------------------------- object stores
ANONYMOUS_PROFILES = ("no", "none", "anonymous")
CLIENT_OPTIONS = {"timeout": "15s", "connect_timeout": "5s"}  # with the retry limit: no hang past ~20 s
RETRY_SECONDS = 10  # obstore's retry_timeout (made a timedelta when a store is built)
MAX_RETRIES = 2
POLICY_SPAN = 8 << 20  # an S3 store built for a RequestPolicy times requests out at this range's deadline
SMALL_SPAN = 1 << 20  # ... and one for shorter reads (first blocks, metadata) at this one's
DENIED_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken")
_CODE = re.compile(r"<Code>([^<]+)</Code>")


def s3_store(
    bucket: str,
    *,
    endpoint: str | None,
    region: str | None,
    profile: str | None,
    policy: RequestPolicy | None = None,
    span: int = POLICY_SPAN,
):
    """An obstore ``S3Store`` for ``bucket`` with credentials as netcdf-c finds them.

    Credentials: the ``AWS_*`` variables, else the profile's keys in ``~/.aws/credentials``/``config``;
    profile ``no`` (or ``none``, ``anonymous``) sends unsigned requests. Region: the URL's, then
    ``AWS_REGION``/``AWS_DEFAULT_REGION``, then the profile's, then ``us-east-1``.

    Timeouts and retries: the s3 driver's (:data:`CLIENT_OPTIONS`, :data:`MAX_RETRIES` within
    :data:`RETRY_SECONDS`), or with ``policy`` (sources of virtual datasets) that policy as far as obstore
    takes it: its attempts, back-off and budget, and one overall timeout a request, the deadline of a
    ``span`` range (obstore has one timeout per store, not one per length: sources keep a store for reads
    up to :data:`SMALL_SPAN` and one for the longer ones, up to :data:`POLICY_SPAN`; it retries 5xx,
    dropped connections, bodies cut short and timeouts, but does not read ``Retry-After``).
    """
    try:
        from obstore.store import S3Store
    except ImportError as exc:
        raise DriverNotAvailable(f"reading s3://{bucket} needs obstore: pip install obstore") from exc
    profile = profile or os.environ.get("AWS_PROFILE")
    config: dict = {"region": _region(region, profile or "default")}
    client = dict(CLIENT_OPTIONS)
    if endpoint:
        config["endpoint"] = endpoint
        config["virtual_hosted_style_request"] = False
        client["allow_http"] = endpoint.startswith("http://")
    if profile and profile.lower() in ANONYMOUS_PROFILES:
        config["skip_signature"] = True
    elif not os.environ.get("AWS_ACCESS_KEY_ID"):
        config.update(_profile_credentials(profile or "default"))
    from datetime import timedelta

    retries: dict = {"max_retries": MAX_RETRIES, "retry_timeout": timedelta(seconds=RETRY_SECONDS)}
    if policy is not None:
        client["timeout"] = f"{max(1, round(policy.deadline_for(span) * 1000))}ms"
        client["connect_timeout"] = f"{max(1, round(min(5.0, policy.deadline) * 1000))}ms"
        client["pool_max_idle_per_host"] = "64"
        retries = {
            "max_retries": policy.attempts - 1,
            "retry_timeout": timedelta(seconds=policy.budget),
            "backoff": {
                "init_backoff": timedelta(seconds=policy.backoff),
                "max_backoff": timedelta(seconds=policy.max_backoff),
                "base": 2,
            },
        }
    return S3Store(bucket, config=config, client_options=client, retry_config=retries)


def credentials_found(profile: str | None) -> bool:
    """Whether :func:`s3_store` has credentials to sign with (or is told to send unsigned requests).
    Without them obstore asks the instance-metadata service, whose refusal reads like a 403."""
    profile = profile or os.environ.get("AWS_PROFILE")
    if profile and profile.lower() in ANONYMOUS_PROFILES:
        return True
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return True
    return bool(_profile_credentials(profile or "default"))


NO_CREDENTIALS = (
    "no AWS credentials were found: they are looked for in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, in the "
    "profile {profile!r} of ~/.aws/credentials and ~/.aws/config (AWS_PROFILE or #aws.profile= picks "
    "another), then the instance role; for public data add #aws.profile=no to the URL"
)


def _region(region: str | None, profile: str) -> str:
    return (
        region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or _profile_settings(profile).get("region")
        or "us-east-1"
    )


def _profile_settings(profile: str) -> dict[str, str]:
    """The named profile's settings from ``~/.aws/config`` and ``~/.aws/credentials`` (as netcdf-c reads)."""
    import configparser

    home = os.path.expanduser("~")
    files = (
        (os.environ.get("AWS_CONFIG_FILE") or os.path.join(home, ".aws", "config"), f"profile {profile}"),
        (os.environ.get("AWS_SHARED_CREDENTIALS_FILE") or os.path.join(home, ".aws", "credentials"), profile),
    )
    settings: dict[str, str] = {}
    for path, section in files:
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError):
            continue
        for name in (section, profile):
            if parser.has_section(name):
                settings.update(parser[name])
    return settings


def _profile_credentials(profile: str) -> dict[str, str]:
    settings = _profile_settings(profile)
    names = {
        "aws_access_key_id": "access_key_id",
        "aws_secret_access_key": "secret_access_key",
        "aws_session_token": "session_token",
    }
    return {ours: settings[theirs] for theirs, ours in names.items() if settings.get(theirs)}


def get_object(store, path: str) -> tuple[bytes, int]:
    """The whole object and its size (one GET). obstore errors pass through: see :func:`store_error`."""
    import obstore

    result = obstore.get(store, path)
    return bytes(result.bytes()), result.meta["size"]


def get_object_range(store, path: str, start: int, length: int) -> bytes:
    import obstore

    return bytes(obstore.get_range(store, path, start=start, length=length))


def get_object_ranges(store, path: str, ranges: Sequence[tuple[int, int]], gap: int = 1 << 20) -> list[bytes]:
    """Every range of one object; ranges within ``gap`` bytes go out as one request (obstore coalesces)."""
    import obstore

    if not ranges:
        return []
    parts = obstore.get_ranges(
        store, path, starts=[r[0] for r in ranges], lengths=[r[1] for r in ranges], coalesce=gap
    )
    return [bytes(part) for part in parts]


def head_size(store, path: str) -> int:
    import obstore

    return obstore.head(store, path)["size"]


def s3_error_code(text: str) -> str | None:
    """The S3 error code (``NoSuchBucket``, ``SlowDown``...) in an error's response body, if shown."""
    match = _CODE.search(text)
    return match.group(1) if match else None


def starts_past_end(exc: Exception) -> bool:
    """True for a store's answer to a range that starts past the object's end (416 / InvalidRange)."""
    text = str(exc)
    return s3_error_code(text) == "InvalidRange" or "416 Range Not Satisfiable" in text


def store_error(exc: Exception, where: str, bucket: str | None = None) -> NCZError | None:
    """The nczmap error for an obstore failure while doing ``where``; None when the object is missing."""
    import obstore.exceptions as errors

    text = str(exc)
    code = s3_error_code(text)
    if code == "NoSuchBucket":
        return DatasetNotFound(f"cannot {where}: bucket {bucket!r} does not exist")
    if isinstance(exc, FileNotFoundError):
        return None
    denied = code in DENIED_CODES or "403 Forbidden" in text
    if denied or isinstance(exc, (errors.PermissionDeniedError, errors.UnauthenticatedError)):
        return AccessDenied(f"cannot {where}: access denied ({code or _first_line(text)})")
    return StorageError(f"cannot {where}: {_first_line(text)}" + (f" ({code})" if code else ""))


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unknown error"
