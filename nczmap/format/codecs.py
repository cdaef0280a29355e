"""Zarr v2 codec chains (``filters`` then ``compressor``) through numcodecs, imported only when needed."""

from __future__ import annotations

from dataclasses import dataclass, field

from nczmap.errors import FormatError


@dataclass
class CodecChain:
    """The encode order is ``filters`` then ``compressor``; decoding runs it backwards."""

    filters: list[dict] = field(default_factory=list)
    compressor: dict | None = None
    itemsize: int = 1
    _codecs: list | None = field(default=None, repr=False)

    @property
    def configs(self) -> list[dict]:
        return [*self.filters, *([self.compressor] if self.compressor else [])]

    def _instances(self, where: str) -> list:
        if self._codecs is None:
            self._codecs = [self._make(config, where) for config in self.configs]
        return self._codecs

    def _make(self, config: dict, where: str):
        import numcodecs

        config = dict(config)
        if config.get("id") == "shuffle" and not config.get("elementsize"):
            config["elementsize"] = self.itemsize  # netcdf-c 4.10 writes 0, meaning "the type's size"
        try:
            return numcodecs.get_codec(config)
        except (ValueError, KeyError, TypeError) as exc:
            raise FormatError(f"{where} has unsupported codec: ({config.get('id')})") from exc

    def decode(self, data: bytes, where: str):
        """The decoded bytes as a buffer (bytes or a numpy array)."""
        for codec in reversed(self._instances(where)):
            try:
                data = codec.decode(data)
            except Exception as exc:  # numcodecs raises many unrelated types on corrupt input
                raise FormatError(f"cannot decode {where} with {codec!r}: {exc}") from exc
        return data

    def encode(self, data: bytes, where: str) -> bytes:
        for codec in self._instances(where):
            data = codec.encode(data)
        return bytes(data) if not isinstance(data, bytes) else data
