"""The ``icechunk`` driver: one branch, tag or snapshot of an Icechunk repository, through the ``icechunk``
library (``pip install nczmap[icechunk]``).

Opened from ``file:///data/repo#mode=icechunk`` (local storage), ``s3://bucket/prefix#mode=icechunk`` or a
path-style endpoint (``http://127.0.0.1:9000/bucket/prefix#mode=icechunk``), with ``&branch=B`` (default
``main``), ``&tag=T`` or ``&snapshot=ID``. Keys map 1:1 to the session's zarr store keys (``/v/zarr.json``,
``/v/c/0/0``): a repository holds Zarr v3 only, so any other key is refused on write (``KeyNameError``)
and has no content on read.

A tag or snapshot is read-only; a branch is writable (``r+``; ``a`` and ``w`` create the repository, and
the branch from ``main``'s head, when absent; ``w`` empties the branch's dataset). Writes go to one
Icechunk session and are committed at ``close`` with the ``message=`` option (default ``"nczmap"``),
rebased over other commits that do not conflict; :meth:`IcechunkMap.abort` (what a failing ``with``
block calls) discards them, so nothing is committed. Chunk data written before its array's ``zarr.json``
(the format layer writes metadata at flush) is held by the map until that ``zarr.json`` is written.

Virtual chunks are read only under the containers the user granted (``containers=``, ``--allow``), never
the repository's own say-so: a repository virtual chunk container is authorised in Icechunk only when a
grant covers it, or lies inside it (then every virtual chunk location under it is checked against the
grants when the map opens). Local containers are checked too, with symbolic links resolved. A chunk under
a container no grant covers is ``AccessDenied`` naming the key, the container and the grant to give,
before any byte of it is read (Icechunk refuses unauthorised containers itself).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime
import math
import os
import re
import stat
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from nczmap._lazy import numpy as np
from nczmap.concurrency import WIDTH
from nczmap.errors import (
    AccessDenied,
    DataError,
    DatasetExists,
    DatasetNotFound,
    DriverNotAvailable,
    EmptyError,
    KeyNameError,
    ModeError,
    NCZError,
    ReadOnlyError,
    StorageError,
)
from nczmap.manifest.containers import Container, as_containers, containing, normalize
from nczmap.url import ParsedURL
from nczmap.zmap import byteranges
from nczmap.zmap.base import Latency, ZMap
from nczmap.zmap.keys import ROOT, is_listable_name, sort_names

T = TypeVar("T")
DEFAULT_BRANCH = "main"
DEFAULT_MESSAGE = "nczmap"
ZARR_JSON = "zarr.json"
# a chunk write refused for these waits for its array's zarr.json (new, or grown), written at the next flush
STAGED = ("node-not-found", "invalid-chunk-index")
NOT_FOUND = (  # a branch, tag or snapshot that is not there
    "ref-not-found",
    "branch-not-found",
    "tag-not-found",
    "snapshot-not-found",
    "invalid-snapshot-id",
)
_PREFIX_IN_MESSAGE = re.compile(r"url prefix (\S+?),")
EXIT_GRACE = 0.05  # seconds a process that used Icechunk waits at exit (see _event_loop)


# ---------------------------------------------------------------------------------------------- event loop
_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _event_loop() -> asyncio.AbstractEventLoop:
    """One asyncio loop on a daemon thread, shared by every Icechunk map (the store's API is async)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="nczmap-icechunk", daemon=True).start()
            _loop = loop
            # icechunk's Rust threads drop the Python objects of a finished call (pyo3's task locals) a
            # moment after its result is in: when the interpreter is being finalized by then, the process
            # crashes (SIGSEGV after the command's whole output, about one exit in ten). Exiting a little
            # later lets them finish.
            atexit.register(time.sleep, EXIT_GRACE)
        return _loop


def run(factory: Callable[[], Awaitable[T]]) -> T:
    """Await ``factory()`` on the private loop from any other thread; its exception is raised here."""

    async def call() -> T:
        return await factory()

    return asyncio.run_coroutine_threadsafe(call(), _event_loop()).result()


def _icechunk():
    try:
        import icechunk
    except ImportError as exc:
        raise DriverNotAvailable(
            "Icechunk repositories need icechunk: pip install 'nczmap[icechunk]'"
        ) from exc
    if "ICECHUNK_LOG" not in os.environ:
        icechunk.set_logs_filter("error")  # not its warnings about local storage on every command
    return icechunk


# ---------------------------------------------------------------------------------------------- the driver
class IcechunkMap(ZMap):
    driver = "icechunk"
    latency = Latency.LOCAL

    def __init__(
        self,
        url: ParsedURL,
        mode: str,
        containers: object = None,
        message: str = DEFAULT_MESSAGE,
        virtual_containers: Iterable[Container] = (),
    ) -> None:
        super().__init__(url, mode)
        self.ic = _icechunk()
        self.branch, self.tag, self.snapshot = _version(url, mode)
        self.message = message
        self.grants = as_containers(containers)
        self._new_containers = list(virtual_containers)
        self._options = {"containers": containers, "message": message}
        self._pending: dict[str, bytes] = {}  # chunk keys written before their array's zarr.json
        self.commit_metadata: dict | None = None  # stored with the commit (what made it, for appends)
        self.rebase = True  # a commit is rebased over other commits that do not conflict with it
        self._lock = threading.Lock()
        self._staging: _Staging | None = None  # a large write's own branch (see stage)
        self.storage = self._storage()
        self.repository = self._open_repository()
        self.session = self._open_session()
        self.store = self.session.store._store  # icechunk's PyStore: async get/set/list_dir
        self._check_locations()

    @property
    def io_width(self) -> int:
        return WIDTH if self.url.on_s3 else super().io_width

    def reopen_options(self) -> dict[str, object]:
        return dict(self._options)

    @property
    def version(self) -> str:
        """What this map shows: ``branch main``, ``tag v1`` or ``snapshot ID``."""
        if self.tag is not None:
            return f"tag {self.tag}"
        if self.snapshot is not None:
            return f"snapshot {self.snapshot}"
        return f"branch {self.branch}"

    @property
    def snapshot_id(self) -> str:
        """The snapshot this map's session started from."""
        return self.session.snapshot_id

    # ----------------------------------------------------------------- opening
    def _storage(self):
        url = self.url
        try:
            if not url.on_s3:
                return self.ic.local_filesystem_storage(url.path)
            return self.ic.s3_storage(
                bucket=url.bucket or "", prefix=url.path.strip("/") or None, **s3_settings(url)
            )
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "open") from exc

    def _open_repository(self):
        ic = self.ic
        try:
            config = ic.Repository.fetch_config(self.storage)
        except ic.RepositoryNotFoundError as exc:
            if self.mode in ("r", "r+"):
                raise self._error(exc, "open") from exc
            config = None  # created below
        except ic.IcechunkError as exc:
            raise self._error(exc, "open") from exc
        self._config_changed = False
        if self._new_containers:
            held = set(getattr(config, "virtual_chunk_containers", None) or {}) if config else set()
            config = config or ic.RepositoryConfig.default()
            for container in self._new_containers:
                config.set_virtual_chunk_container(virtual_chunk_container(container))
                self._config_changed = self._config_changed or container.prefix not in held
        authorised = self._authorised = self._authorise(config)
        try:
            if self.mode in ("r", "r+"):
                return ic.Repository.open(self.storage, config, authorize_virtual_chunk_access=authorised)
            return ic.Repository.open_or_create(
                self.storage, config, authorize_virtual_chunk_access=authorised
            )
        except ic.IcechunkError as exc:
            raise self._error(exc, "open") from exc

    def _authorise(self, config) -> dict[str, Any] | None:
        """Icechunk's ``authorize_virtual_chunk_access``: the repository's containers a grant covers or
        lies in. Those needing every location checked are kept in ``_checked``."""
        self._checked: list[str] = []
        containers = getattr(config, "virtual_chunk_containers", None) or {}
        authorised: dict[str, Any] = {}
        for prefix in containers:
            found = self._grant_for(prefix)
            if found is None:
                continue
            grant, covered = found
            authorised[prefix] = self._credentials(prefix, grant)
            if not covered or prefix.startswith("file:"):
                self._checked.append(prefix)
        return self.ic.containers_credentials(authorised) if authorised else None

    def _grant_for(self, prefix: str) -> tuple[Container, bool] | None:
        """The grant covering ``prefix`` (and True), or one inside it (and False), or None."""
        try:
            canonical = normalize(prefix, None, directory=True)
        except AccessDenied:
            return None  # a scheme nczmap cannot grant (gcs, azure...): never authorised
        covering = containing(canonical, self.grants)
        if covering is not None:
            return covering, True
        inside = [g for g in self.grants if g.prefix.startswith(canonical)]
        return (inside[0], False) if inside else None

    def _credentials(self, prefix: str, grant: Container):
        ic = self.ic
        if prefix.startswith("file:"):
            return ic.credentials.LocalFileSystemAccess
        if prefix.startswith(("http:", "https:")):
            return ic.credentials.HttpAccess
        profile = grant.options.get("profile")
        return s3_credentials(ic, str(profile) if profile else None)

    def _open_session(self):
        repo = self.repository
        try:
            if self.mode == "r":
                return repo.readonly_session(self.branch, tag=self.tag, snapshot_id=self.snapshot)
            self._ensure_branch()
            session = repo.writable_session(self.branch)
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "open") from exc
        if self.mode == "w":
            try:
                session.store.sync_clear()
            except self.ic.IcechunkError as exc:
                raise self._error(exc, "empty") from exc
        return session

    def _ensure_branch(self) -> None:
        """A missing branch is made from ``main``'s head for ``a`` and ``w``; ``r+`` needs it to exist."""
        repo = self.repository
        if self.branch in repo.list_branches():
            return
        if self.mode == "r+":
            raise DatasetNotFound(f"no branch {self.branch!r} in the Icechunk repository {self.location}")
        repo.create_branch(self.branch, repo.lookup_branch(DEFAULT_BRANCH))

    def _check_locations(self) -> None:
        """Every virtual chunk location under a container authorised for a narrower grant (or a local one,
        whose links could lead out) must lie under a grant: checked before any chunk is read."""
        if not self._checked:
            return
        try:
            locations = self.session.all_virtual_chunk_locations()
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "list the virtual chunk locations of") from exc
        directories: dict[str, str | None] = {}  # a local directory's real path, resolved once
        for location in sorted(locations):
            if any(location.startswith(prefix) for prefix in self._checked):
                self._check_location(location, directories)

    def _check_location(self, location: str, directories: dict[str, str | None]) -> None:
        try:
            canonical = _local_real(location, directories) or normalize(location, None)
        except AccessDenied as exc:
            raise AccessDenied(f"{self.location} ({self.version}): {exc}") from None
        if containing(canonical, self.grants) is None:
            grant = canonical.rsplit("/", 1)[0] + "/"
            raise AccessDenied(
                f"the Icechunk repository {self.location} ({self.version}) has a virtual chunk in "
                f"{location!r} ({canonical}), which is outside every granted container: grant it with "
                f"containers=[{grant!r}] (Python) or --allow {grant} (command line)"
            )

    # ----------------------------------------------------------------- errors
    def _error(self, exc: Exception, action: str, key: str = "") -> NCZError:
        return translate(self.ic, exc, action, self.location, self.version, key)

    def _call(self, factory: Callable[[], Awaitable[T]], action: str, key: str) -> T:
        try:
            return run(factory)
        except self.ic.IcechunkError as exc:
            raise self._error(exc, action, key) from exc

    @staticmethod
    def _path(key: str) -> str:
        return key[1:]

    def _missing(self, exc: Exception) -> bool:
        """Icechunk's ways of saying a key has no content (a KeyError, no node, or not a Zarr key)."""
        kind = str(getattr(exc, "kind", ""))
        return isinstance(exc, KeyError) or kind in ("node-not-found", "invalid-key", "not-an-array")

    # ----------------------------------------------------------------- primitives
    def _exists(self, key: str) -> bool:
        if key in self._pending:
            return True
        try:
            return bool(run(lambda: self.store.exists(self._path(key))))
        except Exception as exc:
            if self._missing(exc):
                return False
            raise self._translated(exc, "look up", key) from exc

    def _len(self, key: str) -> int:
        if key in self._pending:
            return len(self._pending[key])
        if not self._exists(key):  # getsize says 0 for a missing chunk
            raise EmptyError(key, self.location)
        try:
            return int(run(lambda: self.store.getsize(self._path(key))))
        except Exception as exc:
            if self._missing(exc):
                raise EmptyError(key, self.location) from None
            raise self._translated(exc, "size", key) from exc

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        if key in self._pending:
            data = self._pending[key]
            return data[start:] if count is None else data[start : start + count]
        if start == 0 and count is None:
            return self._get(key, (None, None))
        size = self._len(key)  # Icechunk refuses a range past the end: cut it short here
        end = size if count is None else min(size, start + count)
        return self._get(key, (start, end)) if start < end else b""

    def _get(self, key: str, byte_range: tuple[int | None, int | None]) -> bytes:
        try:
            return bytes(run(lambda: self.store.get(self._path(key), byte_range)))
        except Exception as exc:
            if self._missing(exc):
                raise EmptyError(key, self.location) from None
            raise self._translated(exc, "read", key) from exc

    def _translated(self, exc: Exception, action: str, key: str) -> Exception:
        if isinstance(exc, self.ic.IcechunkError):
            return self._error(exc, action, key)
        if isinstance(exc, NCZError):
            return exc
        return StorageError(
            f"cannot {action} {key!r} in the Icechunk repository {self.location} ({self.version}): {exc}"
        )

    def _search(self, prefix: str) -> list[str]:
        path = "" if prefix == ROOT else prefix[1:] + "/"

        async def listing() -> list[str]:
            return [name async for name in self.store.list_dir(path)]

        try:
            names = set(run(listing))
        except Exception as exc:
            if self._missing(exc):
                names = set()
            else:
                raise self._translated(exc, "list", prefix) from exc
        below = "/" + path
        for key in list(self._pending):
            if key.startswith(below):
                names.add(key[len(below) :].split("/", 1)[0])
        return sort_names(name.rstrip("/") for name in names if is_listable_name(name.rstrip("/")))

    def _write(self, key: str, data: memoryview) -> None:
        value = bytes(data)
        try:
            run(lambda: self.store.set(self._path(key), value))
        except self.ic.IcechunkError as exc:
            if str(getattr(exc, "kind", "")) not in STAGED or key.endswith("/" + ZARR_JSON):
                raise self._write_error(exc, key) from exc
            with self._lock:
                self._pending[key] = value  # its array's zarr.json comes at the next flush
            return
        self._pending.pop(key, None)
        if key.rpartition("/")[2] == ZARR_JSON:
            self._write_pending(key.rpartition("/")[0])

    def _write_pending(self, array: str) -> None:
        """The chunks of ``array`` written before its metadata, now that it exists."""
        with self._lock:
            ready = {k: v for k, v in self._pending.items() if k.startswith(array + "/")}
        for key, value in ready.items():
            self._write(key, memoryview(value))

    def _write_error(self, exc: Exception, key: str) -> NCZError:
        kind = str(getattr(exc, "kind", ""))
        if kind in ("invalid-key", "unimplemented", "not-an-array", "node-not-found", "invalid-chunk-index"):
            return KeyNameError(
                f"cannot write {key!r} in the Icechunk repository {self.location} ({self.version}): an "
                f"Icechunk repository holds Zarr v3 only (zarr.json metadata and its arrays' chunk keys) "
                f"[{_first_line(exc)}]"
            )
        if kind == "zero-length-chunk":
            return DataError(f"cannot write {key!r} in {self.location} ({self.version}): an empty chunk")
        return self._error(exc, "write", key)

    def set_virtual_ref(
        self, key: str, location: str, offset: int, length: int, checksum: object = None
    ) -> None:
        """Make chunk ``key`` refer to ``length`` bytes at ``offset`` of ``location`` (under one of the
        repository's virtual chunk containers; its array's ``zarr.json`` must be written). ``checksum``:
        the source's ETag or last-modified time, which Icechunk checks before reading."""
        key = self._key(key, writing=True)
        try:
            self.session.store.set_virtual_ref(
                self._path(key), location, offset=offset, length=length, checksum=checksum
            )
        except self.ic.IcechunkError as exc:
            raise self._error(exc, f"refer to {location} from", key) from exc

    def set_virtual_block(
        self,
        array: str,
        grid: tuple[int, ...],
        origin: tuple[int, ...],
        locations: list[str],
        offsets: np.ndarray,
        lengths: np.ndarray,
        checksum: object = None,
    ) -> None:
        """Make the chunks of a block of ``array``'s chunk grid refer to sources at once (Icechunk's
        vectorised ``set_virtual_refs_arr``): the block's chunks in C order, ``grid`` chunks in all from
        chunk ``origin``; chunk ``i`` refers to ``lengths[i]`` bytes at ``offsets[i]`` of ``locations[i]``
        ("": left as it is). ``checksum``: the sources' ETag or last-modified time."""
        array = self._key(array, writing=True)
        try:
            failed = self.session.store.set_virtual_refs_arr(
                self._path(array),
                tuple(grid),
                locations,
                np.ascontiguousarray(offsets, dtype=np.uint64),
                np.ascontiguousarray(lengths, dtype=np.uint64),
                arr_offset=tuple(origin),
                checksum=checksum,
            )
        except self.ic.IcechunkError as exc:
            source = next((location for location in locations if location), "?")
            raise self._error(exc, f"refer to {source} from", array) from exc
        if failed:
            raise DataError(
                f"cannot refer from {len(failed)} chunks of {array!r} in {self.location} (the first: "
                f"{tuple(failed[0])}) to their sources: outside every virtual chunk container"
            )

    def copy_from(self, source: ZMap, source_key: str, key: str) -> bool:
        """From a manifest, a reference to a source becomes a virtual chunk of the same bytes, checked by
        the source's ETag or modification time as the manifest recorded it (the source must lie in one of
        the repository's virtual chunk containers); anything else is copied as data."""
        from nczmap.zmap.manifest import ManifestMap

        if isinstance(source, ManifestMap):
            found = source.source_reference(source_key)
            if found is not None:
                location, offset, length, recorded = found
                self.set_virtual_ref(key, location, offset, length, checksum(recorded or {}))
                return True
        return super().copy_from(source, source_key, key)

    def chunk_references(self, array: str) -> list[tuple]:
        """Every chunk of the array at key ``array``, as icechunk's columnar batches ``(coords, kinds,
        paths, offsets, lengths, inlined)`` (``icechunk.ChunkType`` kinds; a virtual chunk's path is its
        location, a native one's its chunk id)."""
        path = self._path(self._key(array))

        async def batches() -> list[tuple]:
            return [batch async for batch in self.session.store.array_chunk_iterator(path, 100_000)]

        try:
            return run(batches)
        except Exception as exc:
            raise self._translated(exc, "list the chunks of", array) from exc

    def latest_metadata(self, key: str) -> object:
        """The ``key`` entry of the newest commit metadata holding one, back from this map's snapshot
        (what the last commit of a tool recorded, whatever commits came after it); None if none does."""
        try:
            for info in self.repository.ancestry(snapshot_id=self.snapshot_id):
                metadata = info.metadata or {}
                if key in metadata:
                    return metadata[key]
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "read the history of") from exc
        return None

    def virtual_refs(self) -> list[str]:
        """Every virtual chunk location of the session (the sources the repository refers to)."""
        try:
            return sorted(self.session.all_virtual_chunk_locations())
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "list the virtual chunk locations of") from exc

    def _delete(self, key: str) -> None:
        with self._lock:
            for pending in [k for k in self._pending if k == key or k.startswith(key + "/")]:
                del self._pending[pending]
        path = self._path(key)
        if self._exists(key):
            self._call(lambda: self.store.delete(path), "delete", key)
        else:
            self._call(lambda: self.store.delete_dir(path), "delete", key)

    def _truncate(self) -> None:
        self._pending.clear()
        try:
            self.session.store.sync_clear()
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "empty") from exc

    def _close(self, delete: bool) -> None:
        if self.readonly:
            return
        try:
            if delete:
                self._truncate()
            self._commit()
        except BaseException:
            self._discard()
            raise

    # ----------------------------------------------------------------- large writes
    def stage(self, split: tuple[int, int]) -> None:
        """Write what follows on a branch of its own, committed part by part (:meth:`checkpoint`), and
        move this map's branch to the last part once, when the map is closed: readers of the branch see
        the dataset before or after, never a part of it, and a commit's memory follows its part, not the
        whole write. ``split``: the axis along which the repository's manifests are split, every
        ``split[1]`` chunks, so that a part's commit writes only its own manifests (the split is this
        writer's; the repository's saved configuration is left as it is).
        Only before anything is written, on a branch (not a tag or snapshot)."""
        ic = self.ic
        if self.readonly or self._staging is not None or self.tag is not None or self.snapshot is not None:
            raise StorageError(f"cannot stage a write to {self.location} ({self.version})")
        axis, size = ic.ManifestSplitDimCondition.Axis(split[0]), split[1]
        splitting = ic.ManifestSplittingConfig.from_dict({ic.ManifestSplitCondition.AnyArray(): {axis: size}})
        config = self.repository.config
        config.manifest = ic.ManifestConfig(splitting=splitting)
        base = self.session.snapshot_id
        name = f"{self.branch}.nczmap-{os.getpid()}-{time.monotonic_ns():x}"
        try:
            self.session.discard_changes()
            repository = self.repository.reopen(
                config=config, authorize_virtual_chunk_access=self._authorised
            )
            repository.create_branch(name, base)
            session = repository.writable_session(name)
            if self.mode == "w":
                session.store.sync_clear()
        except ic.IcechunkError as exc:
            raise self._error(exc, "stage a write to") from exc
        self._staging = _Staging(name, base, repository)
        self.session, self.store = session, session.store._store

    def checkpoint(self) -> None:
        """Commit what a staged write holds so far as a part (on its own branch); go on in a new session."""
        staging = self._staging
        if staging is None or self._pending or not self.session.has_uncommitted_changes:
            return
        staging.parts += 1
        try:
            self.session.commit(f"{self.message} (part {staging.parts}, in progress)")
            session = staging.repository.writable_session(staging.branch)
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "commit a part to") from exc
        self.session, self.store = session, session.store._store

    def _finish_staged(self, staging: _Staging) -> None:
        """The last part committed, then this map's branch moved to it (if no one moved it meanwhile)."""
        repository = staging.repository
        try:
            # the head carries the message and metadata (what appends read), parts left or not
            self.session.commit(self.message, metadata=self.commit_metadata, allow_empty=True)
            head = repository.lookup_branch(staging.branch)
        except self.ic.IcechunkError as exc:
            raise self._error(exc, "commit to") from exc
        try:
            repository.reset_branch(self.branch, head, from_snapshot_id=staging.base)
        except self.ic.IcechunkError as exc:
            self._staging = None  # kept: the write is there
            raise StorageError(
                f"{self.location}: the write is committed on branch {staging.branch!r} (snapshot {head}), "
                f"but branch {self.branch!r} was moved meanwhile and was left as it is ({_first_line(exc)})"
            ) from exc
        self._staging = None
        with contextlib.suppress(self.ic.IcechunkError):
            repository.delete_branch(staging.branch)

    def _commit(self) -> None:
        if self._pending:
            keys = ", ".join(sorted(self._pending)[:3])
            raise StorageError(
                f"nothing committed to {self.location} ({self.version}): chunks were written with no "
                f"zarr.json for their array ({keys}...)"
            )
        session = self.session
        if self._staging is not None:
            self._finish_staged(self._staging)
        elif not session.has_uncommitted_changes:
            return
        else:
            try:
                rebase = self.ic.ConflictDetector() if self.rebase else None
                session.commit(self.message, metadata=self.commit_metadata, rebase_with=rebase)
            except self.ic.IcechunkError as exc:
                raise self._error(exc, "commit to") from exc
        if self._config_changed:  # after the commit: a refused commit leaves the configuration as it was
            try:
                self.repository.save_config()
            except self.ic.IcechunkError as exc:
                raise StorageError(
                    f"committed to {self.location} ({self.version}), but its new virtual chunk containers "
                    f"could not be saved ({_first_line(exc)}): readers cannot read the new chunks until "
                    "they are; write again to save them"
                ) from exc

    def _discard(self) -> None:
        self._pending.clear()
        staging, self._staging = self._staging, None
        if staging is not None:  # its parts never reach this map's branch
            with contextlib.suppress(self.ic.IcechunkError):
                staging.repository.delete_branch(staging.branch)
        if not self.readonly and self.session.has_uncommitted_changes:
            # the session is dropped with the map anyway: nothing reaches the repository
            with contextlib.suppress(self.ic.IcechunkError):
                self.session.discard_changes()

    def abort(self) -> None:
        """Close without committing: the session's changes are discarded."""
        if self.closed:
            return
        self._discard()
        self._closed = True


