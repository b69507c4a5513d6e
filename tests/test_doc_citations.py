"""Every citation of a section of docs/DESIGN.md or logit_store/FORMAT.md names a heading it has
(``docs/DESIGN.md, "Section"``, in code and docs alike), so that a reader who follows one finds it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = {"DESIGN.md": ROOT / "docs/DESIGN.md", "FORMAT.md": ROOT / "logit_store/FORMAT.md"}
CITATION = re.compile(r"(DESIGN\.md|FORMAT\.md)`?,? \"([^\"]+)\"")
SOURCES = ["bytestream", "distill", "logit_store", "students", "bytedistill", "benchmarks", "examples", "docs", "tests"]


def headings(path: Path) -> list[str]:
    return [line.lstrip("#").strip().replace("`", "") for line in path.read_text().splitlines() if line.startswith("#")]


def names(heading: str, cited: str) -> bool:
    """Whether ``heading`` is the section cited (a heading may go on: "Integrity (v2)")."""
    return heading == cited or re.match(re.escape(cited) + r"[\s(:]", heading) is not None


def citations() -> list[tuple[str, str, str]]:
    files = [ROOT / "README.md"] + [p for d in SOURCES for p in (ROOT / d).rglob("*") if p.suffix in {".py", ".md"}]
    found = []
    for path in (f for f in files if f != Path(__file__).resolve()):
        for document, section in CITATION.findall(path.read_text()):
            if section != "Section name":  # how DESIGN.md's own preface spells a citation
                found.append((str(path.relative_to(ROOT)), document, section.replace("`", "")))
    return found


def test_every_cited_section_exists():
    assert len(citations()) > 20  # the pattern finds the project's citations
    titles = {document: headings(path) for document, path in DOCUMENTS.items()}
    missing = [c for c in citations() if not any(names(h, c[2]) for h in titles[c[1]])]
    assert not missing, missing


def test_a_citation_of_a_missing_heading_is_found():
    assert not any(names(h, "where <eot> comes from at inference") for h in headings(DOCUMENTS["DESIGN.md"]))
    assert any(names(h, "Integrity") for h in headings(DOCUMENTS["FORMAT.md"]))  # "Integrity (v2)"
