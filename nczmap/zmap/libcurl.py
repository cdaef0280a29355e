"""pycurl loaded with its own libcurl, whatever the process loaded before it.

A library loaded with ``RTLD_GLOBAL`` answers for its symbols' names in every library loaded after it.
ecCodes' wheels load eckit's bundled libcurl 7.61.1 (with its OpenSSL 1.1, nghttp2, brotli...) that way
(through findlibs, when ``eccodes`` or cfgrib is imported, and listing xarray's engines imports cfgrib): a
pycurl imported after it has its ``curl_*`` calls bound to that libcurl, and refuses to load ("libcurl
link-time version (7.61.1) is older than compile-time version"); a foreign libcurl newer than pycurl's
would be mixed with it silently, as would a foreign nghttp2 under pycurl's libcurl.

Loaded with ``RTLD_DEEPBIND`` (glibc), pycurl's extension and the libraries that come with it (its
wheel's libcurl and theirs) look among their own dependencies first, and in the global scope only for
what those do not define. The flag goes to a ``ctypes`` load of the extension's file made just before the
import, whose own ``dlopen`` then finds the file loaded and keeps its bindings: ``sys.setdlopenflags``
would also apply to extensions other threads import meanwhile. The load is ``RTLD_LOCAL``: pycurl's
libcurl answers for nobody else (netCDF-C's and GDAL's libcurl, or eckit's, keep theirs), so every
order works both ways.

A shared library is bound once a process: a pycurl first imported by someone else after a foreign
libcurl was made global keeps the bindings that made its import fail (another import fails the same
way), and without ``RTLD_DEEPBIND`` (musl, macOS) nothing can be done about a libcurl made global
first. :class:`ClientUnavailable` then says which libcurl was loaded and how to avoid it.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import os
import sys
from importlib.machinery import ExtensionFileLoader, PathFinder
from types import ModuleType

from nczmap.errors import StorageError

__all__ = ["ClientUnavailable", "global_libcurl", "load_pycurl"]


class ClientUnavailable(StorageError):
    """pycurl cannot be used in this process (not installed, or bound to another libcurl)."""


def load_pycurl() -> ModuleType:
    """The ``pycurl`` module, its extension bound to the libcurl it was built with (see the module's
    notes); :class:`ClientUnavailable` saying why and what to do where that cannot be."""
    try:
        return _import()
    except ImportError as exc:
        raise ClientUnavailable(_why(exc)) from None


def global_libcurl() -> tuple[str, str | None] | None:
    """The version text (``curl_version()``) and file of the libcurl in the process's global scope (one
    loaded with ``RTLD_GLOBAL``, or by the program itself), or None: the one whose ``curl_*`` functions
    a library loaded without ``RTLD_DEEPBIND`` gets."""
    try:
        function = ctypes.CDLL(None).curl_version  # dlopen(NULL): the global scope
    except (AttributeError, OSError):
        return None
    function.restype = ctypes.c_char_p
    function.argtypes = []
    version = (function() or b"").decode("latin-1")
    return version, _file_of(function)


def _import() -> ModuleType:
    if "pycurl" not in sys.modules:
        _preload_extension()
    return importlib.import_module("pycurl")


def _preload_extension() -> None:
    """pycurl's extension loaded ``RTLD_DEEPBIND | RTLD_LOCAL`` (where glibc has the flag) before its
    import: the import's ``dlopen`` finds it loaded and keeps its bindings. Anything unexpected is left
    to the import, which says what is wrong."""
    deep = getattr(os, "RTLD_DEEPBIND", 0)
    package = importlib.util.find_spec("pycurl")
    if not deep or package is None or not package.submodule_search_locations:
        return
    spec = PathFinder.find_spec("pycurl._pycurl", list(package.submodule_search_locations))
    if spec is None or not spec.origin or not isinstance(spec.loader, ExtensionFileLoader):
        return
    try:
        ctypes.CDLL(spec.origin, mode=os.RTLD_NOW | os.RTLD_LOCAL | deep)
    except OSError:
        return


def _why(exc: ImportError) -> str:
    """What :class:`ClientUnavailable` says about the failed import ``exc``."""
    what = f"pycurl (nczmap's HTTP client) cannot be loaded: {exc}"
    found = global_libcurl()
    if found is None:
        return what
    version, path = found
    named = (version.split() or ["a libcurl"])[0] + (f" ({os.path.normpath(path)})" if path else "")
    return (
        f"{what}. {named} was loaded into the process's global scope (RTLD_GLOBAL: ecCodes' wheels load "
        "eckit's libcurl so when eccodes or cfgrib is imported) before pycurl was first loaded, and a "
        "library's bindings last as long as the process. Let nczmap load pycurl first: import "
        "nczmap.zmap.http before ecCodes (or cfgrib, or xarray's list of engines) and before anything "
        "imports pycurl, or load ecCodes with nczmap.format.gribcodec.import_eccodes(), which keeps its "
        "libraries to itself; or read over HTTP in another process"
    )


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _file_of(function: ctypes._CFuncPtr) -> str | None:
    """The file of the shared library defining ``function`` (``dladdr``), or None."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (AttributeError, OSError):
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)
