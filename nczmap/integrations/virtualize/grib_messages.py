"""GRIB2 framing: where each message of a file is, its sections 1 to 5, and what they say about time.

A GRIB2 message is section 0 (``GRIB``, the discipline, edition 2, the message's length in 8 bytes), then
sections of a 4-byte length and a 1-byte number: 1 (identification, with the reference time), 2 (local
use, optional), 3 (grid), 4 (product), 5 (data representation), 6 (bitmap), 7 (data), and ``7777``. Only
sections 0 to 6's headers are read; the data section is skipped. A message whose sections repeat (several
fields in one message) is refused by name: a chunk reference is one whole message.

The file is walked message to message, each message's section 0 giving where the next starts. Reads are
windows: a few KiB at each message of a local file, and of a remote one while its messages are large
(only their headers are read); 8 MiB at a time from a remote file while its messages are small (under 2
MiB: reading them through costs less than a request a message, sequential, at a network's latency).
Every length is checked against the message and the file before it is used, so a damaged file is a
:class:`~nczmap.errors.FormatError` naming it and the offset.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass

from nczmap.errors import FormatError

MAGIC = b"GRIB"
END = b"7777"
ORDER = (1, 2, 3, 4, 5, 6, 7)  # section 2 may be absent
SMALLEST = {1: 21, 2: 5, 3: 14, 4: 9, 5: 11, 6: 6, 7: 5}  # the shortest length each section can have
HOP = 16 << 10  # read at each message of a local file, or of a remote one while its messages are large
THROUGH = 8 << 20  # read at a time from a remote file while its messages are small
# A remote file's messages this small on average are read through rather than hopped over: fetching one
# costs less than the latency of a request (2 MiB: 40 ms at 50 MB/s)
SMALL_MESSAGE = 2 << 20
SEARCH = 64 << 10  # bytes searched for the next GRIB after a message (padding between messages)
# An inventory beside a remote file (wgrib2's ``FILE.idx``, ``n:offset:...`` a line, as NOAA's archives keep
# them) tells where every message starts: their headers are then fetched together, this much at each
INDEXED_HOP = 4 << 10
INDEX_LIMIT = 4 << 20  # the largest inventory read (a line a message: tens of thousands of messages)
# indicatorOfUnitOfTimeRange -> seconds (code table 4.4; months, years, decades... have no fixed length)
UNIT_SECONDS = {0: 60, 1: 3600, 2: 86400, 10: 10800, 11: 21600, 12: 43200, 13: 1}
STATISTICAL = {8: 34, 11: 37}  # product templates over a time interval: octet where their interval starts


@dataclass(frozen=True)
class Message:
    """One GRIB2 message: where it is, and its sections 1 to 5 (``sections[n]``, section 2 may be
    absent) and the bitmap indicator of section 6."""

    offset: int
    length: int
    discipline: int
    sections: dict[int, bytes]
    bitmap: int

    @property
    def grid_template(self) -> int:
        return _u(self.sections[3], 12, 2)

    @property
    def product_template(self) -> int:
        return _u(self.sections[4], 7, 2)

    @property
    def data_template(self) -> int:
        return _u(self.sections[5], 9, 2)

    @property
    def points(self) -> int:
        """numberOfDataPoints (section 3)."""
        return _u(self.sections[3], 6, 4)

    def reference_time(self) -> datetime.datetime | None:
        """Section 1's reference time to the minute, as cfgrib takes it (dataDate, dataTime); None if it
        is no date."""
        s1 = self.sections[1]
        try:
            return datetime.datetime(_u(s1, 12, 2), s1[14], s1[15], s1[16], s1[17])
        except ValueError:
            return None

    def end_seconds(self) -> int | None:
        """The end of the forecast period in seconds (ecCodes' endStep) where the product template and
        units make it plain (templates 0, 1, 8 and 11 with one time range); None otherwise."""
        s4, template = self.sections[4], self.product_template
        if template not in (0, 1, 8, 11) or len(s4) < 22:
            return None
        unit = UNIT_SECONDS.get(s4[17])
        if unit is None:
            return None
        start = _u(s4, 18, 4) * unit
        if template not in STATISTICAL:
            return start
        at = STATISTICAL[template]  # octets: end of interval (7), ranges (1), missing (4), then ranges
        if len(s4) < at + 24 or s4[at + 7] != 1:
            return None
        range_unit = UNIT_SECONDS.get(s4[at + 14])
        if range_unit is None:
            return None
        return start + _u(s4, at + 15, 4) * range_unit

    def description_key(self) -> bytes:
        """The bytes that decide how ecCodes describes the message but for its times: sections 0's
        discipline, 1 to 4 and 5's template, with the reference time, forecast time and end of interval
        blanked where :meth:`end_seconds` reads them."""
        s1 = bytearray(self.sections[1])
        s1[12:19] = bytes(7)
        s4 = bytearray(self.sections[4])
        if self.end_seconds() is not None:
            s4[18:22] = bytes(4)
            at = STATISTICAL.get(self.product_template)
            if at is not None:
                s4[at : at + 7] = bytes(7)
        parts = [bytes([self.discipline]), bytes(s1), self.sections.get(2, b""), self.sections[3], bytes(s4)]
        parts.append(self.sections[5][9:11])
        return b"".join(len(part).to_bytes(4, "big") + part for part in parts)

    def full_key(self) -> bytes:
        """:meth:`description_key` without blanks: for messages whose times ecCodes alone reads."""
        parts = [bytes([self.discipline]), *(self.sections.get(n, b"") for n in (1, 2, 3, 4))]
        parts.append(self.sections[5][9:11])
        return b"".join(len(part).to_bytes(4, "big") + part for part in parts)

    def header_only(self) -> bytes:
        """The message with an empty bitmap and data section: what ecCodes needs to read its keys."""
        body = b"".join(self.sections[n] for n in (1, 2, 3, 4, 5) if n in self.sections)
        body += b"\x00\x00\x00\x06\x06\xff" + b"\x00\x00\x00\x05\x07"
        total = 16 + len(body) + len(END)
        return MAGIC + b"\x00\x00" + bytes([self.discipline, 2]) + total.to_bytes(8, "big") + body + END


def _u(data: bytes, at: int, width: int) -> int:
    return int.from_bytes(data[at : at + width], "big")


class Window:
    """The bytes of a file read in windows: a few KiB where messages are large, MiB where small."""

    def __init__(
        self, read: Callable[[int, int], bytes], size: int, remote: bool = False, hop: int = HOP
    ) -> None:
        self.read = read
        self.size = size
        self.remote = remote
        self.hop = hop
        self.start = 0
        self.data = b""
        self.messages = 0
        self.message_bytes = 0

    def get(self, offset: int, length: int) -> bytes:
        end = offset + length
        if not (self.start <= offset and end <= self.start + len(self.data)):
            small = self.remote and self.messages and self.message_bytes // self.messages <= SMALL_MESSAGE
            wanted = max(length, THROUGH if small else self.hop)
            self.start = offset
            self.data = self.read(offset, min(wanted, self.size - offset))
        return self.data[offset - self.start : end - self.start]

    def counted(self, length: int) -> None:
        self.messages += 1
        self.message_bytes += length


def walk(
    read: Callable[[int, int], bytes], size: int, name: str, remote: bool = False, hop: int = HOP
) -> list[Message]:
    """Every message of the file, in order (``remote``: read through small messages; else ``hop`` bytes
    read at each message, and at each one's end)."""
    window = Window(read, size, remote, hop)
    found: list[Message] = []
    offset = 0
    while offset < size:
        message = _message(window, offset, name)
        window.counted(message.length)
        found.append(message)
        offset = _next_message(window, message.offset + message.length, name)
    return found


def index_offsets(text: bytes, size: int) -> list[int] | None:
    """Where the messages of a file of ``size`` bytes start, from its inventory ``text`` (wgrib2's ``.idx``:
    ``number:offset:...`` a line), sorted; None unless every line has a whole-number offset, the first is 0
    and all lie inside the file. Only a hint: the messages are still read and checked where they are."""
    offsets: set[int] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(b":", 2)
        if len(fields) < 3 or not fields[1].isdigit() or len(fields[1]) > 18:
            return None
        offsets.add(int(fields[1]))
    found = sorted(offsets)
    if not found or found[0] != 0 or found[-1] >= size:
        return None
    return found


def index_windows(offsets: list[int], size: int, hop: int) -> list[tuple[int, int]]:
    """The reads :func:`walk` makes (``hop`` bytes a read) of a file whose messages start at ``offsets``,
    one right after another: the first message's head, then at each message's end its ``7777`` and the
    next one's head, and the last one's ``7777``."""
    windows = [(0, min(hop, size))]
    windows += [(offset - len(END), min(hop, size - offset + len(END))) for offset in offsets[1:]]
    windows.append((size - len(END), len(END)))
    return windows


def error(name: str, offset: int, message: str) -> FormatError:
    return FormatError(f"GRIB file {name}: {message} (the message at byte {offset})")


def _next_message(window: Window, offset: int, name: str) -> int:
    """Where the next message starts: at ``offset``, or after padding (zeros, or bytes that are no GRIB
    within :data:`SEARCH` bytes); the end of the file if only zeros follow."""
    if offset >= window.size or window.get(offset, min(4, window.size - offset)) == MAGIC:
        return offset
    following = window.get(offset, min(SEARCH, window.size - offset))
    found = following.find(MAGIC)
    if found >= 0:
        return offset + found
    if not following.strip(b"\x00") and offset + len(following) == window.size:
        return window.size
    raise error(name, offset, f"no GRIB message follows within {SEARCH} bytes of the previous one")


def _message(window: Window, offset: int, name: str) -> Message:
    if window.size - offset < 16:
        raise error(name, offset, f"the file ends {window.size - offset} bytes after it, inside section 0")
    head = window.get(offset, 16)
    if head[:4] != MAGIC:
        raise error(name, offset, f"it does not start with GRIB ({head[:4]!r})")
    edition = head[7]
    if edition != 2:
        what = "GRIB edition 1 (GRIB1) is not supported" if edition == 1 else f"edition {edition} is unknown"
        raise error(name, offset, f"{what}: only GRIB2 is read")
    length = _u(head, 8, 8)
    if length < 16 + sum(SMALLEST[n] for n in (1, 3, 4, 5, 6, 7)) + len(END):
        raise error(name, offset, f"its length {length} is shorter than a message can be")
    if length > window.size - offset:
        raise error(name, offset, f"its length {length} runs past the end of the file ({window.size} bytes)")
    sections, bitmap = _sections(window, offset, length, name)
    return Message(offset, length, head[6], sections, bitmap)


def _sections(window: Window, offset: int, length: int, name: str) -> tuple[dict[int, bytes], int]:
    """Sections 1 to 5 of the message at ``offset`` and its bitmap indicator, checked to come once each,
    in order, within the message, the last followed by ``7777``."""
    end = offset + length - len(END)
    position = offset + 16
    sections: dict[int, bytes] = {}
    bitmap = 255
    expected = 0  # the index in ORDER of the next section allowed
    while position < end:
        if end - position < 5:
            raise error(name, offset, f"{end - position} bytes before 7777 are no section")
        head = window.get(position, 5)
        size, number = _u(head, 0, 4), head[4]
        if number not in ORDER:
            raise error(name, offset, f"section number {number} at byte {position} is no GRIB2 section")
        if 7 in sections or number in sections or ORDER.index(number) < expected:
            raise error(
                name,
                offset,
                f"section {number} comes again at byte {position}: messages of several fields (repeated "
                "sections) are not supported",
            )
        if ORDER.index(number) > expected + (1 if ORDER[expected] == 2 else 0):
            raise error(name, offset, f"section {number} at byte {position} follows a missing section")
        if not SMALLEST[number] <= size <= end - position:
            raise error(name, offset, f"section {number} at byte {position} has length {size}")
        if number <= 5:
            sections[number] = window.get(position, size)
        elif number == 6:
            bitmap = window.get(position, 6)[5]
            sections[6] = b""
        else:
            sections[7] = b""
        expected = ORDER.index(number) + 1
        position += size
    if position != end or 7 not in sections:
        raise error(
            name, offset, "its sections do not end at its 7777" if 7 in sections else "it has no data"
        )
    if window.get(end, 4) != END:
        raise error(name, offset, f"it does not end with 7777 ({window.get(end, 4)!r})")
    for number in (6, 7):
        sections.pop(number)
    return sections, bitmap
