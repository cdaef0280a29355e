"""Appending new files to a virtual dataset without reading the archive again.

A virtual dataset records how it was made (:class:`Join`: the dimension its files are joined along, the
options that decide the layout): under the ``"virtualize"`` key of nczmap's ``"nczmap"`` object in a
kerchunk manifest, in the commit metadata of an Icechunk repository. Appending opens the dataset for
update (a manifest under its writer lock; an Icechunk branch in one session), presents it to the combiner
as the first "file" (:func:`existing_file`: its model, and storages of kind ``existing``), parses only
the new files and plans the join exactly as :func:`~.virtualize` plans one of every file: the same
structure and encoding checks, against what the dataset holds. The dataset's layouts never change (but
the joined coordinate's, written again whole); the new files' chunks become references where they fit
that layout, their values are written into it where they do not. The joined coordinate must continue in
order. Anything refused raises before a byte is written; the manifest is saved (or the repository
committed) only when everything is written, so a failure leaves the dataset as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from nczmap.errors import FormatError
from nczmap.format import Dimension, Group
from nczmap.integrations.virtualize.combine import DEFAULT_MAX_CHUNK_BYTES, CombineOptions, Plan
from nczmap.integrations.virtualize.encodings import digest
from nczmap.integrations.virtualize.parsed import (
    ParsedFile,
    Refusal,
    SourceVariable,
    Storage,
    find_group,
    model_of,
)

RECORD = "virtualize"  # the key of the record in nczmap's manifest extension and in commit metadata
VERSION = 1


@dataclass
class Join:
    """How a virtual dataset was made: what an append must do the same way."""

    concat: str | None = None
    new_dim: tuple[str, str] | None = None
    load: tuple[str, ...] = ()
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    checksums: bool = False
    refused: list[str] = field(default_factory=list)  # variables left out when it was made
    digests: dict[str, str] = field(default_factory=dict)  # small variables not joined: their values'

    def to_json(self) -> dict:
        return {
            "version": VERSION,
            "concat": self.concat,
            "new_dim": list(self.new_dim) if self.new_dim else None,
            "load": list(self.load),
            "max_chunk_bytes": self.max_chunk_bytes,
            "checksums": self.checksums,
            "refused": sorted(self.refused),
            "digests": dict(sorted(self.digests.items())),
        }

    @classmethod
    def from_json(cls, record: object, where: str) -> Join:
        """The record as read (checked: a manifest is untrusted input)."""
        if not isinstance(record, dict) or record.get("version") != VERSION:
            raise FormatError(f"{where}: its record of how it was virtualized is not one nczmap reads")
        concat, new_dim = record.get("concat"), record.get("new_dim")
        load, size, refused = record.get("load", []), record.get("max_chunk_bytes"), record.get("refused", [])
        digests = record.get("digests", {})
        valid = (
            (concat is None or isinstance(concat, str))
            and (new_dim is None or (isinstance(new_dim, list) and len(new_dim) == 2))
            and (new_dim is None or all(isinstance(x, str) for x in new_dim))
            and isinstance(load, list)
            and all(isinstance(x, str) for x in load)
            and type(size) is int
            and size > 0
            and isinstance(record.get("checksums", False), bool)
            and isinstance(refused, list)
            and all(isinstance(x, str) for x in refused)
            and isinstance(digests, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in digests.items())
        )
        if not valid:
            raise FormatError(
                f"{where}: its record of how it was virtualized is malformed: {json.dumps(record)[:200]}"
            )
        return cls(
            concat,
            tuple(new_dim) if new_dim else None,
            tuple(load),
            size,
            bool(record.get("checksums", False)),
            list(refused),
            dict(digests),
        )


def reconcile(recorded: Join | None, given: Join, named: set[str], where: str) -> Join:
    """The join to append with: the recorded one; an option the user gave (``named``) must agree with it.
    A dataset with no record (made otherwise) takes the options given, which must name a join."""
    if recorded is None:
        if given.concat is None and given.new_dim is None:
            raise FormatError(
                f"{where} records no join (it was not made by nczmap virtualize): give the dimension to "
                "append along (concat=/--concat or new_dim=/--new-dim)"
            )
        return given
    for name in named:
        mine, theirs = getattr(given, name), getattr(recorded, name)
        if name == "load":
            mine, theirs = sorted(mine), sorted(theirs)
        if mine == theirs:
            continue
        if name in ("concat", "new_dim"):
            made, asked = _join_spelled(recorded), _join_spelled(given)
        else:
            made, asked = _spelled(name, theirs), _spelled(name, mine)
        raise FormatError(
            f"{where} was made with {made}; appending joins and lays out the new files the same way, not "
            f"with {asked} (leave the option out to use the recorded one)"
        )
    return recorded


def _join_spelled(join: Join) -> str:
    if join.new_dim is not None:
        return "--new-dim " + "=".join(join.new_dim)
    return f"--concat {join.concat}" if join.concat else "no join"


def _spelled(name: str, value: object) -> str:
    if name == "load":
        return "--load " + (",".join(value) or "(nothing)")  # type: ignore[arg-type]
    return f"--{name.replace('_', '-')} {value}"


def options_for(join: Join, skip_mismatched: bool) -> CombineOptions:
    return CombineOptions(
        concat=join.concat,
        new_dim=join.new_dim,
        load=tuple(join.load),
        skip_mismatched=skip_mismatched,
        max_chunk_bytes=join.max_chunk_bytes,
    )


# --------------------------------------------------------------------------------- the existing dataset
def existing_file(dataset: Group, source: str, join: Join, like: Group | None = None) -> ParsedFile:
    """The dataset as the first parsed "file" of a join: its model, each variable's storage of kind
    ``existing`` (its own layout; ``values()`` reads it back; the digest of its values, if recorded).
    A dataset that does not say where its dimensions are defined (pure Zarr, Icechunk) has them where the
    new file ``like`` has them (see :func:`_place_dimensions`)."""

    def existing(variable, shape: tuple[int, ...]) -> Storage:
        layout = variable.layout
        storage = Storage(source, "existing", shape, tuple(layout.chunks), list(layout.codecs.configs))
        storage.values = _Existing(variable, shape)
        storage.digest = join.digests.get(variable.key)
        return storage

    root = model_of(dataset, existing, untyped=not dataset.dialect.is_nczarr)
    if like is not None and not dataset.dialect.is_nczarr:
        _place_dimensions(root, like)
    refusals = [Refusal(key, "it was left out when the dataset was made", source) for key in join.refused]
    return ParsedFile(source, root, refusals, format="existing")


def _place_dimensions(root: Group, like: Group) -> None:
    """Pure Zarr names a variable's dimensions but not the group defining them, so a variable of ``/g``
    along ``time`` reads as using a dimension ``/g/time``. Where the new file's ``/g`` defines no ``time``,
    the variable uses the dataset's ``time`` of an ancestor group (of the same length), else the one the
    new file's ``/g`` means (created in the dataset with the same length)."""
    for group in list(root.walk()):
        twin = find_group(like, group.path)
        if group.parent is None or twin is None:
            continue
        for name in [n for n in group.dimensions if n not in twin.dimensions]:
            mine = group.dimensions[name]
            held = group.parent.lookup_dimension(name)
            if held is None:
                theirs = twin.lookup_dimension(name)
                target = find_group(root, theirs.group.path) if theirs is not None and theirs.group else None
                if target is None:
                    continue
                held = target.dimensions[name] = Dimension(name, mine.size, mine.unlimited, target)
            if held.size != mine.size:
                continue  # not the same dimension: the checks name the difference
            del group.dimensions[name]
            for inner in group.walk():
                for variable in inner.variables.values():
                    variable.dims = tuple(held if d is mine else d for d in variable.dims)


