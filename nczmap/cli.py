"""The ``nczmap`` command. Thin: parses arguments and calls the library."""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import warnings
from collections.abc import Sequence

from nczmap._version import __version__
from nczmap.errors import NCZError


def _grants(args: argparse.Namespace, url: str) -> dict[str, object]:
    """``containers=`` for the driver when ``--allow`` was given (only manifests and Icechunk repositories
    accept it)."""
    if not args.allow:
        return {}
    from nczmap.errors import URLError
    from nczmap.url import parse_url

    if parse_url(url).driver not in ("manifest", "icechunk"):
        raise URLError(f"--allow grants sources to manifests, and {url!r} is not one (#mode=...,manifest)")
    # a relative directory is taken from the working directory (containers are absolute prefixes)
    return {"containers": [p if "://" in p else os.path.abspath(p) + "/" for p in args.allow]}


def _search(args: argparse.Namespace) -> None:
    from nczmap.zmap import open_map

    with open_map(args.url, "r", **_grants(args, args.url)) as zmap:
        for name in zmap.search(args.prefix):
            _write_line(name.encode("utf-8", "surrogateescape"))


def _dump(args: argparse.Namespace) -> None:
    from nczmap.zmap import open_map
    from nczmap.zmap.objdump import dump_records

    with open_map(args.url, "r", **_grants(args, args.url)) as zmap:
        elide = args.header or args.type is None
        for record in dump_records(zmap, args.type or "ubyte", elide):
            _write_line(record)


def _copy(args: argparse.Namespace) -> None:
    from nczmap.integrations.copy import copy
    from nczmap.progress import command_progress

    bar = command_progress("copying", "B", args.progress)
    try:
        copy(
            args.source,
            args.destination,
            args.netcdf_version,
            bar,
            keep_filters=args.keep_filters,
            **_grants(args, args.source),
        )
    finally:
        if bar is not None:
            bar.close()


def _virtualize(args: argparse.Namespace) -> None:

    from nczmap.integrations.virtualize import VirtualizeWarning, virtualize
    from nczmap.progress import command_progress

    bars = [command_progress(label, unit, args.progress) for label, unit in _VIRTUALIZE_BARS]
    with warnings.catch_warnings(), contextlib.ExitStack() as closing:
        for bar in filter(None, bars):
            closing.callback(bar.close)  # a bar cut short by an error still ends its line
        warnings.simplefilter("ignore", VirtualizeWarning)  # reported below, one line each
        options = {"max_chunk_bytes": args.max_chunk_bytes} if args.max_chunk_bytes is not None else {}
        for name in ("concurrency", "deadline", "retry_budget"):
            if getattr(args, name) is not None:
                options[name] = getattr(args, name)
        result = virtualize(
            args.sources,
            args.destination,
            concat=args.concat,
            allow=args.allow or (),
            netcdf_version=args.netcdf_version,
            progress=bars[1] or False,
            new_dim=args.new_dim,
            load=args.load or None,
            skip_mismatched=args.skip_mismatched,
            checksums=args.checksums or None,
            reading=bars[0] or False,
            append=args.append,
            skip_unreadable=args.skip_unreadable,
            **options,
        )
    for refusal in result.refused:
        print(f"nczmap: warning: {refusal}", file=sys.stderr)
    for source, why in result.skipped:
        print(f"nczmap: warning: {source} left out: {why}", file=sys.stderr)
    for note in result.notes:
        print(f"nczmap: warning: {note}", file=sys.stderr)


_VIRTUALIZE_BARS = (("reading sources", "files"), ("virtualizing", "chunks"))


def _ncdump(args: argparse.Namespace) -> None:
    from nczmap.cdl import dump_cdl

    variables = [name for name in args.variables.split(",") if name] if args.variables else None
    # The model lives until the process ends: the cyclic collector would only scan its objects again and
    # again (a third of `ncdump -h` of a store with thousands of variables). It stays off while the model
    # is built and then, when this process is the command's own, never looks at it (frozen); it runs as
    # usual for whatever the data section makes. main() called in a process that goes on (tests,
    # notebooks) freezes nothing: what it made is collected as usual.
    gc.disable()
    try:
        opened = _open_for_dump(args)
    finally:
        if args.whole_process:
            gc.freeze()
        gc.enable()
    with opened as dataset:
        dump_cdl(
            dataset,
            sys.stdout.buffer,
            header_only=args.header,
            special=args.special,
            name=args.name,
            variables=variables,
            classic=_netcdf3_source(dataset),
            processes=True,  # values of large variables formatted on every core
        )


