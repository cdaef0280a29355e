"""Hostile input for the local drivers: crafted zip archives and files that are no regular files.

Whatever the bytes or the file type, a driver answers in bounded time and memory with an nczmap error
naming the culprit: never another exception type, a hang, or an allocation the archive cannot justify.
"""

from __future__ import annotations

import bz2
import contextlib
import os
import re
import signal
import socket
import stat
import struct
import time
import tracemalloc
import zipfile
import zlib
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nczmap import EmptyError, NCZError, StorageError, open_map


# ---------------------------------------------------------------------------- helpers
class Hang(BaseException):
    """Raised by :func:`time_limit`; a BaseException so that no ``except Exception`` can swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def make_zip(path, members) -> None:
    """``members``: (name, data, compression method) written by the stdlib."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data, method in members:
            archive.writestr(name, data, compress_type=method)


def raw_zip(path, members) -> None:
    """``members``: (name, method, stored bytes, declared size, CRC) written exactly as given."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, method, raw, size, crc in members:
            info = zipfile.ZipInfo(name)
            info.filename = name  # whole, even with a NUL in it
            info.compress_type, info.file_size, info.compress_size, info.CRC = method, size, len(raw), crc
            info.header_offset = archive.fp.tell()
            archive.fp.write(info.FileHeader(False) + raw)
            archive.start_dir = archive.fp.tell()
            archive.filelist.append(info)
            archive._didModify = True  # the stdlib's flag: write the central directory at close


CENTRAL_FIELDS = {"version": (6, "<H"), "flags": (8, "<H"), "method": (10, "<H"), "size": (24, "<I")}
CENTRAL_FIELDS |= {"compressed": (20, "<I"), "offset": (42, "<I")}


def patch_central(path, name: str, **fields: int) -> None:
    """Change fields of ``name``'s central directory record (the local header keeps the old values)."""
    data = bytearray(path.read_bytes())
    record = data.index(b"PK\x01\x02")
    while data[record + 46 : record + 46 + struct.unpack_from("<H", data, record + 28)[0]] != name.encode():
        record = data.index(b"PK\x01\x02", record + 4)
    for field, value in fields.items():
        offset, fmt = CENTRAL_FIELDS[field]
        struct.pack_into(fmt, data, record + offset, value)
    path.write_bytes(bytes(data))


def read_everything(path) -> None:
    """Open the archive and read every key every way; nczmap errors are fine, nothing else is."""
    try:
        with open_map(str(path), "r") as zmap:
            calls = [(zmap.exists, ()), (zmap.len, ()), (zmap.read, ()), (zmap.read, (1, 5))]
            calls.append((zmap.read_into, (memoryview(bytearray(8)), 2)))
            for key in list(zmap.walk()):
                for function, arguments in calls:
                    with contextlib.suppress(NCZError):
                        function(key, *arguments)
    except NCZError:
        pass


def read_all(path) -> dict[str, bytes]:
    with open_map(str(path), "r") as zmap:
        return {key: zmap.read(key) for key in zmap.objects()}


# ---------------------------------------------------------------------------- crafted zips
def test_a_member_name_falsely_marked_utf8_is_a_storage_error_naming_it(tmp_path):
    path = tmp_path / "ds.zip"
    make_zip(path, [("ds/.zgroup", b"{}", zipfile.ZIP_STORED), ("ds/é", b"x", zipfile.ZIP_STORED)])
    path.write_bytes(path.read_bytes().replace("é".encode(), b"\xff\xfe"))  # flagged UTF-8, but is not
    with pytest.raises(StorageError, match=r"ds\.zip.*UTF-8.*ds/\\xff\\xfe"):
        open_map(str(path), "r")


def test_a_member_needing_an_unknown_zip_version_is_a_storage_error(tmp_path):
    path = tmp_path / "ds.zip"
    make_zip(path, [("ds/.zgroup", b"{}", zipfile.ZIP_STORED), ("ds/v/0", b"x", zipfile.ZIP_STORED)])
    patch_central(path, "ds/v/0", version=99)
    for mode in ("r", "a"):
        with pytest.raises(StorageError, match=r"ds\.zip.*version 9\.9"):
            open_map(str(path), mode)


