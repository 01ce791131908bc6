"""Reading an input file line by line with no more than a line's limit in memory: a file of one line of gigabytes
(a binary file, a trace cut without its newlines, a line of commas) was read whole by the CSV reader, and a
line of commas made a field per comma, enough to exhaust the machine's memory before any check ran."""
from __future__ import annotations

import codecs
from typing import IO, Iterator

# Characters of one line: a trace's row is tens of them, a header with hundreds of columns a few thousand.
MAX_LINE = 1 << 20


class LineTooLong(ValueError):
    """A line over MAX_LINE characters (or bytes); `line` is its number."""

    def __init__(self, line: int):
        super().__init__(f"line {line} is longer than {MAX_LINE:,} characters: not a line of a CSV file")
        self.line = line


def bounded_lines(f: IO[str]) -> Iterator[str]:
    """The lines of a text file (as iterating it gives them), refused with LineTooLong past MAX_LINE."""
    number = 0
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE:
            raise LineTooLong(number)
        yield line


def first_undecodable(path: str) -> int | None:
    """The line of a file's first byte that is not UTF-8 (the decoder reads ahead by blocks, so its own error
    has only an offset in a block), read in pieces of at most MAX_LINE bytes: a character cut between two pieces
    is joined by the incremental decoder."""
    try:
        with open(path, "rb") as f:
            number, decoder = 1, codecs.getincrementaldecoder("utf-8")()
            while piece := f.readline(MAX_LINE):
                ends = piece.endswith(b"\n")
                try:
                    decoder.decode(piece, final=ends)
                except UnicodeDecodeError:
                    return number
                if ends:
                    number += 1
            decoder.decode(b"", final=True)     # (a character cut off by the file's end)
    except UnicodeDecodeError:
        return number
    except OSError:
        pass
    return None