def _open_for_dump(args: argparse.Namespace):
    """The dataset ``args.url`` names: a store (any driver), or a netCDF-4/HDF5, netCDF-3 or TIFF file as
    C ncdump reads it (through the parsers ``virtualize`` uses)."""
    from nczmap.api import open_dataset

    path = args.url[len("file://") :] if args.url.startswith("file://") else args.url
    if "#" not in args.url and not args.allow and os.path.isfile(path):  # a store is a directory or zip
        from nczmap.integrations.virtualize import is_source_file, open_source_file

        if is_source_file(path):
            if args.name is None:
                args.name = os.path.splitext(os.path.basename(path))[0]
            return open_source_file(path)
    return open_dataset(args.url, "r", **_grants(args, args.url))


def _netcdf3_source(dataset) -> bool:
    """Whether ``dataset`` is a netCDF-3 file, or a manifest made of netCDF-3 files (ncdump prints their
    text attributes broken after newlines)."""
    from nczmap.cdl import source_format

    return source_format(dataset) == "netcdf3"


def _write_line(data: bytes) -> None:
    sys.stdout.buffer.write(data + b"\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nczmap", description="NCZarr storage (zmap) tools")
    parser.add_argument("--version", action="version", version=f"nczmap {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    grants = argparse.ArgumentParser(add_help=False)  # --allow, shared by the commands reading manifests
    grants.add_argument(
        "--allow",
        action="append",
        default=None,
        metavar="PREFIX",
        help="a directory (file:///data/, /data/) or S3 prefix (s3://bucket/path/) a manifest's references "
        "may be read under, besides the manifest's own directory (repeatable)",
    )

    shown = argparse.ArgumentParser(add_help=False)  # --progress/--quiet, for the long commands
    bars = shown.add_mutually_exclusive_group()
    bars.add_argument(
        "--progress",
        action="store_true",
        default=None,
        help="show progress bars even when standard error is not a terminal (by default only on one)",
    )
    bars.add_argument("-q", "--quiet", dest="progress", action="store_false", help="show no progress bars")

    search = commands.add_parser(
        "search", help="list the immediate children of a key, one name a line", parents=[grants]
    )
    search.add_argument("url", help="dataset URL, e.g. file:///data/x.zip#mode=nczarr,zip, or a path")
    search.add_argument("prefix", nargs="?", default="/", help="key whose children to list (default /)")
    search.set_defaults(run=_search)

    dump = commands.add_parser(
        "dump", help="print every object of the key tree (zmapio objdump format)", parents=[grants]
    )
    dump.add_argument("url", help="dataset URL or path")
    dump.add_argument(
        "-t",
        "--type",
        default=None,
        help="print chunk values as this type: ubyte, byte, char, short, ushort, int, uint, "
        "int64, uint64, float, double, string/<n> (default: sizes only)",
    )
    dump.add_argument(
        "-H", "--header", action="store_true", help="metadata only: chunk values are shown as ... (zmapio -h)"
    )
    dump.set_defaults(run=_dump)

    copier = commands.add_parser(
        "copy", help="copy a dataset (or a netCDF-4 file) to another URL", parents=[grants, shown]
    )
    copier.add_argument("source", help="dataset URL or path, or a netCDF-4/HDF5 file")
    copier.add_argument("destination", help="URL or path of the new dataset (.zip paths make a zip)")
    copier.add_argument(
        "--netcdf-version",
        default=None,
        help="netcdf-c release that must read the result (4.8.0, 4.9.0, 4.9.2; default 4.9.3+)",
    )
    copier.add_argument(
        "--keep-filters",
        action="store_true",
        help="keep compression for releases (4.9.0 and earlier) that decode it only with codec plugins",
    )
    copier.set_defaults(run=_copy)

    ncdump = commands.add_parser(
        "ncdump",
        help="print the dataset as CDL, exactly like netcdf-c's ncdump",
        add_help=False,
        parents=[grants],
    )
    ncdump.add_argument("url", help="dataset URL (e.g. file:///data/x.file#mode=nczarr,file) or path")
    ncdump.add_argument("--help", action="help", help="show this help message and exit")
    ncdump.add_argument("-h", dest="header", action="store_true", help="header only: no data section")
    ncdump.add_argument(
        "-s", dest="special", action="store_true", help="also show virtual attributes (_Storage ...)"
    )
    ncdump.add_argument("-n", dest="name", default=None, help="dataset name for the netcdf line")
    ncdump.add_argument(
        "-v", dest="variables", default=None, metavar="VAR,...", help="data of these variables only"
    )
    ncdump.set_defaults(run=_ncdump)

    virtual = commands.add_parser(
        "virtualize",
        help="write a manifest (kerchunk JSON or Parquet) presenting netCDF-4/HDF5, netCDF-3, TIFF/COG and "
        "GRIB2 files and NCZarr/Zarr stores as one NCZarr dataset, copying no data",
        parents=[shown],
    )
    virtual.add_argument(
        "sources",
        nargs="+",
        metavar="SRC",
        help="netCDF-4/HDF5, netCDF-3, TIFF or GRIB2 files (a GRIB2 message is one chunk; HRRR, GFS: "
        "--concat time or step): paths (globs expanded), http(s) URLs, S3 objects or prefixes "
        "(s3://bucket/dir/), or @LIST, a file naming one source a line (# comments); NCZarr and Zarr "
        "stores: directories, and URLs whose #mode= names nczarr, zarr or xarray "
        "(file:///runs/day1.zip#mode=nczarr,zip, s3://bucket/runs/day*#mode=zarr,s3)",
    )
    virtual.add_argument("destination", metavar="DST", help="the manifest: a path or URL, e.g. refs.json")
    virtual.add_argument(
        "--concat", default=None, metavar="DIM", help="join several files along this dimension (e.g. time)"
    )
    virtual.add_argument(
        "--new-dim",
        default=None,
        metavar="NAME=PATTERN",
        help="stack the files along a new dimension, its coordinate from each file name (time=%%Y%%m%%d)",
    )
    virtual.add_argument(
        "--load",
        default="",
        metavar="VAR,...",
        help="store these variables as data instead of references (the joined coordinate always is)",
    )
    virtual.add_argument(
        "--skip-mismatched",
        action="store_true",
        help="leave out (and list) files that cannot be joined to the first (structure, or what their "
        "numbers mean) instead of failing",
    )
    virtual.add_argument(
        "--max-chunk-bytes",
        type=int,
        default=None,
        metavar="N",
        help="cut contiguous data into references of at most N bytes (default 4 MiB)",
    )
    virtual.add_argument(
        "--allow",
        action="append",
        default=None,
        metavar="PREFIX",
        help="where the references may point (repeatable; default: each source's directory)",
    )
    virtual.add_argument(
        "--netcdf-version",
        default=None,
        help="netcdf-c release that must read the result (4.8.0, 4.9.0, 4.9.2; default 4.9.3+)",
    )
    virtual.add_argument(
        "--checksums",
        action="store_true",
        help="record the crc32c of every referenced range (read once now), checked on every read: a source "
        "rewritten in place is then detected even with its size and modification time restored",
    )
    virtual.add_argument(
        "--skip-unreadable",
        action="store_true",
        help="leave out (and list) sources that cannot be read, after retries, or are in no known format, "
        "instead of failing",
    )
    virtual.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        metavar="N",
        help="remote sources parsed at once (default 128; local files are parsed one after another)",
    )
    virtual.add_argument(
        "--deadline",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="how long a request to a remote source may take in all: SECONDS, plus 1 s a MB of its length "
        "(default 30)",
    )
    virtual.add_argument(
        "--retry-budget",
        type=_positive_float,
        default=None,
        metavar="SECONDS",
        help="no retry of a failed request (up to 10 attempts, with back-off) starts later than this after "
        "its first attempt (default 120)",
    )
    virtual.add_argument(
        "--append",
        action="store_true",
        help="add SRC... to the existing dataset DST (a manifest or Icechunk repository virtualize made), "
        "parsing only them and joining them as DST records (its --concat/--new-dim and options)",
    )
    virtual.set_defaults(run=_virtualize)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as users of a command want them: one line, no Python source location."""
    print(f"nczmap: warning: {message}", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.whole_process = argv is None  # the command line's own process: it ends when main returns
    shown, warnings.showwarning = warnings.showwarning, _one_line_warning
    try:
        args.run(args)
        sys.stdout.flush()
    except NCZError as exc:
        print(f"nczmap: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): not an error
        return 0
    finally:
        warnings.showwarning = shown  # a process that goes on keeps its own way of showing warnings
    return 0


if __name__ == "__main__":
    sys.exit(main())
