"""argparse for the command lines: a usage mistake is one line on stderr (``error: ...``, exit 2), never
argparse's usage dump, and a value that starts with ``-`` (``--resume -x``: argparse takes it for an option and
says "expected one argument") gets the way to write it."""
from __future__ import annotations

import argparse
import re


def usage_error_line(prog: str, message: str) -> str:
    """argparse's ``message`` as the line the command lines print (without ``error: ``)."""
    flag = re.fullmatch(r"argument (-[^\s/:]+)\S*: expected one argument", message)
    hint = f" (a value that starts with '-': write {flag[1]}=VALUE, or ./-name for a path)" if flag else ""
    return f"{message}{hint} (see {prog} --help)"


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose errors print ``error: <message> (see PROG --help)``, one line, and exit with code 2."""

    def error(self, message: str):
        self.exit(2, f"error: {usage_error_line(self.prog, message)}\n")
