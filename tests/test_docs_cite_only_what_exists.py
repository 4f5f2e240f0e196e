"""Code and docs cite only what a user can open: every relative markdown link in README.md and docs/ names a file of
the repository, and every markdown file named in the docs, the package, the scripts and the benchmarks is one of
the repository's (notes kept outside it are not named; nothing points into a folder beside the checkout)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


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


def test_no_code_or_doc_names_a_file_outside_the_repository():
    ours = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    sources = [*DOCS, *(ROOT / "pettingllms").rglob("*"), *(ROOT / "scripts").rglob("*"),
               *(ROOT / "benchmarks").rglob("*")]
    citing = []
    for path in sources:
        if path.is_file() and path.suffix in (".py", ".md", ".sh", ".yaml"):
            text = path.read_text()
            named = {m.rsplit("/", 1)[-1] for m in re.findall(r"[\w./-]*\w\.md\b", text)}
            outside = sorted(named - ours) + climbing_out(path, text)
            citing += [f"{path.relative_to(ROOT)}: {name}" for name in outside]
    assert citing == []


def climbing_out(path: Path, text: str) -> list[str]:
    """Relative paths in ``text`` that leave the repository: ``../<name>`` that is neither a file or folder beside
    ``path``'s folder nor inside the repository from its root (a folder next to the checkout, say)."""
    found = []
    for target in re.findall(r"(?<![\w./)$}])\.\./\w[\w.-]*", text):
        inside = (ROOT / target).resolve().is_relative_to(ROOT)
        if not inside and not (path.parent / target).exists():
            found.append(target)
    return found


def test_a_path_beside_the_checkout_is_caught_and_one_inside_is_not():
    doc = ROOT / "docs" / "environments" / "games.md"
    outside_folder = "../" + "notes_beside_the_checkout"  # built, so this file itself names nothing outside
    assert climbing_out(doc, f"see {outside_folder}/x and ../training.md") == [outside_folder]
    assert climbing_out(ROOT / "scripts" / "train" / "common.sh", 'ROOT="$(dirname "$0")/../.."') == []