def test_a_central_directory_offset_of_0xffffffff_is_a_storage_error(tmp_path):
    path = tmp_path / "ds.zip"
    make_zip(path, [("ds/.zgroup", b"{}", zipfile.ZIP_STORED), ("ds/v/0", b"x" * 100, zipfile.ZIP_DEFLATED)])
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, data.rindex(b"PK\x05\x06") + 16, 0xFFFFFFFF)
    path.write_bytes(bytes(data))
    with open_map(str(path), "r") as zmap:
        for key in ("/.zgroup", "/v/0"):
            with pytest.raises(StorageError, match=rf"ds{re.escape(key)}.*ds\.zip.*not in the archive"):
                zmap.read(key)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": 99}, "compression method 99"),
        ({"method": 9}, "compression method 9"),  # deflate64: the stdlib has no decoder
        ({"flags": 0x1}, "encrypted"),
    ],
)
def test_members_nczmap_cannot_decode_are_storage_errors_naming_them(tmp_path, fields, message):
    path = tmp_path / "ds.zip"
    make_zip(path, [("ds/.zgroup", b"{}", zipfile.ZIP_STORED), ("ds/v/0", b"x" * 100, zipfile.ZIP_DEFLATED)])
    patch_central(path, "ds/v/0", **fields)
    with open_map(str(path), "r") as zmap, pytest.raises(StorageError, match=rf"ds/v/0.*ds\.zip.*{message}"):
        zmap.read("/v/0")


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_compressed_members_are_read_whole_and_in_ranges(tmp_path, method):
    path = tmp_path / "ds.zip"
    data = bytes(range(256)) * 5000 + os.urandom(5 << 18)  # more than one block of compressed data
    make_zip(path, [("ds/.zgroup", b"{}", zipfile.ZIP_STORED), ("ds/v/0", data, method)])
    with open_map(str(path), "r") as zmap:
        assert zmap.read("/v/0") == data
        assert zmap.read("/v/0", 1000, 70) == data[1000:1070]
        assert zmap.read("/v/0", len(data) - 5, 100) == data[-5:]
        assert zmap.read("/v/0", len(data) + 5) == b""


STORED, DEFLATED = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED


@pytest.mark.parametrize(
    ("method", "fields", "message"),
    [
        (STORED, {"size": 0xFFFFFFFE, "compressed": 0xFFFFFFFE}, "runs past the end"),  # was a 4 GiB read
        (STORED, {"size": 0xFFFFFFFE}, "stored, yet sized"),
        (DEFLATED, {"size": 0xFFFFFFFE}, "inflates to 100 bytes"),
        (DEFLATED, {"compressed": 0xFFFFFFFE}, "runs past the end"),
        (STORED, {"offset": 0xFFFFFFF0}, "not in the archive"),
    ],
)
def test_declared_sizes_the_archive_cannot_hold_are_refused_without_allocating_them(
    tmp_path, monkeypatch, method, fields, message
):
    path = tmp_path / "ds.zip"
    make_zip(path, [("ds/.zgroup", b"{}", STORED), ("ds/v/0", b"x" * 100, method)])
    patch_central(path, "ds/v/0", **fields)
    archive_size = path.stat().st_size
    requested = []
    real_pread = os.pread

    def pread(fd, length, offset):
        requested.append(length)
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", pread)
    with open_map(str(path), "r") as zmap:
        with pytest.raises(StorageError, match=rf"ds/v/0.*ds\.zip.*{message}"):
            zmap.read("/v/0")
        assert zmap.read("/.zgroup") == b"{}"
    assert max(requested) <= archive_size


def _bomb(method: int) -> bytes:
    """Compressed zeros: 1 GiB in 1 MB of deflate (the same flushed block over and over), 32 MiB otherwise."""
    if method == zipfile.ZIP_DEFLATED:
        block = zlib.compressobj(9, zlib.DEFLATED, -15)
        block = block.compress(b"\0" * (1 << 20)) + block.flush(zlib.Z_FULL_FLUSH)
        return block * 1024 + zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # then an empty final block
    zeros = b"\0" * (32 << 20)
    if method == zipfile.ZIP_BZIP2:
        return bz2.compress(zeros)
    compressor = zipfile.LZMACompressor()
    return compressor.compress(zeros) + compressor.flush()


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA])
def test_a_zip_bomb_fails_fast_in_little_memory(tmp_path, method):
    """A member declaring 40 bytes whose data inflate to 32 MiB or, deflated, to 1 GiB."""
    path = tmp_path / "bomb.zip"
    raw_zip(path, [("ds/.zgroup", 0, b"{}", 2, zlib.crc32(b"{}")), ("ds/bomb", method, _bomb(method), 40, 0)])
    with open_map(str(path), "r") as zmap:
        assert zmap.len("/bomb") == 40
        tracemalloc.start()
        started = time.monotonic()
        try:
            with pytest.raises(StorageError, match=r"ds/bomb.*bomb\.zip.*beyond its declared size of 40"):
                zmap.read("/bomb")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert time.monotonic() - started < 1
        assert peak < 16 << 20
        assert zmap.read("/bomb", 0, 10) == b"\0" * 10  # a range within the declared size is what is there


