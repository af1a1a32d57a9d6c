"""The command's output as a person reads it: plain lines, no markup, highlighting or
wrapping, so that every line is grep-able; results go to stdout, the rest to stderr. Text
from a spec or a run directory (someone else's) reaches the terminal escaped: it can
neither rewrite the screen nor forge a line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.console import Console

# C0 (newlines and tabs among them), DEL, C1 (a lone 0x9b is a terminal's CSI), and the
# bidirectional marks, overrides and isolates, which reorder what a line appears to say.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def printable(text: str) -> str:
    """`text` on one line with every control character escaped as JSON escapes it (\\n,
    \\u001b): readable, and a JSON document stays one, meaning the same."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group()) or f"\\u{ord(m.group()):04x}", text)


def say(console: Console, text: str) -> None:
    """Plain text: no markup, no highlighting, no wrapping (lines are grep-able); its
    own line breaks kept, every other control character escaped (see printable)."""
    console.print("\n".join(printable(line) for line in text.split("\n")),
                  highlight=False, markup=False, soft_wrap=True)


def say_line(console: Console, text: str) -> None:
    """say, for a line that holds text from a spec or a run directory: on one line, a
    newline in it escaped too (it would forge a line of its own)."""
    say(console, printable(text))


@dataclass(frozen=True)
class Output:
    """The command's output, passed as one: results (a summary, a best) on stdout, where a
    script may read them; progress, notes and errors on stderr."""

    out: Console
    err: Console

    @classmethod
    def standard(cls, quiet: bool = False) -> Output:
        return cls(Console(quiet=quiet), Console(stderr=True, quiet=quiet))

    @classmethod
    def silent(cls) -> Output:
        return cls.standard(quiet=True)

    def result(self, text: str) -> None:
        say(self.out, text)

    def note(self, text: str) -> None:
        say(self.err, text)
