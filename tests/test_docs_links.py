"""README.md and the pages under docs/ link only to what exists: every relative link names
a file of the repository, and every #anchor a heading of the page it points into (as
GitHub renders headings into anchors); and README leads to every page under docs/."""

import re
from pathlib import Path

from conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """The page without its fenced code blocks and indented command lines."""
    text = FENCE.sub("", text)
    return "\n".join(line for line in text.splitlines() if not line.startswith("    "))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, without punctuation, spaces as
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: — not this repository's
            continue
        path, _, anchor = target.partition("#")
        into = (page.parent / path).resolve() if path else page
        if path and (not into.exists() or ROOT.resolve() not in into.parents):
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and into.suffix == ".md" and anchor not in anchors(into):
            broken.append(f"{page.name}: {target} (no such heading in {into.name})")
    return broken


def test_every_relative_link_and_anchor_in_readme_and_docs_resolves():
    assert [b for page in PAGES for b in broken_links(page)] == []


def test_a_link_to_a_missing_heading_or_file_is_reported(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Real heading: `with` code\n\n[ok](#real-heading-with-code) "
                    "[gone](#no-such-heading) [file](missing.md)\n\n```\n[not](#a-link)\n```\n")
    assert broken_links(page) == ["page.md: #no-such-heading (no such heading in page.md)",
                                  "page.md: missing.md (no such file)"]


def test_readme_leads_to_every_page_under_docs():
    linked = {(ROOT / t.partition("#")[0]).resolve()
              for t in LINK.findall(prose((ROOT / "README.md").read_text()))}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md")}
    assert sorted(p.name for p in pages - linked) == []
