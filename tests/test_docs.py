"""The manual's links: every relative link and image of README.md and docs/*.md resolves to a file (an anchor to a
heading of it), every docs page is linked from the README, and the README stays a short front door. No network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
MAX_README_LINES = 250
# The README's quick start, exactly: .ci/run and newcomers run these lines as they stand.
QUICK_START = (
    "python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 -e '.[dev]' && .venv/bin/phasebench run",
    ".venv/bin/python -m pytest",
)

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*\"([^\"]+)\"", re.I)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto: ... never fetched
# A repository path in a code span starts at a top-level folder, or at a folder of bench/ (the README's case path
# names them from there); one with a placeholder (<op>, DIR, *, ...) is an example, not a path.
TOP_FOLDERS = ("kernels", "bench", "profiles", "analysis", "tests", "docs", "notes", ".ci")
PLACEHOLDER = re.compile(r"[<>*{}\[\]$]|\.\.\.|(?:^|/)[A-Z][A-Z_-]*(?:/|$)")


def without_code(text: str) -> str:
    """The text with fenced blocks and code spans taken out: what they hold is not a link or a heading."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: link and tag markup dropped, lower case, punctuation other than
    hyphens and underscores dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in `page`, a repeated one numbered as GitHub numbers it (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    """The targets of every markdown link and image and every HTML href/src in `page`, outside code."""
    text = without_code(page.read_text(encoding="utf-8"))
    return LINK.findall(text) + HTML_LINK.findall(text)


def missing_paths(page: Path, root: Path = REPO) -> list[str]:
    """The repository paths named in code spans of `page` (outside fenced blocks) that name no file or folder."""
    spans = CODE_SPAN.findall(FENCE.sub("", page.read_text(encoding="utf-8")))
    missing = []
    for token in {token.rstrip(".,:;") for span in spans for token in span.strip("`").split()}:
        first = token.partition("/")[0]
        if "/" not in token or PLACEHOLDER.search(token):
            continue
        if first in TOP_FOLDERS:
            path = root / token
        elif first.isidentifier() and (root / "bench" / first).is_dir():
            path = root / "bench" / token
        else:
            continue
        if not path.exists():
            missing.append(f"{page.name}: {token}")
    return sorted(missing)


def broken(page: Path, root: Path = REPO) -> list[str]:
    """The relative links of `page` that name no file under `root`, or an anchor that no heading of it makes."""
    wrong = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page.resolve()
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            wrong.append(f"{page.name}: {target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            wrong.append(f"{page.name}: {target} (no heading makes #{anchor})")
    return wrong


def test_the_manual_has_its_pages():
    names = {page.stem for page in DOCS}
    assert {"measuring", "kernels", "phases", "interference", "paged-kv", "comparing", "profiling", "gpu-sessions",
            "hopper-builds", "design"} <= names, names


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_relative_link_and_image_resolves(page):
    assert links(page), f"{page.name} links nowhere"
    assert broken(page) == []


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda page: page.relative_to(REPO).as_posix())
def test_every_repository_path_in_code_exists(page):
    assert missing_paths(page) == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in links(README)
              if not EXTERNAL.match(target)}
    assert [page.name for page in DOCS if page.resolve() not in linked] == []


def test_the_readme_is_a_short_front_door_with_the_quick_start():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    lines = {line.strip() for line in text.splitlines()}
    assert all(command in lines for command in QUICK_START), QUICK_START
    assert "![" in without_code(text)  # a figure of the report on the first pages


def test_the_check_finds_a_missing_file_a_missing_anchor_and_ignores_code(tmp_path):
    (tmp_path / "docs").mkdir()
    other = tmp_path / "docs" / "other.md"
    other.write_text("# Other page\n\n## The `run` verb: options\n\n## Twice\n\n## Twice\n\n"
                     "```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](docs/other.md) [ok](docs/other.md#the-run-verb-options) [ok](docs/other.md#twice-1) [ok](#a-b-_c)\n"
        "![img](docs/other.md) <img src=\"docs/gone.png\"> [link](https://example.invalid/x.md#nowhere)\n"
        "[gone](docs/missing.md) [bad anchor](docs/other.md#not-a-heading) [outside](../elsewhere.md)\n"
        "`[in code](docs/nothing.md)`\n\n## A (b) _c\n\n```md\n[in a fence](docs/nothing.md)\n```\n")
    assert sorted(broken(page, root=tmp_path)) == [
        "page.md: ../elsewhere.md (no such file)",
        "page.md: docs/gone.png (no such file)",
        "page.md: docs/missing.md (no such file)",
        "page.md: docs/other.md#not-a-heading (no heading makes #not-a-heading)",
    ]


def test_the_path_check_finds_a_missing_path_and_skips_examples(tmp_path):
    (tmp_path / "bench" / "spec").mkdir(parents=True)
    (tmp_path / "bench" / "spec" / "roof.py").write_text("")
    page = tmp_path / "page.md"
    page.write_text(
        "`bench/spec/roof.py`, `spec/roof.py` and `python bench/spec/roof.py [rounds]` exist; `bench/spec/gone.py`,\n"
        "`spec/gone.py`.\n"
        "Examples: `bench/ops/<op>/cases.py`, `analysis/DIR/x.csv`, `tests/*.py`, `results/run.json`, `a/b`.\n"
        "```\n`bench/in_a_fence.py`\n```\n")
    assert missing_paths(page, root=tmp_path) == ["page.md: bench/spec/gone.py", "page.md: spec/gone.py"]
