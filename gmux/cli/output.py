"""What a command-line tool prints besides its results: its errors (as text, or as JSON under --json) and what it
does when the program reading its output goes away (`gmux ps | head -1`)."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from gmux.util.text import printable


def reader_gone() -> int:
    """The exit status once the reader has closed the pipe: it has what it wanted. Standard output is pointed at
    /dev/null first, or Python's flush of it at exit would fail again with a traceback."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def json_asked(argv: list, parser: argparse.ArgumentParser) -> bool:
    """Whether the command line asks for JSON, read before argparse parses it, so that a command line argparse
    refuses is answered in JSON too. Read as argparse reads it: a --json among the words of a submitted command
    (`gmux submit python x.py --json`, or after `--`) is that command's, not gmux's."""
    words = iter(argv)
    for word in words:
        if word == "--json":
            return True
        if word == "--":
            return False
        if word.startswith("-"):
            action = parser._option_string_actions.get(word)
            if action is not None and action.nargs != 0:
                next(words, None)       # (its value, which may start with a dash)
            continue
        command = next((a.choices[word] for a in parser._actions
                        if isinstance(a, argparse._SubParsersAction) and word in a.choices), None)
        if command is not None:
            parser = command
        elif any(a.nargs == argparse.REMAINDER for a in parser._actions):
            return False        # the submitted command starts here
    return False


def failed(message: str, as_json: bool, status: int = 1, **more) -> int:
    """An error, said once: under --json one JSON object on standard output, where a program reading the
    command's output looks (a text line there would not parse), else a line on standard error."""
    if as_json:
        print(json.dumps({"error": message, "status": status, **more}), flush=True)
    else:
        print(f"gmux: {printable(message)}", file=sys.stderr)
    return status


class UsageError(Exception):
    """A command line argparse refused, with the parser of the command it is about."""

    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser = parser

    def report(self, as_json: bool) -> int:
        """Says it as argparse does (the command's usage, then the error; status 2), or as JSON."""
        if not as_json:
            argparse.ArgumentParser.error(self.parser, str(self))
        return failed(f"{self.parser.prog}: {self}", True, 2, usage=self.parser.format_usage().strip())


NEGATIVE_NUMBER = re.compile(r"^-(\.?\d|inf(inity)?$|nan$)", re.IGNORECASE)


class Parser(argparse.ArgumentParser):
    """Its errors are raised as UsageError for the caller to say (as text or JSON). An option that a command does
    not take is refused by that command, with its usage: argparse passes it up to the program's parser, whose
    usage lists the commands but not the command's options."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A word that starts like a negative number is a value, as Python 3.13's argparse reads it: `--mem -1GiB`
        # was refused as "expected one argument" instead of by --mem's own check; so are -inf and -nan, which
        # float() reads (`--weight -inf`).
        self._negative_number_matcher = NEGATIVE_NUMBER

    def parse_known_args(self, args=None, namespace=None):
        namespace, extra = super().parse_known_args(args, namespace)
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return namespace, extra

    def error(self, message: str):
        raise UsageError(self, message)