def _foreign_cases():
    deflated = zlib.compressobj(9, zlib.DEFLATED, -15)
    junk = deflated.compress(b"junk" * 100) + deflated.flush()
    return {
        "unknown method": [("junk.bin", 99, b"whatever", 8, 0)],
        "deflate64": [("junk.bin", 9, b"\x01\x02\x03", 17, 0)],
        "encrypted": [("junk.bin", 0, b"secret", 6, 0)],
        "corrupt bzip2": [("junk.bin", zipfile.ZIP_BZIP2, b"BZh9 not bzip2", 50, 0)],
        "lying size": [("junk.bin", zipfile.ZIP_DEFLATED, junk, 0xFFFFFFFE, 0)],
        "NUL in the name": [("ds/.zgroup\0evil", 0, b"evil", 4, zlib.crc32(b"evil"))],
        "duplicates": [("junk.bin", 0, b"first", 5, zlib.crc32(b"first")), ("junk.bin", 0, b"2nd", 3, 0)],
    }


def _raw_members(path) -> list[tuple]:
    with zipfile.ZipFile(path) as archive, open(path, "rb") as handle:
        members = []
        for info in archive.infolist():
            handle.seek(info.header_offset + 26)
            skip = sum(struct.unpack("<HH", handle.read(4)))
            handle.seek(skip, 1)
            raw = handle.read(info.compress_size)
            members.append((info.orig_filename, info.compress_type, info.file_size, info.CRC, raw))
        return members


@pytest.mark.parametrize("case", list(_foreign_cases()))
def test_members_that_are_no_keys_survive_updates_whatever_they_hold(tmp_path, case):
    path = tmp_path / "ds.zip"
    members = [("ds/.zgroup", 0, b"{}", 2, zlib.crc32(b"{}")), *_foreign_cases()[case]]
    raw_zip(path, members)
    if case == "encrypted":
        patch_central(path, "junk.bin", flags=0x1)
    ours = {"ds/", "ds/.zgroup", "ds/k0", "ds/k1"}
    foreign = [member for member in _raw_members(path) if member[0] not in ours]
    for round_number in range(2):
        with open_map(str(path), "a") as zmap:
            zmap.write(f"/k{round_number}", b"ok")
    assert read_all(path) == {"/.zgroup": b"{}", "/k0": b"ok", "/k1": b"ok"}
    assert [member for member in _raw_members(path) if member[0] not in ours] == foreign


# ---------------------------------------------------------------------------- files that are no regular files
@pytest.mark.parametrize("mode", ["r", "r+", "a", "w"])
def test_a_zip_path_that_is_a_fifo_is_refused_without_blocking(tmp_path, mode):
    path = tmp_path / "ds.zip"
    os.mkfifo(path)
    with time_limit(5), pytest.raises(NCZError, match=r"ds\.zip"):
        open_map(str(path), mode)