class _Existing:
    """The values a variable of the dataset holds (read when a re-encoding or a rewrite needs them): only
    the ``shape`` it had when the append began, since the dataset's dimensions grow before the joined
    coordinate is written again (reading it whole then gave the held values and the new steps' fill)."""

    def __init__(self, variable, shape: tuple[int, ...]) -> None:
        self.variable = variable
        self.shape = tuple(shape)

    def __call__(self) -> np.ndarray:
        if not self.shape:
            return np.asarray(self.variable.read())
        return np.asarray(self.variable.read(tuple(slice(0, n) for n in self.shape)))


# --------------------------------------------------------------------------------- checks
def check_order(plan: Plan, dimension: str, where: str) -> None:
    """FormatError unless the joined coordinate (if any) of the plan increases across every file boundary
    from the dataset's last value on: appending never inserts before or among the values held."""
    coordinate = _coordinate(plan, dimension)
    if coordinate is None or coordinate.axis is None:
        return
    storages = coordinate.storages
    values = [np.asarray(storage.values()).ravel() for storage in storages]
    if values[0].dtype.kind not in "iuf":
        return
    last, after = values[0][-1:] if len(values[0]) else None, storages[0].source
    for storage, part in zip(storages[1:], values[1:], strict=True):
        if not len(part):
            continue
        if last is not None and not bool(part[0] > last[0]):
            units = coordinate.attrs.get("units", "")
            raise FormatError(
                f"{storage.source} cannot be appended to {where}: its {coordinate.name} starts at "
                f"{part[0].item()!r} ({units}), not after {last[0].item()!r} (the last of {after}); "
                "appending keeps the joined coordinate in order (nothing is inserted before the values held)"
            )
        last, after = part[-1:], storage.source


def _coordinate(plan: Plan, dimension: str) -> SourceVariable | None:
    path = dimension if dimension.startswith("/") else "/" + dimension
    for variable in plan.variables:
        if variable.key == path and len(variable.dims) == 1:
            return variable
    return None


def check_new_variables(plan: Plan, existing: ParsedFile, where: str) -> None:
    """A variable the dataset holds must still be there: a new file refusing one is refused."""
    recorded = {refusal.variable for refusal in existing.refused}
    for refusal in plan.refused:
        if refusal.attribute is None and refusal.variable not in recorded:
            raise FormatError(
                f"{refusal.source} cannot be appended to {where}: its variable {refusal.variable!r} cannot "
                f"be virtualized ({refusal.reason}), but the dataset holds it"
            )


def digests(plan: Plan) -> dict[str, str]:
    """The digests of the small variables not along the joined dimension (their values are the first
    file's), for appends to compare new files with."""
    found = {}
    for variable in plan.variables:
        if variable.axis is None:
            value = digest(variable)
            if value is not None:
                found[variable.key] = value
    return found
