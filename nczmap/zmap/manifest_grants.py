"""What a manifest may read by default: its own directory, unless that directory is too wide to grant
without asking (the root, a home directory or one above it), which then grants nothing and says why."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nczmap.errors import AccessDenied
from nczmap.manifest.containers import Container, normalize

_SECRETS = (".ssh", ".aws", ".gnupg")  # a directory holding one of these is someone's home


def default_container(base: str, options: dict, granted: list[Container]) -> Container:
    """The manifest's own directory, granted by default, except for a local manifest lying in ``/``, a home
    directory or a directory above one: whatever a reference named there would be readable (``~/.ssh``,
    ``~/.aws``), so such a directory is granted only explicitly."""
    if not base.startswith("file://"):
        return Container(base, options)
    why = too_wide(os.path.realpath(base[len("file://") :]))
    if why is None:
        return Container(base, options)
    return Withheld(base, options, reason=why, others=tuple(granted))


def too_wide(directory: str) -> str | None:
    """Why ``directory`` (real) is too wide to grant by default, or None."""
    if directory == "/":
        return "the root directory"
    home = os.path.expanduser("~")
    home = os.path.realpath(home) if home.startswith("/") else None
    if home == directory:
        return "your home directory"
    if home is not None and home.startswith(directory + "/"):
        return f"a directory above your home directory {home}"
    held = [name for name in _SECRETS if os.path.lexists(os.path.join(directory, name))]
    if held:
        return f"a home directory (it holds {', '.join(held)})"
    return None


@dataclass(frozen=True)
class Withheld(Container):
    """The manifest's directory when it is too wide to grant by default (:func:`default_container`): it
    grants nothing, and refuses a reference inside it that no explicit grant covers, saying why."""

    reason: str = field(default="", compare=False)
    others: tuple[Container, ...] = field(default=(), compare=False, repr=False)

    def relative(self, url: str) -> str | None:
        if super().relative(url) is None or self._granted(url):
            return None
        directory = self.prefix[len("file://") :]
        grant = url[len("file://") :].rsplit("/", 1)[0] + "/"
        raise AccessDenied(
            f"reference {url} lies in {directory}, the manifest's own directory, which is not granted by "
            f"default because it is {self.reason}: its whole tree (~/.ssh, ~/.aws...) would be readable by "
            f"the manifest. Grant what the references need explicitly: containers=[{grant!r}] (Python) or "
            f"--allow {grant} (command line)"
        )

    def _granted(self, url: str) -> bool:
        spellings = {url, normalize(url, None)} if url.startswith("file://") else {url}
        return any(c.relative(u) is not None for c in self.others for u in spellings)
