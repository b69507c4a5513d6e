"""The README says what is true of the project: its install section lists every extra
pyproject.toml defines, and every ``generate`` call of its Python snippets bounds the answer
(without ``max_new_tokens``, transformers warns and falls back to a short default)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)


def test_the_install_section_lists_every_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    listed = re.search(r"^Extras: (.*?)\n\n", README, flags=re.DOTALL | re.MULTILINE).group(1)
    assert [name for name in extras if f"`{name}`" not in listed] == []


def test_every_generate_call_of_the_snippets_says_how_long_its_answer_may_be():
    calls = [line for snippet in python_snippets() for line in snippet.splitlines() if "model.generate(" in line]
    assert len(calls) >= 4 and [call for call in calls if "max_new_tokens=" not in call] == []