# ---------------------------------------------------------------------------------------------- helpers
class _Staging:
    """A staged write: its branch, the snapshot it started from, the repository writing it, parts made."""

    def __init__(self, branch: str, base: str, repository) -> None:
        self.branch, self.base, self.repository = branch, base, repository
        self.parts = 0


def _local_real(location: str, directories: dict[str, str | None]) -> str | None:
    """The canonical ``file://`` URL of a plain local location (``file:///dir/name``) whose name is not a
    symbolic link, its directory resolved once for all its files (``directories``); None for anything
    else (then normalised in full)."""
    if (
        not location.startswith("file:///")
        or "%" in location
        or "\x00" in location
        or location != location.strip()
    ):
        return None
    directory, _, name = location[len("file://") :].rpartition("/")
    if not name or name in (".", "..") or "/./" in directory + "/" or "/../" in directory + "/":
        return None
    if directory not in directories:
        held = directory or "/"
        directories[directory] = os.path.realpath(held) if os.path.isdir(held) else None
    real = directories[directory]
    if real is None:
        return None
    path = os.path.join(directory or "/", name)
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return None
    except OSError:
        return None
    return "file://" + (real.rstrip("/") + "/" + name)


def _version(url: ParsedURL, mode: str) -> tuple[str | None, str | None, str | None]:
    """(branch, tag, snapshot) the URL names: one of them, ``branch=main`` when none."""
    fragment = url.fragment
    given = {name: fragment.get(name) for name in ("branch", "tag", "snapshot") if name in fragment}
    for name, value in given.items():
        if not value:
            raise ModeError(f"{name}= needs a value in {url.original!r}")
    if len(given) > 1:
        raise ModeError(f"{url.original!r} names {' and '.join(given)}: give one of branch=, tag=, snapshot=")
    if mode != "r" and ("tag" in given or "snapshot" in given):
        what = "tag" if "tag" in given else "snapshot"
        raise ModeError(
            f"a {what} of an Icechunk repository is read-only: open {url.original!r} with mode 'r', or "
            f"name a branch (branch=) to write"
        )
    branch = given.get("branch") or (None if given else DEFAULT_BRANCH)
    return branch, given.get("tag"), given.get("snapshot")


