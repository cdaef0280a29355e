"""The nczmap error hierarchy.

Every error the public API raises derives from :class:`NCZError`; the netcdf-c error code each one
corresponds to is kept in ``nc_code`` so that messages and tests can refer to it.
"""

from __future__ import annotations


class NCZError(Exception):
    """Base class of every error nczmap raises on purpose."""

    nc_code: int | None = None


class EmptyError(NCZError):
    """The key names no content (netcdf-c NC_EEMPTY): a "directory" key or nothing at all."""

    nc_code = -139

    def __init__(self, key: str, where: str = "") -> None:
        self.key = key
        self.where = where
        suffix = f" in {where}" if where else ""
        super().__init__(f"key {key!r} has no content{suffix}")

    def __reduce__(self):  # raised in a dask worker, it must arrive whole
        return (type(self), (self.key, self.where))


class URLError(NCZError):
    """A malformed dataset URL (netcdf-c NC_EURL)."""

    nc_code = -74


class ModeError(URLError):
    """A bad or contradictory ``#mode=`` fragment."""


class KeyNameError(NCZError, ValueError):
    """A zmap key that is not legal: ``..``, ``.``, empty segments, NUL or control characters."""

    nc_code = -36  # NC_EINVAL


class FormatError(NCZError):
    """Metadata that cannot be understood (netcdf-c NC_ENCZARR); the message names the key."""

    nc_code = -137


class AccessDenied(NCZError, PermissionError):
    """The storage refused access (netcdf-c NC_EACCESS / NC_EAUTH)."""

    nc_code = -77


class DatasetNotFound(NCZError, FileNotFoundError):
    """The dataset itself (directory, zip file, bucket prefix) does not exist (NC_ENOOBJECT)."""

    nc_code = -141


class DatasetExists(NCZError, FileExistsError):
    """Refusing to create over something that is not a Zarr/NCZarr store (NC_EOBJECT)."""

    nc_code = -140


class ReadOnlyError(NCZError, PermissionError):
    """A write, delete or truncate on a map opened read-only (NC_EPERM)."""

    nc_code = -37


class StorageError(NCZError, OSError):
    """The storage itself failed: an unreadable zip, an I/O error, a closed map."""

    nc_code = -68  # NC_EIO


class DatasetLocked(StorageError):
    """Another writer has the dataset open for writing (nczmap's writer lock; netcdf-c has none): NC_EPERM."""

    nc_code = -37


class RangeError(NCZError, ValueError):
    """A byte range that cannot be read: negative start or count (NC_EEDGE)."""

    nc_code = -57


class DataError(NCZError, TypeError):
    """Data given to ``write`` that is not a contiguous bytes-like object."""

    nc_code = -36


class KeyConflictError(NCZError):
    """A write that would put an object where a directory is, or under another object (NC_EOBJECT)."""

    nc_code = -140


class DriverNotAvailable(NCZError):
    """The URL names a storage driver this installation cannot provide (NC_ENOTBUILT)."""

    nc_code = -128


def from_os_error(exc: OSError, message: str) -> NCZError:
    """The nczmap error for an ``OSError`` met while doing what ``message`` says."""
    if isinstance(exc, PermissionError):
        return AccessDenied(f"{message}: permission denied")
    return StorageError(f"{message}: {exc.strerror or exc}")


class SelectionError(NCZError, IndexError):
    """An index or slice that does not fit the variable (also an IndexError, as in numpy)."""

    nc_code = -40  # NC_EINVALCOORDS


class EncodingError(NCZError, ValueError):
    """An xarray ``encoding`` (chunks, compression, fill value) that cannot be written as asked."""

    nc_code = -36  # NC_EINVAL
