"""The ``nczmap`` command. Thin: parses arguments and calls the library."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nczmap.errors import NCZError


def _search(args: argparse.Namespace) -> None:
    from nczmap.zmap import open_map

    with open_map(args.url, "r") as zmap:
        for name in zmap.search(args.prefix):
            _write_line(name.encode("utf-8", "surrogateescape"))


def _dump(args: argparse.Namespace) -> None:
    from nczmap.zmap import open_map
    from nczmap.zmap.objdump import dump_records

    with open_map(args.url, "r") as zmap:
        elide = args.header or args.type is None
        for record in dump_records(zmap, args.type or "ubyte", elide):
            _write_line(record)


def _copy(args: argparse.Namespace) -> None:
    from nczmap.integrations.copy import copy, terminal_progress

    copy(args.source, args.destination, args.netcdf_version, terminal_progress())


def _ncdump(args: argparse.Namespace) -> None:
    from nczmap.api import open_dataset
    from nczmap.cdl import dump_cdl

    variables = [name for name in args.variables.split(",") if name] if args.variables else None
    with open_dataset(args.url, "r") as dataset:
        dump_cdl(
            dataset,
            sys.stdout.buffer,
            header_only=args.header,
            special=args.special,
            name=args.name,
            variables=variables,
        )


def _write_line(data: bytes) -> None:
    sys.stdout.buffer.write(data + b"\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nczmap", description="NCZarr storage (zmap) tools")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    search = commands.add_parser("search", help="list the immediate children of a key, one name a line")
    search.add_argument("url", help="dataset URL, e.g. file:///data/x.zip#mode=nczarr,zip, or a path")
    search.add_argument("prefix", nargs="?", default="/", help="key whose children to list (default /)")
    search.set_defaults(run=_search)

    dump = commands.add_parser("dump", help="print every object of the key tree (zmapio objdump format)")
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

    copier = commands.add_parser("copy", help="copy a dataset (or a netCDF-4 file) to another URL")
    copier.add_argument("source", help="dataset URL or path, or a netCDF-4/HDF5 file")
    copier.add_argument("destination", help="URL or path of the new dataset (.zip paths make a zip)")
    copier.add_argument(
        "--netcdf-version",
        default=None,
        help="netcdf-c release that must read the result (4.8.0, 4.9.0, 4.9.2; default 4.9.3+)",
    )
    copier.set_defaults(run=_copy)

    ncdump = commands.add_parser(
        "ncdump", help="print the dataset as CDL, exactly like netcdf-c's ncdump", add_help=False
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
        sys.stdout.flush()
    except NCZError as exc:
        print(f"nczmap: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (e.g. `| head`): not an error
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
