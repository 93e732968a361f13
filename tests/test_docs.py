"""The README stays short and true, and every document a file cites exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["design.md", "strategies.md", "operations.md", "benchmarks.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CITED = re.compile(r"(?<![\w/.-])((?:docs/|reports/)?[\w.-]+\.md)\b")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *(ROOT / "docs" / name for name in DOCS)]


def test_the_readme_is_short_and_has_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make run" in readme and "make test" in readme


def test_the_documents_exist():
    for name in DOCS:
        assert (ROOT / "docs" / name).is_file(), name


def test_every_relative_link_resolves():
    broken = []
    for path in markdown_files():
        for target in LINK.findall(path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert broken == []


def test_every_document_the_code_cites_exists():
    sources = [
        *ROOT.glob("redpack/**/*.py"),
        *ROOT.glob("strategies/**/*.py"),
        *ROOT.glob("locustfiles/*.py"),
        *ROOT.glob("scripts/*.py"),
        ROOT / "Makefile",
    ]
    missing = []
    for source in sources:
        for cited in CITED.findall(source.read_text()):
            # A bare name is one of the documents, or a report `make compare` writes.
            places = [cited] if "/" in cited else [cited, f"docs/{cited}", f"reports/{cited}"]
            if not any((ROOT / place).exists() for place in places):
                missing.append(f"{source.relative_to(ROOT)} cites {cited}")
    assert missing == []
