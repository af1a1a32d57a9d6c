"""What travels to the cluster as the job's working_dir, counted as Ray's packing will read
it: a directory Ray would refuse only after minutes of packing is refused at once."""

from __future__ import annotations

import contextlib
import fnmatch
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sweep.submit.errors import SubmitError

# What the job's working_dir leaves behind (gitignore syntax, on top of .gitignore's):
# version control, environments, run directories and caches are large and useless there.
EXCLUDES = [".git", ".venv", "venv", ".env", "env", "runs", "__pycache__", "*.pyc",
            ".mypy_cache", ".pytest_cache", ".ruff_cache", "*.egg-info", ".ipynb_checkpoints"]


def shipped_path(spec: Path, here: Path) -> str:
    """The spec's path inside the working_dir copy; it must be in what is shipped."""
    absolute = Path(os.path.abspath(spec))
    try:
        rel = absolute.relative_to(here)
    except ValueError:
        raise SubmitError(f"{spec}: not under the current directory {here}, which is what "
                          "travels to the cluster; run sweep submit from a directory that "
                          "holds the spec (and any kernel module of yours)") from None
    skipped = {p for p in EXCLUDES if "*" not in p}
    if any(part in skipped for part in rel.parts[:-1]):
        raise SubmitError(f"{spec}: lies in a directory that is not shipped to the cluster "
                          f"({', '.join(sorted(skipped))}); move it")
    return PurePosixPath(*rel.parts).as_posix()


MAX_SHIPPED_BYTES = 100 << 20  # what Ray's job upload takes (its GCS_STORAGE_MAX_SIZE)


@dataclass(frozen=True)
class _Packed:
    """A file Ray's packing reads: its path as shipped, its bytes, and the symlink it is
    reached through, if any (with that link's target)."""

    path: PurePosixPath
    size: int
    link: tuple[PurePosixPath, str] | None = None


def _excluded(rel: PurePosixPath) -> bool:
    return any(fnmatch.fnmatch(part, p) for part in rel.parts for p in EXCLUDES)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _listed(here: Path) -> list[PurePosixPath] | None:
    """What git would ship of a checkout (tracked, or untracked and not ignored), None
    outside one. A symlink is one entry, its target never looked into."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"],
                                cwd=here, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    return [PurePosixPath(n) for n in listed.stdout.decode(errors="replace").split("\0") if n]


def _packed_files(here: Path) -> Iterator[_Packed]:
    """What the working_dir will carry, near enough, as Ray's packing reads it
    (ray/_private/runtime_env/packaging.py, _dir_travel and _zip_files, Ray 2.60): it
    follows symlinks, so a link to a file ships the file's bytes and a link to a directory
    ships everything under it, wherever either lies. In a git checkout the files git
    would list; elsewhere every file (.gitignore not applied: this errs towards counting
    too much). EXCLUDES too."""
    listed = _listed(here)
    if listed is None:
        yield from _walk(here, here, PurePosixPath(), None, frozenset())
        return
    for rel in listed:
        if _excluded(rel):
            continue
        path = here / rel
        try:
            is_link = path.is_symlink()
            target = os.readlink(path) if is_link else ""
        except OSError:
            continue
        link = (rel, target) if is_link else None
        if path.is_dir():  # a symlink to a directory, or a submodule: Ray descends into it
            # Its ancestors in the checkout, to tell a loop from a second way in.
            above = frozenset(filter(None, (_identity(here.joinpath(*rel.parts[:i]))
                                            for i in range(len(rel.parts)))))
            yield from _walk(here, path, rel, link, above)
        elif path.is_file():  # a dangling link, a FIFO or a device: Ray skips it
            with contextlib.suppress(OSError):
                yield _Packed(rel, path.stat().st_size, link)


def _walk(here: Path, top: Path, rel: PurePosixPath, link: tuple[PurePosixPath, str] | None,
          above: frozenset[tuple[int, int]]) -> Iterator[_Packed]:
    """Every file under top as Ray's packing reaches it, following symlinks. A directory
    reached again below itself (a link to `.` or `..`) has Ray pack a copy of it at each
    turn, until the system stops resolving the links (40 deep): refused."""
    stack = [(top, rel, link, above)]
    while stack:
        directory, rel, link, above = stack.pop()
        me = _identity(directory)
        if me is None:
            continue
        if me in above:
            how = f"a symlink to {link[1]}" if link else "a directory"
            raise SubmitError(f"{here / (link[0] if link else rel)}: {how}, which holds "
                              "it: Ray's packing of the job's working directory would go round "
                              "it, a copy of everything at each turn; remove it or list it "
                              "in .gitignore")
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            inner = rel / entry.name
            if _excluded(inner):
                continue
            try:
                is_link = entry.is_symlink()
                through = (inner, os.readlink(entry.path)) if is_link else link
                if entry.is_dir():  # follows a link, as Ray's Path.is_dir() does
                    stack.append((Path(entry.path), inner, through, above | {me}))
                elif entry.is_file():
                    yield _Packed(inner, entry.stat().st_size, through)
            except OSError:
                continue


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"


def check_size(here: Path) -> None:
    """Ray packs the whole directory before it can refuse it (minutes for gigabytes, deaf
    to Ctrl+C meanwhile): refuse one that is surely too large at once, naming its largest
    file (and the symlink that brings it in, which a listing of the directory hides)."""
    total = 0
    largest: _Packed | None = None
    for packed in _packed_files(here):
        total += packed.size
        if largest is None or packed.size > largest.size:
            largest = packed
        if total > MAX_SHIPPED_BYTES:
            assert largest is not None
            what = f"{largest.path}, {_mib(largest.size)}"
            if largest.link is not None:
                name, target = largest.link
                what += (f", a symlink to {target}, which Ray follows" if name == largest.path
                         else f", under the symlink {name} -> {target}, which Ray follows")
            raise SubmitError(f"{here}: holds more than {MAX_SHIPPED_BYTES >> 20} MiB to ship "
                              "as the job's working directory, more than Ray accepts "
                              f"(the largest: {what}); run sweep submit from a directory "
                              "with just your spec and kernel modules (or list the rest "
                              "in .gitignore)")

