"""The metadata dialects netcdf-c has written, named by the first release that writes each one.

Every NCZarr release since 4.8.1 calls its format "NCZarr 2.0.0", yet the four dialects cannot read each
other's metadata (nczarr-format.md §3 calls them D0-D3, pure Zarr PZ; :attr:`Dialect.code` gives those
names). A dataset's ``dialect`` tells which netcdf-c releases read it; ``netcdf_version`` picks the one to
write.
"""

from __future__ import annotations

import enum
import re

from nczmap.errors import ModeError

FIRST_NCZARR_RELEASE = (4, 8, 0)
# The first release whose NCZarr driver byte-swaps chunks of big-endian variables (Unidata/netcdf-c commit
# df3636b95, PR #2755, "Mitigate S3 test interference + Unlimited Dimensions in NCZarr", first tagged in
# v4.9.3-rc1). From 4.8.0 to 4.9.2 libnczarr/zwalk.c copies chunk data with memcpy (4.8.x, 4.9.0) or
# nc_copy_data (4.9.1, 4.9.2, also a memcpy for atomic types); the swapping transfern() exists in every
# release but is compiled out (#if 0) until 4.9.3 turns it on (#define TRANSFERN).
BIG_ENDIAN_FIXED_RELEASE = (4, 9, 3)
_VERSION = re.compile(r"\s*(\d+)\.(\d+)(?:\.(\d+))?")


class Dialect(enum.StrEnum):
    """Where a store keeps its NCZarr metadata; the value is the first netcdf-c release writing it."""

    NCZARR_OBJECTS = "nczarr-4.8.0"  # D0: separate .nczarr/.nczgroup/.nczarray/.nczattr objects
    NCZARR_UPPER_KEYS = "nczarr-4.8.1"  # D1: _NCZARR_* keys inside .zgroup/.zarray/.zattrs
    NCZARR_LOWER_KEYS = "nczarr-4.9.1"  # D2: _nczarr_* keys inside .zgroup/.zarray/.zattrs
    NCZARR_ATTRIBUTES = "nczarr-4.9.3"  # D3: _nczarr_* attributes inside .zattrs only
    PURE_ZARR = "zarr-v2"  # no NCZarr metadata: _ARRAY_DIMENSIONS and plain attributes
    ZARR_V3 = "zarr-v3"  # pure Zarr v3 (zarr.json, dimension_names): no netcdf-c release reads it

    @property
    def code(self) -> str:
        """The short name nczarr-format.md uses (D0-D3, PZ; PZ3 for Zarr v3)."""
        return _CODES[self]

    @property
    def releases(self) -> str:
        """The netcdf-c releases that write this dialect."""
        return _RELEASES[self]

    @property
    def is_nczarr(self) -> bool:
        return self not in (Dialect.PURE_ZARR, Dialect.ZARR_V3)

    @property
    def zarr_format(self) -> int:
        return 3 if self is Dialect.ZARR_V3 else 2

    @property
    def keys_in_zarr_objects(self) -> bool:
        """NCZarr metadata as extra keys of ``.zgroup``/``.zarray`` (4.8.1-4.9.2)."""
        return self in (Dialect.NCZARR_UPPER_KEYS, Dialect.NCZARR_LOWER_KEYS)

    @property
    def reads_unlimited(self) -> bool:
        """The releases writing it can read unlimited dimensions (4.9.3 and later)."""
        return self in (Dialect.NCZARR_ATTRIBUTES, Dialect.PURE_ZARR, Dialect.ZARR_V3)

    @property
    def reads_strings(self) -> bool:
        """The releases writing it can read NC_STRING variables (4.9.1 and later)."""
        return self not in (Dialect.NCZARR_OBJECTS, Dialect.NCZARR_UPPER_KEYS)

    @property
    def big_endian_safe(self) -> bool:
        """The releases writing it store big-endian data as declared: 4.8.0-4.9.2 write (and read) the chunks
        of a ``>`` variable in host byte order (see :data:`BIG_ENDIAN_FIXED_RELEASE`)."""
        return self in (Dialect.NCZARR_ATTRIBUTES, Dialect.PURE_ZARR, Dialect.ZARR_V3)

    @property
    def decodes_filters(self) -> bool:
        """The releases writing it read compressed chunks as distributed: 4.8.x and 4.9.0 (Debian's
        netcdf-bin among them) have no codec plugins for NCZarr and print compressed bytes as values."""
        return self.reads_strings

    @property
    def char_dtype(self) -> str:
        """The dtype of NC_CHAR variables and attributes (4.8.x and 4.9.0 wrote ``<U1``). Pure Zarr gets
        ``|S1``, which netcdf-c reads as char too, because zarr-python 3 refuses a byte order on bytes."""
        if self is Dialect.PURE_ZARR:
            return "|S1"
        return ">S1" if self.reads_strings else "<U1"

    @property
    def superblock_version(self) -> int:
        """What ``ncdump -s`` shows as ``_SuperblockVersion`` for a store of this dialect."""
        return {Dialect.NCZARR_OBJECTS: 1, Dialect.PURE_ZARR: 0, Dialect.ZARR_V3: 0}.get(self, 2)

    @classmethod
    def for_version(cls, version: str | None) -> Dialect:
        """The dialect the named netcdf-c release reads and writes (None: the current one)."""
        if version is None:
            return cls.NCZARR_ATTRIBUTES
        try:
            parts = tuple(int(p) for p in version.strip().split(".")[:3])
        except ValueError:
            raise ModeError(f"netcdf_version {version!r} is not a version number such as 4.9.0") from None
        parts += (0,) * (3 - len(parts))
        if parts < FIRST_NCZARR_RELEASE:
            raise ModeError(
                f"netcdf_version {version!r}: netcdf-c reads NCZarr from release 4.8.0 on; "
                "earlier releases cannot read any NCZarr dataset"
            )
        if parts < (4, 8, 1):
            return cls.NCZARR_OBJECTS
        if parts < (4, 9, 1):
            return cls.NCZARR_UPPER_KEYS
        if parts < (4, 9, 3):
            return cls.NCZARR_LOWER_KEYS
        return cls.NCZARR_ATTRIBUTES


