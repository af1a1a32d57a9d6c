"""The command's output as a person reads it: plain lines, no markup, highlighting or
wrapping, so that every line is grep-able; results go to stdout, the rest to stderr. Text
from a spec or a run directory (someone else's) reaches the terminal escaped: it can
neither rewrite the screen nor forge a line."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console

# One escaping rule for every line a person reads (storage's own messages use it too).
from storage.readback import escaped as printable


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