def s3_settings(url: ParsedURL) -> dict[str, Any]:
    """``icechunk.s3_storage`` keywords for a repository in S3: region, endpoint and credentials as
    nczmap's s3 driver finds them (``AWS_*``, ``~/.aws``, ``#aws.profile=``, ``aws.profile=no``)."""
    profile = url.profile or os.environ.get("AWS_PROFILE")
    settings: dict[str, Any] = {"region": byteranges._region(url.region, profile or "default")}
    if url.endpoint:
        settings.update(
            endpoint_url=url.endpoint, allow_http=url.endpoint.startswith("http://"), force_path_style=True
        )
    settings.update(_credential_keywords(profile))
    return settings


def _credential_keywords(profile: str | None) -> dict[str, Any]:
    if profile and profile.lower() in byteranges.ANONYMOUS_PROFILES:
        return {"anonymous": True}
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        keys = {
            "access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
            "secret_access_key": os.environ.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": os.environ.get("AWS_SESSION_TOKEN"),
        }
        return {k: v for k, v in keys.items() if v}
    found = byteranges._profile_credentials(profile or "default")
    return found if found else {"from_env": True}


def s3_credentials(ic, profile: str | None):
    """Icechunk credentials for a virtual chunk container in S3, found as for the repository."""
    keywords = _credential_keywords(profile or os.environ.get("AWS_PROFILE"))
    if keywords.get("anonymous"):
        return ic.s3_anonymous_credentials()
    if keywords.get("from_env"):
        return ic.s3_from_env_credentials()
    return ic.s3_static_credentials(**keywords)


