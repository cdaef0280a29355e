"""Virtual datasets: manifests whose keys hold inline bytes or references to byte ranges of other files.

- ``model``: the :class:`~nczmap.manifest.model.Manifest` (objects inline, chunk references per array in
  numpy columns, so a million chunks are not a million Python objects);
- ``kerchunk_json``: kerchunk's JSON reference format (v0 and v1), read and written;
- ``containers``: which URL prefixes a manifest may reach (untrusted input: nothing outside a grant).

The zmap driver over a manifest is ``nczmap.zmap.manifest``.
"""
