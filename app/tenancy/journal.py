"""The ledger's write-ahead file: what each request was sent, written before it is sent.

    a stream's write, a response ─▶ append(row)      one os.write of one line (O_APPEND)
    the ledger's flush            ─▶ rotate()         later rows go to a new segment;
                                     the commit ─▶ discard_through(segment)
    the server's start            ─▶ rows()           replayed into the ledger, then discarded

A row is cumulative: the request's whole service up to that write, so its last row says
everything and replaying a row twice changes nothing (the ledger adds only what its own rows
lack). Its status is ``partial`` until the request's final row.

What survives what: a ``kill -9`` of the server loses nothing that ``os.write`` returned (the
page cache is the kernel's, not the process's); a write is appended before the bytes it
describes go to the client, so a request cut by the process's death is charged at most the
one write that was under way. A crash of the machine itself (power, kernel) loses what the
kernel had not yet written back: there is no fsync (Linux writes dirty pages back within
``vm.dirty_expire_centisecs``, 30 s by default). A failed write (disk full) is logged and
counted; the row still reaches the ledger through memory, with the flush interval's bound.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from app.tenancy.ledger import UsageRow

log = logging.getLogger("quanta.journal")

PREFIX = "segment-"
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(UsageRow).decode


class Journal:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.failed_writes = 0
        self._fd: int | None = None
        self._segment = 0
        self._dirty = False  # rows appended to the open segment

    def segments(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.glob(f"{PREFIX}*") if p.name[len(PREFIX) :].isdigit()]
        return sorted(found, key=_number)

    def rows(self) -> dict[str, UsageRow]:
        """The last row of every request in the segments left on disk (a torn last line,
        cut by the process's death in the middle of a write, is skipped)."""
        last: dict[str, UsageRow] = {}
        for path in self.segments():
            for line in path.read_bytes().splitlines():
                try:
                    row = _decode(line)
                except msgspec.DecodeError:
                    log.warning("%s: an unreadable line skipped", path.name)
                    continue
                last[row.request_id] = row
        return last

    def open(self) -> None:
        """Start appending, to a segment after every one on disk. A folder that cannot be
        written leaves the journal off (logged): the ledger then has the flush's bound."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            on_disk = self.segments()
            self._segment = _number(on_disk[-1]) if on_disk else 0
            self._open_next()
        except OSError as exc:
            log.error("ledger journal off: %s cannot be written (%s)", self.folder, exc)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def append(self, row: UsageRow) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, _encode(row) + b"\n")
        except OSError as exc:
            self.failed_writes += 1
            if self.failed_writes == 1 or self.failed_writes % 1000 == 0:
                log.error("ledger journal write failed (%d so far): %s", self.failed_writes, exc)
            return
        self._dirty = True

    def rotate(self) -> int:
        """Close the open segment if anything went into it and open the next; the number of
        the last closed segment (every row appended before this call is in it or earlier)."""
        if not self._dirty or self._fd is None:
            return self._segment - 1
        try:
            self._open_next()
        except OSError as exc:
            log.error("ledger journal: no new segment (%s); appending to the old one", exc)
            return self._segment - 1
        return self._segment - 1

    def discard_through(self, segment: int) -> None:
        """Delete the segments up to ``segment``: the ledger holds their rows."""
        for path in self.segments():
            if _number(path) > segment:
                break
            try:
                path.unlink()
            except OSError as exc:
                log.warning("ledger journal: %s not deleted (%s)", path.name, exc)

    def discard_all_closed(self) -> None:
        self.discard_through(self._segment - 1)

    def _open_next(self) -> None:
        path = self.folder / f"{PREFIX}{self._segment + 1:08d}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.close()
        self._fd = fd
        self._segment += 1
        self._dirty = False


def _number(path: Path) -> int:
    return int(path.name[len(PREFIX) :])
