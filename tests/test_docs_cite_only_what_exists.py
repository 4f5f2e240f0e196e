"""Code and docs cite only what a user can open: every relative markdown link in README.md and docs/ names a file of
the repository, and no file cites the design notes that never were part of it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_IN_THE_REPOSITORY = ("DESIGN.md", "REFERENCE_NOTES")


def test_every_relative_link_in_the_docs_opens_a_file():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):  # an anchor on the same page, or a URL
                continue
            if not (doc.parent / path).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert broken == []


def test_no_code_or_doc_cites_notes_outside_the_repository():
    sources = [*DOCS, *(ROOT / "pettingllms").rglob("*"), *(ROOT / "scripts").rglob("*"),
               *(ROOT / "tests").rglob("*.py")]
    citing = [str(p.relative_to(ROOT)) for p in sources if p.is_file() and p != Path(__file__)
              and p.suffix in (".py", ".md", ".sh", ".yaml") and any(n in p.read_text() for n in NOT_IN_THE_REPOSITORY)]
    assert citing == []
