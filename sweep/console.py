"""The command's output as a person reads it: plain lines, no markup, highlighting or
wrapping, so that every line is grep-able; results go to stdout, the rest to stderr."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console


def say(console: Console, text: str) -> None:
    """Plain text: no markup, no highlighting, no wrapping (lines are grep-able)."""
    console.print(text, highlight=False, markup=False, soft_wrap=True)


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
