"""Text that came from a job (its name, exit reason, log, a decision quoting it), made safe to show on a
terminal: control and format characters are escaped, so a job cannot move the cursor, clear the screen, set
the window title or reverse the direction of the text around it."""
from __future__ import annotations

import logging
import unicodedata
from typing import Optional


def digits(text: str) -> bool:
    """Whether `text` is a number int() reads: str.isdigit alone passes '²', which int() refuses (a port written
    so killed gmux-scheduler)."""
    return text.isascii() and text.isdigit()


def _escape(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text, keep: str = "", limit: Optional[int] = None) -> str:
    """`text` with every control or format character (Unicode Cc, Cf; ESC, BEL, CR, the bidi overrides...)
    written as an escape, except those in `keep` (a log keeps its newlines and tabs)."""
    text = "" if text is None else str(text)
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    if text.isprintable() and not keep:
        return text
    return "".join(c if c in keep or (c.isprintable() and unicodedata.category(c) != "Cf") else _escape(c)
                   for c in text)


def tail_bytes(path: str, max_bytes: int, lines: int = 0) -> bytes:
    """The end of a log file as written: at most `max_bytes` of it (read from the end, so a log of gigabytes
    costs no more than its tail), and of that the last `lines` lines if asked. Missing: b''."""
    return file_end(path, max_bytes, lines)[0]


def file_end(path: str, max_bytes: int, lines: int = 0) -> tuple[bytes, int]:
    """`tail_bytes`, and how many bytes of the file came before them (0: none were left out for want of room;
    the lines before the last `lines` are not counted, they were not asked for). Where the file is longer than
    `max_bytes`, what is returned starts at a line's start (the cut line is counted as left out), unless the
    last `max_bytes` hold no line end at all."""
    try:
        with open(path, "rb") as f:
            before = max(0, f.seek(0, 2) - max_bytes)
            f.seek(before)
            data = f.read(max_bytes)
    except FileNotFoundError:
        return b"", 0
    if before:
        start = data.find(b"\n") + 1
        if 0 < start < len(data):
            data, before = data[start:], before + start
    return (b"".join(data.splitlines(keepends=True)[-lines:]) if lines else data), before


def tail(path: str, max_bytes: int, lines: int = 0) -> str:
    """`tail_bytes` as text (`text_of`)."""
    return text_of(tail_bytes(path, max_bytes, lines))


def text_of(data: bytes) -> str:
    """The end of a log as text, cut on a character boundary: a byte that is not UTF-8 reads as U+FFFD."""
    skip = 0
    while skip < min(3, len(data)) and data[skip] & 0xC0 == 0x80:   # a character cut in two by max_bytes
        skip += 1
    return data[skip:].decode(errors="replace")


class _PrintableMessages(logging.Formatter):
    """Each log line's message through `printable`, newlines included, so a job's name or exit reason quoted in a
    daemon's log neither drives the terminal showing it nor forges a line of its own; a traceback, appended
    after the message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))


def log_to_stderr(prog: str, verbose: bool = False) -> None:
    """A long-running program's log on stderr: time, program, level, message (escaped as above)."""
    handler = logging.StreamHandler()
    handler.setFormatter(_PrintableMessages(f"%(asctime)s {prog} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
