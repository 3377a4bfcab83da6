"""The repository stands alone: no file points at the team's notes kept beside it, and every relative
link in the docs resolves.

The notes beside the repository are a design file and a folder of reference write-ups one level up;
a pointer to them is a dead link for everyone who has only the repository. Facts taken from them
belong in the docs here (docs/architecture.md and the page of each part), with their public source.
"""

from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_DIRS = {".git", ".venv", "node_modules", "build", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}

# Spelt in pieces so that this file does not match its own patterns.
OUTSIDE_POINTERS = re.compile(
    "|".join(
        (
            r"\b" + "DESIGN" + r"\.md\b",  # the design notes
            r"\b" + "reference" + r"/[\w.-]+\.md\b",  # a reference write-up by path
            r"\.\./" + "shared" + r"\b",  # the folder beside the repository
        )
    )
)
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~)")


def repository_files() -> list[Path]:
    """What git tracks or would track (new files included), or every file outside build folders without git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if p.is_file() and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts[:-1])]
    names = [n for n in listed.decode().split("\0") if n]
    return [ROOT / n for n in names if (ROOT / n).is_file()]


def text_of(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # binary: images, compiled files


def test_no_file_points_outside_the_repository() -> None:
    offenders: list[str] = []
    for path in repository_files():
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_POINTERS.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "files that point outside the repository:\n" + "\n".join(offenders)


def test_the_pattern_catches_what_it_must() -> None:
    design = "DESIGN" + ".md"
    for line in (
        f"see {design}",
        f"(the storage schema, {design}, section 2)",
        "`" + "reference" + "/nvml.md` lists the symbols",
        "see `../" + "shared/" + "reference" + "/thermal.md`",
    ):
        assert OUTSIDE_POINTERS.search(line), line
    for line in ("docs/architecture.md", "the reference tool for RC models", "shared memory", "REFERENCE.md"):
        assert not OUTSIDE_POINTERS.search(line), line


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (where `# comment` is not a heading and `[a](b)` not a link)."""
    out: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces become hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = _slug(m.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


MARKDOWN = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


@pytest.mark.parametrize("page", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_relative_links_resolve(page: Path) -> None:
    broken: list[str] = []
    for line in _prose_lines(page.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                broken.append(f"{target}: no such file")
            elif not linked.is_relative_to(ROOT):
                broken.append(f"{target}: outside the repository")
            elif anchor and linked.suffix == ".md" and anchor not in anchors_of(linked):
                broken.append(f"{target}: no heading with that anchor in {linked.relative_to(ROOT)}")
    assert not broken, f"broken links in {page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_readme_starts_with_the_architecture() -> None:
    assert "](docs/architecture.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
