"""The ``zip`` driver: a dataset inside a zip archive, read with the stdlib ``zipfile`` through fsspec.

Layout (netcdf-c ``zmap_zip.c``): every entry lives under one top-level folder named after the dataset
(``/x/ds.zip`` -> ``ds/``), with explicit directory entries; zips of a directory (``zip -r x.zip x.file``)
have the same shape. zarr-python ``ZipStore`` zips keep their entries at the root; both are read.

Unlike every peer, overwriting or deleting never leaves duplicate members: writes are staged in an
anonymous temporary file and the archive is rewritten at ``close`` into a temporary file that replaces the
old one by rename, so an interrupted session leaves the previous archive intact and readable. One writer at
a time (:mod:`nczmap.zmap.locking`), and a commit refuses to replace an archive that changed since this map
opened it (another program's commit), discarding this map's changes rather than that program's.

Archives are untrusted input: members are read and decompressed (deflate, bzip2, LZMA) here rather than by
``zipfile``, so that no declared size is believed beyond what the archive holds and no member decompresses
into more than its declared size (a zip bomb fails at its first block). Members that are no keys are copied
byte for byte on rewrite, never decoded, whatever they hold.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
import warnings
import zipfile
import zlib
from typing import IO, NamedTuple

from nczmap.errors import (
    DatasetExists,
    DatasetNotFound,
    EmptyError,
    KeyNameError,
    NCZError,
    StorageError,
    from_os_error,
)
from nczmap.url import ParsedURL
from nczmap.zmap import locking
from nczmap.zmap.base import STORE_MARKERS, ByteRange, ZMap
from nczmap.zmap.byteranges import read_exact
from nczmap.zmap.index import KeyIndex
from nczmap.zmap.keys import ROOT, TEMP_PREFIX, is_valid_key
from nczmap.zmap.osutil import remove_if_present

# Root objects that make a top-level folder look like a whole dataset (netcdf-c layout).
_GROUP_MARKERS = (".zgroup", ".zmetadata", ".nczarr", "zarr.json")
_LOCAL_HEADER = struct.Struct("<4s22xHH")
_LZMA_HEADER = struct.Struct("<HHBI")  # zip's own before the LZMA1 stream: version, 5, the LZMA1 properties
_ENCRYPTED = 0x01
_DATA_DESCRIPTOR = 0x08
_COPY_BLOCK = 4 << 20
_READ_BLOCK = 1 << 20  # compressed bytes read and decompressed at a time
MAX_NAME_BYTES = 0xFFFF  # a member name's length is a 16-bit field of both headers


class Staged(NamedTuple):
    """An object written in this session: ``size`` bytes at ``offset`` in the staging file."""

    offset: int
    size: int


class ZipMap(ZMap):
    driver = "zip"

    def __init__(self, url: ParsedURL, mode: str) -> None:
        super().__init__(url, mode)
        self.path = url.path
        self.prefix = url.dataset_name + "/"
        self.skipped: list[str] = []  # entry names that are not legal keys (never read)
        self._foreign: list[zipfile.ZipInfo] = []  # members that are no key: kept as they are on rewrite
        self._members: dict[str, zipfile.ZipInfo | Staged] = {}
        self._index = KeyIndex()
        self._data_offsets: dict[int, int] = {}  # local header offset -> data offset
        self._size = 0  # of the archive read
        self._filesystem = None
        self._archive: zipfile.ZipFile | None = None
        self._fd: int | None = None
        self._stage: IO[bytes] | None = None
        self._staged_size = 0
        self._lock = threading.Lock()
        self._dirty = False
        self._opened: tuple[int, ...] | None = None  # identity of the archive this map read (None: none)
        self._writer_lock: locking.WriterLock | None = None
        if mode != "r":
            if mode == "r+" and not os.path.lexists(self.path):
                raise DatasetNotFound(f"no zip archive at {self.path!r}")
            self._writer_lock = locking.acquire(self.path)
        try:
            self._open_archive()
        except BaseException:
            self._release()
            raise
        self._dirty = self._dirty or mode == "w"

    # ----------------------------------------------------------------- opening

    def reopen_recipe(self) -> tuple | None:
        if not self.readonly:
            # Each process would rewrite the whole archive at close: all but the last one's writes are lost.
            raise StorageError(
                f"{self.location} is a zip archive open for writing: it cannot be shared with other processes"
                " (write it from one process, or write a directory store and zip it)"
            )
        return super().reopen_recipe()

    def _open_archive(self) -> None:
        exists = os.path.lexists(self.path)
        if not exists and self.mode in ("r", "r+"):
            raise DatasetNotFound(f"no zip archive at {self.path!r}")
        if not exists:
            self._dirty = True
            return
        if os.path.isdir(self.path):
            raise DatasetExists(f"{self.path!r} is a directory, not a zip archive (use mode=file)")
        if self.mode == "w":
            self._check_clobber()
            self._opened = _identity(self.path)
            return
        self._load()

    def _check_clobber(self) -> None:
        try:
            filesystem = _open_zip(self.path, _open_descriptor(self.path))
        except StorageError as exc:
            raise DatasetExists(f"refusing to overwrite {self.path!r}: not a zip archive") from exc
        try:
            infos = filesystem.zip.infolist()
        finally:
            _close_zip(filesystem)
        prefix = find_layout([info.filename for info in infos], self.url.dataset_name)
        names = {info.filename for info in infos}
        if infos and not any(prefix + marker in names for marker in STORE_MARKERS):
            raise DatasetExists(f"refusing to overwrite {self.path!r}: the zip holds no Zarr/NCZarr store")

    def _load(self) -> None:
        # One open file for everything: the central directory and every member come from the same
        # archive even if another process replaces the path (as commits do) while this map is open.
        self._fd = _open_descriptor(self.path)
        self._opened = _identity(self._fd)
        self._size = os.fstat(self._fd).st_size
        self._filesystem = _open_zip(self.path, os.dup(self._fd))
        self._archive = self._filesystem.zip
        infos = self._archive.infolist()
        self.prefix = find_layout([info.filename for info in infos], self.url.dataset_name)
        for info in infos:
            self._add_entry(info)

    def _add_entry(self, info: zipfile.ZipInfo) -> None:
        name = info.filename
        if name == self.prefix:
            return
        if not name.startswith(self.prefix):
            self._foreign.append(info)
            return
        relative = name[len(self.prefix) :]
        is_dir = relative.endswith("/")
        key = "/" + (relative[:-1] if is_dir else relative)
        if not is_valid_key(key) or name != info.orig_filename:  # zipfile cut the name at a NUL
            self.skipped.append(info.orig_filename)
            self._foreign.append(info)
        elif is_dir:
            self._index.add_directory(key)
        else:
            self._members[key] = info  # a later duplicate member wins, as in every zip reader
            self._index.add(key)

    # ----------------------------------------------------------------- primitives
    def _exists(self, key: str) -> bool:
        return key in self._members

    def _member(self, key: str) -> zipfile.ZipInfo | Staged:
        try:
            return self._members[key]
        except KeyError:
            raise EmptyError(key, self.location) from None

    def _len(self, key: str) -> int:
        member = self._member(key)
        return member.size if isinstance(member, Staged) else member.file_size

    def _read(self, key: str, start: int, count: int | None) -> bytes:
        member = self._member(key)
        if isinstance(member, Staged):
            return self._read_staged(member, start, count)
        if member.compress_type == zipfile.ZIP_STORED and not member.flag_bits & 0x1:
            return self._read_stored(key, member, start, count)
        return self._read_compressed(member, start, count)

    def _byte_range(self, key: str) -> ByteRange:
        from nczmap.manifest.containers import normalize

        member = self._member(key)
        url = normalize(self.path, None, links=False)
        if isinstance(member, Staged):
            return ByteRange(key, url, 0, member.size, {}, "it is not written to the archive yet")
        stamp = {"size": self._size, "mtime": os.fstat(self._fd).st_mtime_ns}
        if member.flag_bits & 0x1:
            return ByteRange(key, url, 0, member.file_size, stamp, "its zip member is encrypted")
        if member.compress_type != zipfile.ZIP_STORED:
            why = f"its zip member is compressed (method {member.compress_type}), not stored"
            return ByteRange(key, url, 0, member.file_size, stamp, why)
        return ByteRange(key, url, self._data_offset(member), member.file_size, stamp)

    def _read_staged(self, member: Staged, start: int, count: int | None) -> bytes:
        available = max(0, member.size - start)
        length = available if count is None else min(count, available)
        return read_exact(self._stage.fileno(), length, member.offset + start, "staging file")

    def _read_stored(self, key: str, info: zipfile.ZipInfo, start: int, count: int | None) -> bytes:
        if info.file_size != info.compress_size:
            raise self._corrupt(info, f"stored, yet sized {info.file_size} and {info.compress_size}")
        available = max(0, info.file_size - start)
        length = available if count is None else min(count, available)
        if not length:
            return b""
        data = read_exact(self._fd, length, self._data_offset(info) + start, self.path)
        if length == info.file_size and zlib.crc32(data) != info.CRC:
            raise self._corrupt(info, "CRC mismatch")
        return data

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        """Where the member's stored bytes start, after a local header that must name the same member; all
        ``compress_size`` of them must lie in the archive."""
        offset = self._data_offsets.get(info.header_offset)
        if offset is None:
            if not 0 <= info.header_offset <= self._size - _LOCAL_HEADER.size:
                raise self._corrupt(info, f"its local header at {info.header_offset} is not in the archive")
            header = read_exact(self._fd, _LOCAL_HEADER.size, info.header_offset, self.path)
            signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
            start = info.header_offset + _LOCAL_HEADER.size
            offset = start + name_length + extra_length
            if offset + info.compress_size > self._size:
                raise self._corrupt(info, f"it runs past the end of the archive ({info.compress_size} bytes)")
            name = read_exact(self._fd, name_length, start, self.path)
            if signature != b"PK\x03\x04" or name != _encoded_name(info):
                why = "its local header does not match the central directory (changed or damaged)"
                raise self._corrupt(info, why)
            self._data_offsets[info.header_offset] = offset
        return offset

    def _corrupt(self, info: zipfile.ZipInfo, why: str) -> StorageError:
        return StorageError(f"cannot read member {info.filename!r} of {self.path!r}: {why}")

    def _read_compressed(self, info: zipfile.ZipInfo, start: int, count: int | None) -> bytes:
        end = info.file_size if count is None else min(info.file_size, start + count)
        if start >= end:
            return b""
        if info.flag_bits & _ENCRYPTED:
            raise self._corrupt(info, "it is encrypted")
        return self._decompress(info, end)[start:]

    def _decompress(self, info: zipfile.ZipInfo, end: int) -> bytes:
        """The first ``end`` bytes of a compressed member. No more than its declared size is ever produced:
        a whole read asks for one byte more, which only a member inflating beyond that size yields."""
        whole = end == info.file_size
        limit = end + whole
        offset, size = self._data_offset(info), info.compress_size
        head = b""
        if info.compress_type == zipfile.ZIP_LZMA:  # zip's own header comes before the LZMA stream
            head = read_exact(self._fd, min(size, _LZMA_HEADER.size), offset, self.path)
        try:
            decompressor, done = _decompressor(info.compress_type, head, limit)
        except Exception as exc:  # LZMAError, struct.error...: a header no codec accepts
            raise self._corrupt(info, f"bad compression header ({exc})") from exc
        if decompressor is None:
            why = f"compression method {info.compress_type} is not supported (deflate, bzip2, LZMA are)"
            raise self._corrupt(info, why)
        parts, produced = [], 0
        while produced < limit and not decompressor.eof:
            data = b""
            if decompressor.needs_input:
                if done == size:
                    break
                data = read_exact(self._fd, min(_READ_BLOCK, size - done), offset + done, self.path)
                done += len(data)
            try:
                part = decompressor.decompress(data, limit - produced)
            except Exception as exc:  # zlib.error, OSError from bz2, LZMAError...: corrupt data
                raise self._corrupt(info, f"its compressed data do not decode ({exc})") from exc
            if not (data or part):
                break  # no progress: the codec wants input that is not there
            parts.append(part)
            produced += len(part)
        if produced > info.file_size:
            raise self._corrupt(info, f"it inflates beyond its declared size of {info.file_size} bytes")
        if produced < end:
            raise self._corrupt(info, f"it inflates to {produced} bytes, not its declared {info.file_size}")
        data = b"".join(parts)
        if whole and zlib.crc32(data) != info.CRC:
            raise self._corrupt(info, "CRC mismatch")
        return data

    def _write(self, key: str, data: memoryview) -> None:
        # Writes may come from several threads (chunk copies): each reserves its own stretch of the
        # staging file, then they write at once; the object appears only when all its bytes are there.
        self._check_name(key)
        with self._lock:
            self._index.check_leaf(key, self._members, self.location)
            stage = self._staging_file()
            offset, self._staged_size = self._staged_size, self._staged_size + len(data)
        try:
            _pwrite_all(stage.fileno(), data, offset)
        except OSError as exc:
            raise from_os_error(exc, f"cannot stage {key!r} for {self.path!r}") from exc
        with self._lock:
            self._index.check_leaf(key, self._members, self.location)
            self._members[key] = Staged(offset, len(data))
            self._index.add(key)
            self._dirty = True

    def _check_name(self, key: str) -> None:
        """Refuse a key whose member name a zip cannot hold, before anything is staged: found only at
        ``close``, it would fail the whole commit and lose every other write of the session."""
        size = len((self.prefix + key[1:]).encode("utf-8"))
        if size > MAX_NAME_BYTES:
            raise KeyNameError(
                f"key {key[:60] + '...'!r} ({len(key)} characters) cannot be stored in zip archive "
                f"{self.path!r}: its member name would be {size} bytes of UTF-8, and a zip member name "
                f"holds at most {MAX_NAME_BYTES}"
            )

    def _staging_file(self) -> IO[bytes]:
        if self._stage is None:
            directory = os.path.dirname(self.path)
            try:
                os.makedirs(directory, exist_ok=True)
                # lives until close, hence no context manager; anonymous, so a crash leaves nothing
                self._stage = tempfile.TemporaryFile(dir=directory, prefix=TEMP_PREFIX, buffering=0)  # noqa: SIM115
            except OSError as exc:
                raise from_os_error(exc, f"cannot stage writes next to {self.path!r}") from exc
        return self._stage

    def _search(self, prefix: str) -> list[str]:
        return self._index.children(prefix)

    def _delete(self, key: str) -> None:
        with self._lock:
            removed = self._index.remove(key, self._members.__contains__)
            for node in removed:
                self._members.pop(node, None)
            self._dirty = self._dirty or bool(removed)

    def _truncate(self) -> None:
        self._members.clear()
        self._index = KeyIndex()
        self._dirty = True

    def _close(self, delete: bool) -> None:
        try:
            if delete:
                self._release_archive()
                remove_if_present(self.path)
            elif self._dirty:
                self._rewrite()
        finally:
            self._release()

    def abort(self) -> None:
        """Close, discarding every change made since the archive was opened."""
        self._dirty = False
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_dirty", False) and not getattr(self, "_closed", True):
            warnings.warn(
                f"{self!r} was not closed: its changes are discarded", ResourceWarning, stacklevel=1
            )
            self._release()

    # ----------------------------------------------------------------- committing
    def _rewrite(self) -> None:
        target = self._writer_lock.dataset  # the real path: a symbolic link to the archive stays one
        temp = locking.sibling_path(target, "commit")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "wb") as handle, zipfile.ZipFile(handle, "w", allowZip64=True) as out:
                self._write_entries(out)
            if os.path.exists(target):
                shutil.copymode(target, temp)
            if _identity(target) != self._opened:
                raise StorageError(
                    f"{self.path!r} was changed by another writer since this map opened it: refusing to "
                    "overwrite it, so the changes made through this map are discarded and the other "
                    "writer's archive is kept"
                )
            os.replace(temp, target)
        except BaseException as exc:
            remove_if_present(temp)
            if isinstance(exc, OSError) and not isinstance(exc, NCZError):
                raise from_os_error(exc, f"cannot write zip archive {self.path!r}") from exc
            raise

    def _write_entries(self, out: zipfile.ZipFile) -> None:
        now = time.localtime()[:6]
        if self.prefix:
            out.writestr(_directory_info(self.prefix, now), b"")
        for node in self._index.subtree(ROOT):
            if node == ROOT:
                continue
            name = self.prefix + node[1:]
            member = self._members.get(node)
            if member is None:
                out.writestr(_directory_info(name + "/", now), b"")
            elif isinstance(member, Staged):
                self._copy_staged(out, name, member, now)
            else:
                self._copy_raw(out, name, member)
        for member in self._foreign:
            self._copy_raw(out, member.orig_filename, member)

    def _copy_staged(self, out: zipfile.ZipFile, name: str, member: Staged, now: tuple) -> None:
        info = zipfile.ZipInfo(name, date_time=now)
        info.compress_type = zipfile.ZIP_STORED
        info.file_size = member.size
        info.external_attr = 0o644 << 16
        info.flag_bits |= 0x800  # UTF-8 names, as netcdf-c writes them
        with out.open(info, "w", force_zip64=member.size >= zipfile.ZIP64_LIMIT) as target:
            for done in range(0, member.size, _COPY_BLOCK):
                length = min(_COPY_BLOCK, member.size - done)
                target.write(read_exact(self._stage.fileno(), length, member.offset + done, "staging file"))

    def _copy_raw(self, out: zipfile.ZipFile, name: str, source: zipfile.ZipInfo) -> None:
        """Copy a member's stored bytes as they are: nothing is decompressed, so nothing can fail to
        decode, nothing is recompressed, and members that are not keys survive byte for byte."""
        info = zipfile.ZipInfo(name, date_time=source.date_time)
        info.filename = name  # whole: ZipInfo cuts a name at a NUL
        info.compress_type = source.compress_type
        info.CRC, info.compress_size, info.file_size = source.CRC, source.compress_size, source.file_size
        info.external_attr, info.create_system = source.external_attr, source.create_system
        info.flag_bits = source.flag_bits & ~_DATA_DESCRIPTOR  # sizes now go in the local header
        info.comment = source.comment
        offset = self._data_offset(source)
        zip64 = max(info.file_size, info.compress_size) >= zipfile.ZIP64_LIMIT
        out.fp.seek(out.start_dir)
        info.header_offset = out.fp.tell()
        out.fp.write(info.FileHeader(zip64))
        for done in range(0, source.compress_size, _COPY_BLOCK):
            length = min(_COPY_BLOCK, source.compress_size - done)
            out.fp.write(read_exact(self._fd, length, offset + done, self.path))
        out.start_dir = out.fp.tell()
        out.filelist.append(info)
        out.NameToInfo[name] = info
        out._didModify = True  # the stdlib's own flag: write the central directory at close

    def _release(self) -> None:
        self._release_archive()
        if self._writer_lock is not None:
            self._writer_lock.release()
            self._writer_lock = None

    def _release_archive(self) -> None:
        if self._filesystem is not None:
            _close_zip(self._filesystem)
        if self._stage is not None:
            self._stage.close()
        if self._fd is not None:
            os.close(self._fd)
        self._filesystem = self._archive = self._stage = self._fd = None


def find_layout(names: list[str], dataset_name: str) -> str:
    """The folder prefix (``"name/"``) holding the dataset in a zip with these entry names, or ``""``.

    netcdf-c's rule first: the top folder of entry 0 is the dataset and everything outside it is ignored
    (stray root files, ``__MACOSX/``...), provided that folder looks like a dataset root (group metadata,
    or attributes without ``.zarray``) and the archive root is not itself a Zarr hierarchy with another
    node beside it. Then the root, when it holds Zarr metadata (zarr-python ``ZipStore``); then the single
    top folder of an empty dataset. An empty archive gets netcdf-c's folder named after it.
    """
    if not names:
        return dataset_name + "/"
    present = set(names)
    first = names[0].split("/", 1)[0] + "/" if "/" in names[0] else ""
    if first and _is_dataset_root(first, present) and not _root_has_other_node(first, present):
        return first
    if any(marker in present for marker in STORE_MARKERS):
        return ""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) == 1 and all("/" in name for name in names):
        return tops.pop() + "/"
    return ""


def _is_dataset_root(folder: str, present: set[str]) -> bool:
    if any(folder + marker in present for marker in _GROUP_MARKERS):
        return True
    return folder + ".zattrs" in present and folder + ".zarray" not in present


def _root_has_other_node(folder: str, present: set[str]) -> bool:
    """True when the root holds Zarr metadata and a top folder other than ``folder`` is a group or array."""
    if not any(marker in present for marker in STORE_MARKERS):
        return False
    for name in present:
        top, _, rest = name.partition("/")
        if top + "/" != folder and rest in (".zgroup", ".zarray", "zarr.json"):
            return True
    return False


def _identity(file: str | int) -> tuple[int, ...] | None:
    """What tells one archive from another at a path (or open descriptor): None when there is none."""
    try:
        st = os.stat(file)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise from_os_error(exc, f"cannot stat {file!r}") from exc
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _open_descriptor(path: str) -> int:
    """A descriptor of the archive at ``path``, which must be a regular file (a FIFO must not block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError as exc:
        raise from_os_error(exc, f"cannot open zip archive {path!r}") from exc
    if not regular:
        os.close(fd)
        raise StorageError(f"{path!r} is not a regular file, so no zip archive")
    return fd


def _open_zip(path: str, fd: int):
    """fsspec's zip filesystem (stdlib ``zipfile``, no libzip) over the open descriptor ``fd``, which it
    then owns; ``.zip`` is the ZipFile."""
    from fsspec.implementations.zip import ZipFileSystem

    handle = os.fdopen(fd, "rb")
    try:
        return ZipFileSystem(fo=handle, mode="r")
    except (zipfile.BadZipFile, NotImplementedError, ValueError) as exc:
        handle.close()
        why = str(exc)  # NotImplementedError: a member needs a zip version above 6.3 ("version needed")
        if isinstance(exc, UnicodeDecodeError):  # the stdlib decodes names flagged as UTF-8 strictly
            why = f"a member name is flagged as UTF-8 but is not: {exc.object!r}"
        raise StorageError(f"{path!r} is not a readable zip archive: {why}") from exc
    except OSError as exc:
        handle.close()
        raise from_os_error(exc, f"cannot open zip archive {path!r}") from exc


def _close_zip(filesystem) -> None:
    filesystem.zip.close()
    filesystem.fo.close()


def _encoded_name(info: zipfile.ZipInfo) -> bytes:
    """The member name's bytes as the central directory holds them."""
    return info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437", "surrogateescape")


def _directory_info(name: str, now: tuple) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=now)
    info.external_attr = (0o40755 << 16) | 0x10
    info.flag_bits |= 0x800
    return info