def virtual_chunk_container(container: Container):
    """The Icechunk ``VirtualChunkContainer`` for a granted prefix (file, s3 or http(s))."""
    ic = _icechunk()
    prefix = container.prefix
    if prefix.startswith("file://"):
        return ic.VirtualChunkContainer(prefix, ic.local_filesystem_store(prefix[len("file://") :]))
    if prefix.startswith(("http://", "https://")):
        return ic.VirtualChunkContainer(prefix, ic.http_store())
    options = container.options
    endpoint = options.get("endpoint")
    profile = options.get("profile") or os.environ.get("AWS_PROFILE")
    region = byteranges._region(options.get("region"), profile or "default")  # type: ignore[arg-type]
    if endpoint:
        store = ic.s3_store(
            region=region,
            endpoint_url=str(endpoint),
            allow_http=str(endpoint).startswith("http://"),
            s3_compatible=True,
            force_path_style=True,
        )
    else:
        store = ic.s3_store(region=region)
    return ic.VirtualChunkContainer(prefix, store)


def checksum(recorded: dict) -> str | datetime.datetime | None:
    """The ``set_virtual_ref`` checksum of a source: its ETag, else its modification time (to the next
    whole second: Icechunk compares seconds and refuses an object modified after it)."""
    if recorded.get("etag"):
        return str(recorded["etag"])
    if "mtime" in recorded:
        seconds = math.ceil(recorded["mtime"] / 1e9)
        return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return None


