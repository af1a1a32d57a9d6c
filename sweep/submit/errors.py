"""What goes wrong, in one line: every piece refuses bad input with the same error, which
the command turns into exit 2 before anything is submitted."""

from __future__ import annotations


class SubmitError(Exception):
    """Bad input found before anything was submitted: one line, exit 2."""


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else type(e).__name__)[:300]