class _Inflater:
    """Raw deflate (zlib) behind the interface of bz2's and lzma's decompressors."""

    def __init__(self) -> None:
        self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        self.needs_input = True

    @property
    def eof(self) -> bool:
        return self._zlib.eof

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out = self._zlib.decompress(self._zlib.unconsumed_tail + data, max_length)
        self.needs_input = not self._zlib.unconsumed_tail and len(out) < max_length
        return out


def _decompressor(method: int, head: bytes, window: int):
    """A decompressor for ``method`` (``decompress(data, max_length)``, ``needs_input``, ``eof``) and how
    many bytes of ``head``, the start of the member's data, come before its stream; None if this Python
    cannot decode the method. ``window``: the most output that will be asked for."""
    try:
        if method == zipfile.ZIP_DEFLATED:
            return _Inflater(), 0
        if method == zipfile.ZIP_BZIP2:
            import bz2

            return bz2.BZ2Decompressor(), 0
        if method == zipfile.ZIP_LZMA:
            import lzma

            _version, length, bits, dictionary = _LZMA_HEADER.unpack(head)
            if length != 5:
                raise ValueError(f"{length} bytes of LZMA properties, not 5")
            # No match reaches back past the start of the output, so a window of the output wanted is
            # enough (a forged dictionary size must not allocate gigabytes).
            lzma1 = {"id": lzma.FILTER_LZMA1, "lc": bits % 9, "lp": bits // 9 % 5, "pb": bits // 45}
            lzma1["dict_size"] = max(4096, min(dictionary, window))
            return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[lzma1]), _LZMA_HEADER.size
    except ImportError:  # a Python built without bz2 or lzma
        pass
    return None, 0


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        written = os.pwrite(fd, data[done:], offset + done)
        if not written:
            raise OSError(errno.ENOSPC, "no space left for the staged write")
        done += written
