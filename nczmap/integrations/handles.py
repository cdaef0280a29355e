"""Datasets shared with other processes: a handle travels as its map (which pickles by URL) and reopens there.

xarray's lazy arrays and dask's write targets hold a :class:`DatasetHandle`. In the process that opened the
dataset the handle is the dataset itself; pickled into a dask worker it becomes the map's URL, mode and
format options, and the worker opens the dataset once for every task that names the same handle (the
handle's token, new for every open, keeps a worker from reusing a dataset opened for an earlier job).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

from nczmap.errors import NCZError
from nczmap.format import Dataset, FormatOptions, open_on
from nczmap.format.model import Group
from nczmap.format.variable import Variable
from nczmap.zmap import ZMap

_OPENED: OrderedDict[str, Dataset] = OrderedDict()  # token -> dataset, in this process
_OPENED_LOCK = threading.Lock()
_KEEP = 32  # datasets a worker keeps open at once


class DatasetHandle:
    """A dataset that can be pickled: ``dataset`` opens it in this process on first use."""

    def __init__(self, dataset: Dataset, token: str | None = None) -> None:
        self._dataset: Dataset | None = dataset
        self._zmap: ZMap | tuple = dataset.zmap  # or, pickled, how to open it again (see __getstate__)
        self._mode = "r" if dataset.zmap.readonly else "r+"
        self._options: FormatOptions = dataset.options
        self.token = token or uuid.uuid4().hex

    @property
    def dataset(self) -> Dataset:
        if self._dataset is None or self._dataset.zmap.closed:
            self._dataset = _reopen(self.token, self._zmap, self._mode, self._options)
        return self._dataset

    def group(self, path: str) -> Group:
        return find_group(self.dataset, path)

    def variable(self, path: str) -> Variable:
        group_path, _, name = path.rpartition("/")
        group = self.group(group_path or "/")
        try:
            return group.variables[name]
        except KeyError:
            raise NCZError(f"{self.dataset.zmap.location} has no variable {path!r}") from None

    def __getstate__(self) -> dict:
        # A map that reopens by URL travels as the recipe its pickling gives (a zip open for writing refuses
        # here), followed where the dataset is used: a process that only passes the handle on (dask's
        # scheduler) never opens the storage, and a storage failure is reported where the data is read.
        zmap = self._zmap
        if isinstance(zmap, ZMap):
            zmap = zmap.reopen_recipe() or zmap
        return {"zmap": zmap, "mode": self._mode, "options": self._options, "token": self.token}

    def __setstate__(self, state: dict) -> None:
        self._dataset = None
        self._zmap = state["zmap"]
        self._mode = state["mode"]
        self._options = state["options"]
        self.token = state["token"]


def _reopen(token: str, zmap: ZMap | tuple, mode: str, options: FormatOptions) -> Dataset:
    with _OPENED_LOCK:
        dataset = _OPENED.get(token)
        if dataset is not None and not dataset.zmap.closed:
            _OPENED.move_to_end(token)
            return dataset
        if not isinstance(zmap, ZMap):  # a handle from another process: open its map here
            opener, arguments = zmap
            zmap = opener(*arguments)
        elif zmap.closed:  # this process opened the dataset and closed it since: open the map again
            zmap = zmap.reopened(mode)
        try:
            dataset = open_on(zmap, mode, options)
        except BaseException:
            zmap.close()
            raise
        _OPENED[token] = dataset
        while len(_OPENED) > _KEEP:
            _, old = _OPENED.popitem(last=False)
            old.zmap.close()
        return dataset


def find_group(dataset: Dataset, path: str | None) -> Group:
    """The group at ``path`` (``/a/b``, ``a/b``; ``None`` or ``/``: the root), or an error naming it."""
    group: Group = dataset
    for name in (path or "/").strip("/").split("/"):
        if not name:
            continue
        child = group.groups.get(name)
        if child is None:
            known = ", ".join(sorted(group.groups)) or "none"
            raise NCZError(
                f"{dataset.zmap.location} has no group {path!r}: {group.path!r} has no subgroup {name!r} "
                f"(subgroups: {known})"
            )
        group = child
    return group