def translate(ic, exc: Exception, action: str, location: str, version: str, key: str = "") -> NCZError:
    """The nczmap error for an Icechunk one, naming the repository, the branch/tag/snapshot and the key."""
    kind = str(getattr(exc, "kind", ""))
    what = f"{key!r} in " if key else ""
    where = f"{what}the Icechunk repository {location} ({version})"
    text = _first_line(exc)
    if kind in ("unauthorized-virtual-chunk-container", "no-container-for-virtual-chunk"):
        return _access_denied(exc, where, kind)
    if isinstance(exc, ic.RepositoryNotFoundError):
        return DatasetNotFound(f"no Icechunk repository at {location}")
    if kind in NOT_FOUND:
        return DatasetNotFound(f"cannot {action} {where}: {text}")
    if kind == "parent-directory-not-clean":
        return DatasetExists(f"cannot create an Icechunk repository at {location}: something else is there")
    if kind == "virtual-chunk-modified":
        return StorageError(f"cannot {action} {where}: the source of a virtual chunk changed ({text})")
    if isinstance(exc, ic.ReadOnlyError):
        return ReadOnlyError(f"cannot {action} {where}: it is read-only")
    if isinstance(exc, ic.ConflictError):
        return StorageError(f"cannot {action} {where}: another commit conflicts ({text}); nothing committed")
    return StorageError(f"cannot {action} {where}: {text}" + (f" ({kind})" if kind else ""))


def _access_denied(exc: Exception, where: str, kind: str) -> AccessDenied:
    match = _PREFIX_IN_MESSAGE.search(str(exc))
    if kind == "no-container-for-virtual-chunk" or match is None:
        return AccessDenied(
            f"{where} is a virtual chunk in no container of the repository: {_first_line(exc)}"
        )
    prefix = match.group(1)
    return AccessDenied(
        f"{where} is a virtual chunk under {prefix}, which is not granted: grant it with "
        f"containers=[{prefix!r}] (Python) or --allow {prefix} (command line)"
    )


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["IcechunkMap", "checksum", "s3_settings", "translate", "virtual_chunk_container"]