_CODES = dict(zip(Dialect, ("D0", "D1", "D2", "D3", "PZ", "PZ3"), strict=True))
_RELEASES = dict(
    zip(
        Dialect,
        ("4.8.0", "4.8.1-4.9.0", "4.9.1-4.9.2", "4.9.3 and later", "any (mode=zarr)", "none (Zarr v3)"),
        strict=True,
    )
)


def netcdf_release(provenance: str | None) -> str | None:
    """The netcdf-c release an ``_NCProperties`` text names (``version=2,netcdf=4.9.0,nczarr=2.0.0`` gives
    ``4.9.0``); None when it names none (nczmap writes ``nczmap=...``, other Zarr tools nothing)."""
    if not isinstance(provenance, str):
        return None
    for item in provenance.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "netcdf" and value.strip():
            return value.strip()
    return None


def host_order_release(provenance: str | None) -> str | None:
    """The netcdf-c release that wrote this store when it is one of those writing big-endian variables'
    chunks in host (little-endian) byte order, 4.8.0 to 4.9.2 (nczarr-format.md §4.5, bug 18); else None.

    Pre-releases and development builds count by their number (``4.9.1-rc1`` is affected, ``4.9.3-rc1`` is
    not), so ``4.9.3-development`` is read as declared although builds so named before the fix reached the
    main branch (2023-10-02) still wrote host order: a store cannot tell which build wrote it.
    """
    release = netcdf_release(provenance)
    found = _VERSION.match(release) if release else None
    if found is None:
        return None
    parts = (int(found[1]), int(found[2]), int(found[3] or 0))
    return release if FIRST_NCZARR_RELEASE <= parts < BIG_ENDIAN_FIXED_RELEASE else None