def _special_files(directory, monkeypatch) -> list[str]:
    """A FIFO, a socket and (where this user may make one) a character device in ``directory``."""
    os.mkfifo(directory / "fifo")
    monkeypatch.chdir(directory)  # a relative name: socket paths are short
    server = socket.socket(socket.AF_UNIX)
    server.bind("sock")
    server.close()
    names = ["fifo", "sock"]
    zero = directory / "zero"
    try:  # needs CAP_MKNOD, and a file system mounted without nodev
        os.mknod(zero, stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero
        os.close(os.open(zero, os.O_RDONLY))
        names.append("zero")
    except PermissionError:
        zero.unlink(missing_ok=True)
    return names


def test_fifos_sockets_and_devices_in_a_directory_store_are_no_objects(tmp_path, monkeypatch):
    store = tmp_path / "ds"
    (store / "v").mkdir(parents=True)
    (store / ".zgroup").write_text("{}")
    names = _special_files(store / "v", monkeypatch)
    with time_limit(5), open_map(str(store), "r") as zmap, open_map(str(tmp_path / "copy"), "w") as copy:
        assert zmap.search("/v") == sorted(names)  # listed as every foreign file is
        for name in names:
            key = f"/v/{name}"
            assert not zmap.exists(key)
            calls = [(zmap.len, ()), (zmap.read, ()), (zmap.read, (0, 10)), (zmap.read, (0, 0))]
            for function, arguments in [*calls, (zmap.read_into, (memoryview(bytearray(10)),))]:
                with pytest.raises(EmptyError, match=key):
                    function(key, *arguments)
            assert copy.copy_from(zmap, key, "/x") is False
        assert zmap.read("/.zgroup") == b"{}"


@pytest.mark.parametrize("mode", ["r", "r+", "a", "w"])
def test_a_directory_store_root_that_is_no_directory_is_refused(tmp_path, monkeypatch, mode):
    for name in _special_files(tmp_path, monkeypatch):
        with time_limit(5), pytest.raises(NCZError, match=name):
            open_map(str(tmp_path / name), mode)


# ---------------------------------------------------------------------------- fuzzing
def _base_archives() -> list[bytes]:
    import io

    archives = []
    for layout in ("ds/", ""):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            if layout:
                archive.writestr(layout, b"")
            archive.writestr(layout + ".zgroup", b'{"zarr_format": 2}')
            archive.writestr(layout + "v/.zarray", b'{"shape": [4]}' * 3, compress_type=zipfile.ZIP_DEFLATED)
            archive.writestr(layout + "v/0", bytes(range(40)), compress_type=zipfile.ZIP_BZIP2)
            archive.writestr(layout + "v/1", b"abc" * 20, compress_type=zipfile.ZIP_LZMA)
            archive.writestr("README", b"read me " * 8, compress_type=zipfile.ZIP_DEFLATED)
        archives.append(buffer.getvalue())
    buffer = io.BytesIO()  # zip64 records: the end of central directory and a member's extra field
    with mock.patch.object(zipfile, "ZIP_FILECOUNT_LIMIT", 1), zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("z/.zgroup", b"{}")
        with archive.open("z/0", "w", force_zip64=True) as member:
            member.write(b"zip64" * 10)
    archives.append(buffer.getvalue())
    return archives


BASES = _base_archives()
HEADER = re.compile(rb"PK(\x01\x02|\x03\x04|\x05\x06|\x06\x06|\x06\x07)")  # the records' signatures


@st.composite
def mutated_archives(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["field", "field", "flip", "truncate"]))
        if kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "flip" and data:
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        elif kind == "field":
            headers = [match.start() for match in HEADER.finditer(data)]
            if not headers:
                continue
            width = draw(st.sampled_from([2, 4, 8]))
            offset = draw(st.sampled_from(headers)) + draw(st.integers(2, 28)) * 2
            top = (1 << (8 * width)) - 1
            value = draw(st.sampled_from([0, 1, top, top - 1, top >> 1, (top >> 1) + 1, len(data)]))
            if offset + width <= len(data):
                data[offset : offset + width] = value.to_bytes(width, "little")
    return bytes(data)


@settings(
    max_examples=1000,
    deadline=None,  # time_limit bounds every example; a hang must fail, not only be slow
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=mutated_archives(), update=st.booleans())
def test_fuzzed_archives_raise_only_nczmap_errors_in_bounded_time(tmp_path, data, update):
    path = tmp_path / "fuzz.zip"
    path.write_bytes(data)
    with time_limit(1):
        read_everything(path)
        if update:
            try:
                with open_map(str(path), "a") as zmap:
                    zmap.write("/fuzz/0", b"new")
            except NCZError:
                return
            read_everything(path)


def test_a_variable_claiming_more_than_any_file_holds_is_refused_by_every_command(tmp_path, capfd):
    """A flipped high bit of a dataspace (found by the fuzz suite): 2**49 values of a 10 KiB file. Printing
    or copying them would never end (netcdf-c's ncdump tries); virtualize, ncdump and copy refuse it,
    naming the variable."""
    import h5py

    from nczmap import cli

    path = tmp_path / "huge.nc"
    with h5py.File(path, "w") as root:
        counts = root.create_dataset("counts", data=[1, 2, 3], maxshape=(None,), chunks=(4,), dtype="i4")
        counts.resize((1 << 49,))  # sparse: the file stays small
    assert path.stat().st_size < 64 << 10
    commands = (["virtualize", str(path), str(tmp_path / "r.json")], ["ncdump", str(path)])
    commands += (["copy", str(path), str(tmp_path / "c.zarr")],)
    for argv in commands:
        started = time.monotonic()
        assert cli.main(argv) == 1
        assert time.monotonic() - started < 30
        error = capfd.readouterr().err
        assert "/counts" in error and "more than any file holds" in error, (argv, error)
