"""A store directory zipped as netcdf-c's zip driver zips one: every file a member named by its path
inside the store, members stored (uncompressed) unless told otherwise."""

from __future__ import annotations

import zipfile
from pathlib import Path


def zip_store(folder: Path, path: Path, compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for member in sorted(folder.rglob("*")):
            if member.is_file():
                archive.write(member, member.relative_to(folder).as_posix())
    return path
