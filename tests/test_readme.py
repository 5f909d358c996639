"""The README is a quick start a newcomer can trust: short, two set-up commands, only `make` targets that exist, links
that resolve; `make help` names every target; the user docs say which machine and date instead of "this box" or
"today". Read from the files; nothing is run."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

README = ROOT / "README.md"
USER_DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)
MAKE_CALL = re.compile(r"(?<![\w.-])make ([a-z][a-z0-9-]*)")


def makefile_targets() -> set[str]:
    """Every rule name of the Makefile (`name:` at a line start, not a variable assignment `name :=`)."""
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([a-z][a-z0-9-]*)\s*:(?!=)", text, re.M)}


def help_text() -> str:
    """What `make help` prints: the echo lines of its recipe."""
    recipe = re.search(r"^help:\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has no help recipe"
    return "\n".join(re.sub(r'^\t@echo "(.*)"$', r"\1", line) for line in recipe.group(1).splitlines())


def section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


def test_readme_is_at_most_150_lines():
    n = len(README.read_text().splitlines())
    assert n <= 150, f"README.md has {n} lines; move the detail to docs/guide.md"


def test_setup_is_exactly_make_demo_and_make_test():
    """The set-up block holds two commands, `make demo` and `make test`, and the text names `make venv`."""
    setup = section(README.read_text(), "Set up")
    blocks = FENCE.findall(setup)
    assert len(blocks) == 1, "the set-up section shows one command block"
    commands = [line.split("#")[0].strip() for line in blocks[0].splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]
    assert "make venv" in setup


def test_every_make_target_the_readme_shows_exists():
    shown = set(MAKE_CALL.findall(README.read_text()))
    assert {"demo", "test", "venv", "serve", "ab", "report", "dashboard"} <= shown
    missing = shown - makefile_targets()
    assert not missing, f"README shows make targets the Makefile lacks: {sorted(missing)}"


def test_the_no_gpu_path_comes_before_the_run_commands():
    """`make serve VARIANT=fixed` and the Locust line are early: before the four commands and what comes out."""
    text = README.read_text()
    serve = text.index("make serve VARIANT=fixed")
    assert ".venv/bin/locust -f loadtest/tts.py --headless --host http://127.0.0.1:8091" in text
    assert serve < text.index("## The four commands") < text.index("## What comes out")


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    text = FENCE.sub("", doc.read_text())  # code blocks hold commands and output, not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        if not (doc.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{doc.name}: links to nothing: {broken}"


def test_make_help_names_every_target():
    shown = help_text()
    named = set(MAKE_CALL.findall(shown)) | {t for line in shown.splitlines()
                                            for t in re.findall(r"(?<=/ )([a-z][a-z0-9-]*)", line)}
    missing = makefile_targets() - named
    assert not missing, f"make help does not list: {sorted(missing)}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_name_the_machine_and_date_not_here_or_today(doc):
    """"This box", "here", "today" mean nothing to a reader on another machine or day: say which and when."""
    text = doc.read_text()
    found = [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
             for m in re.finditer(r"\b(this box|here|today(?:'s)?)\b", line, re.I)]
    assert not found, f"{doc.name}: {found}"
