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
    from nczmap.dump import dump_records
    from nczmap.zmap import open_map

    with open_map(args.url, "r") as zmap:
        elide = args.header or args.type is None
        for record in dump_records(zmap, args.type or "ubyte", elide):
            _write_line(record)


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
