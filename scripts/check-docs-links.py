#!/usr/bin/env python3
"""Checks every internal link of the book (docs/src/**/*.md), README.md and BENCHMARKS.md.

A link or image whose target is a relative path must name a file or folder that exists; a
`#anchor` (alone or after a .md path) must be a heading of that page, slugged as mdBook and
GitHub slug them. Links inside the book must also stay inside docs/src, since mdBook serves
nothing else. Links with a scheme (https:, mailto:) are not checked. Lists every broken link
as FILE:LINE: TARGET: WHY and exits 1 if there is one.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "docs" / "src"

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def slug(text):
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    out = []
    for ch in text.strip().lower():
        if ch.isalnum() or ch in "_-":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def prose_lines(path):
    """The lines of a Markdown file outside fenced code, with inline code blanked."""
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"`[^`]*`", "``", line)


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen = {}
        found = set()
        for _, line in prose_lines(path):
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            found.add(s if k == 0 else f"{s}-{k}")
        _anchors[path] = found
    return _anchors[path]


def check(path):
    errors = []
    in_book = BOOK in path.parents
    for n, line in prose_lines(path):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{n}: {target}"
            if not dest.exists():
                errors.append(f"{where}: no such file")
                continue
            if in_book and BOOK not in dest.parents and dest != BOOK:
                errors.append(f"{where}: outside docs/src, so the built book does not have it")
                continue
            if anchor:
                if dest.suffix != ".md" or dest.is_dir():
                    errors.append(f"{where}: an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    errors.append(f"{where}: no heading with this anchor in {dest.relative_to(ROOT)}")
    return errors


def main():
    pages = sorted(BOOK.rglob("*.md")) + [ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    errors = [e for p in pages for e in check(p)]
    for e in errors:
        print(e, file=sys.stderr)
    print(f"check-docs-links: {len(pages)} pages, {len(errors)} broken links", file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
