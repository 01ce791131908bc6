"""Text that came from a job (its name, exit reason, log, a decision quoting it), made safe to show on a
terminal: control and format characters are escaped, so a job cannot move the cursor, clear the screen, set
the window title or reverse the direction of the text around it."""
from __future__ import annotations

import unicodedata
from typing import Optional


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
