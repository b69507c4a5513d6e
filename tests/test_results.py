"""docs/RESULTS.md and the README agree: a figure the README quotes is a link to the section of
RESULTS.md it comes from, ``[2.7704](docs/RESULTS.md#loading-paths)``, and that section holds the
figure as written; every section a benchmark writes (``--markdown``) is marked in RESULTS.md."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from benchmarks.results import provenance, write_section

ROOT = Path(__file__).resolve().parents[1]
QUOTE = re.compile(r"\[([^\]]+)\]\(docs/RESULTS\.md#([\w-]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(results: str) -> dict[str, str]:
    """Each ``## heading``'s anchor -> its text (to the next ``## ``)."""
    parts = re.split(r"^## (.+)$", results, flags=re.MULTILINE)
    return {slug(heading): text for heading, text in zip(parts[1::2], parts[2::2])}


def misquoted(readme: str, results: str) -> list[str]:
    """The README's quotes whose section is missing or does not hold the figure as written."""
    found = sections(results)
    wrong = []
    for figure, anchor in QUOTE.findall(readme):
        bare = figure.strip("*`")
        if anchor not in found:
            wrong.append(f"{figure}: RESULTS.md has no section #{anchor}")
        elif bare not in found[anchor]:
            wrong.append(f"{figure}: not in RESULTS.md #{anchor}")
    return wrong


def test_every_figure_the_readme_quotes_is_in_its_results_section():
    readme, results = (ROOT / "README.md").read_text(), (ROOT / "docs/RESULTS.md").read_text()
    assert misquoted(readme, results) == []


def test_the_check_sees_a_figure_that_differs():
    results = "# r\n\n## Loading paths\n\n| teacher BPB | 1.0623 |\n"
    assert misquoted("BPB [1.0623](docs/RESULTS.md#loading-paths)", results) == []
    assert misquoted("BPB [**1.0623**](docs/RESULTS.md#loading-paths)", results) == []
    assert misquoted("BPB [1.062](docs/RESULTS.md#loading-paths)", results) == []  # a rounding it holds
    assert misquoted("BPB [1.0624](docs/RESULTS.md#loading-paths)", results) == [
        "1.0624: not in RESULTS.md #loading-paths"
    ]
    assert misquoted("[1.0623](docs/RESULTS.md#prompt-cuts)", results) == [
        "1.0623: RESULTS.md has no section #prompt-cuts"
    ]


def test_every_section_a_benchmark_writes_is_marked_in_results():
    results = (ROOT / "docs/RESULTS.md").read_text()
    written = {
        name
        for path in (ROOT / "benchmarks").glob("*.py")
        for name in re.findall(r'write_section\("(\w+)"', path.read_text())
    }
    assert written >= {"startup", "convert", "train", "train_threads"}
    for name in written:
        assert results.count(f"<!-- results:{name} -->") == 1 and results.count(f"<!-- /results:{name} -->") == 1, name


@pytest.mark.parametrize("existing", [True, False])
def test_a_rerun_replaces_its_section_and_leaves_the_rest(tmp_path, existing):
    path = tmp_path / "RESULTS.md"
    before = "# r\n\n## A\n\ntext a\n\n<!-- results:a -->\nold\n<!-- /results:a -->\n\nafter\n"
    path.write_text(before if existing else "# r\n\nafter\n")
    write_section("a", "| x |\n|---|\n| 1 |", path)
    write_section("a", "| x |\n|---|\n| 2 |", path)
    text = path.read_text()
    assert text.count("<!-- results:a -->") == 1 and "| 2 |" in text and "| 1 |" not in text and "old" not in text
    assert "after" in text and text.startswith("# r")


def test_the_command_a_section_records_pastes_into_a_shell(monkeypatch):
    """An argument with a space (a KJV book: '1 Samuel') is quoted, so the recorded command reruns as it ran."""
    monkeypatch.setattr(sys, "argv", ["benchmarks/budget.py", "--train-books", "Ruth", "1 Samuel"])
    command = re.match(r"`(.*)` at commit", provenance()).group(1)
    assert shlex.split(command)[-3:] == ["--train-books", "Ruth", "1 Samuel"]
