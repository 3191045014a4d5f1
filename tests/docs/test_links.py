"""The docs' relative links resolve, and no doc carries the build machine's paths.

Why: the README and the guides under docs/ point at each other, at the raw benchmark
logs under docs/bench/ and at source files; a file moved or a heading renamed leaves a
link that leads nowhere, which nobody notices until a reader follows it. And a quoted
log that keeps an absolute path of the machine it ran on (a checkout under /work, a
pytest temp dir) says nothing to a reader and, through a distribution's `readme`, ends
up in installed package metadata.

The checker is a small Markdown reader of its own (fenced code and inline code are
not links; headings become GitHub's anchors), tested below against planted bad links
so that it can be seen to fail.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Generated or installed trees: not the project's docs.
SKIP_DIRS = {
    ".git", ".venv", "build", "channel", "channel-upstream", "envs", "modulefiles",
    "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache", ".cache", ".whl",
    ".gl", "dist", "bench-results",
}

# Paths of the machine a doc was written on: meaningless to a reader.
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|root|tmp)/|/opt/pypi\b")

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text], one level of [brackets] inside
    r"\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"  # (target, balanced parens)
    r"(?:\s+\"[^\"]*\"|\s+'[^']*')?\s*\)")  # an optional "title"
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files(root: Path = ROOT) -> list[Path]:
    """Every *.md of the tree, leaving out generated and installed trees."""
    found = []
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root).parts
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel[:-1]):
            continue
        found.append(path)
    return found


def outside_fences(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out = []
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
            else:
                out.append((number, line))
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and not line.strip().strip(fence[0]):
            fence = None
    return out


def prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code, inline code blanked out (it holds no links)."""
    return [(n, INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line))
            for n, line in outside_fences(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation but `-` and `_`
    dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("**", "").lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            kept.append("-" if ch == " " else ch)
    return "".join(kept)


def anchors(path: Path) -> set[str]:
    """The anchors a Markdown file defines: its headings' slugs (repeats numbered as
    GitHub numbers them) and explicit <a name=...> / id= anchors."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in outside_fences(path.read_text(encoding="utf-8")):
        result.update(HTML_ANCHOR.findall(line))
        h = HEADING.match(line)
        if not h:
            continue
        base = slug(h.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every inline link, image and reference definition."""
    found = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for m in INLINE_LINK.finditer(line):
            found.append((number, m.group(1).strip("<>")))
        m = REF_DEF.match(line)
        if m:
            found.append((number, m.group(1).strip("<>")))
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the relative links of one file, one line each."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for number, target in links(path):
        if not target or SCHEME.match(target) or target.startswith("//"):
            continue
        file_part, _, fragment = target.partition("#")
        dest = path if not file_part else (path.parent / unquote(file_part)).resolve()
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file or directory")
            continue
        try:
            dest.relative_to(root)
        except ValueError:
            problems.append(f"{where}: leads outside the repository")
            continue
        if fragment and dest.suffix == ".md":
            if dest not in cache:
                cache[dest] = anchors(dest)
            if unquote(fragment) not in cache[dest]:
                problems.append(f"{where}: no heading with the anchor #{fragment}")
    return problems


def machine_paths(path: Path, root: Path = ROOT) -> list[str]:
    """Lines of a doc that name a path of the build machine (code blocks included:
    a quoted log is read too)."""
    out = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if MACHINE_PATH.search(line):
            out.append(f"{path.relative_to(root)}:{number}: {line.strip()[:120]}")
    return out


def test_the_repository_has_docs() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in markdown_files()}
    assert "README.md" in names and "docs/benchmarks.md" in names, sorted(names)


def test_every_relative_link_resolves() -> None:
    problems = [p for md in markdown_files() for p in broken_links(md)]
    assert not problems, "broken links (fix the link or the heading):\n" + "\n".join(problems)


def test_no_doc_names_a_machine_path() -> None:
    problems = [p for md in markdown_files() for p in machine_paths(md)]
    assert not problems, (
        "docs name paths of the machine they were written on; write a path relative to "
        "the checkout or a placeholder instead:\n" + "\n".join(problems))


def test_the_readme_stays_a_guide() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move detail into a guide under docs/"


def test_a_package_readme_exists() -> None:
    """Each distribution's pyproject `readme` is its package metadata: it must exist."""
    for pyproject in ROOT.glob("**/pyproject.toml"):
        if any(part in SKIP_DIRS for part in pyproject.relative_to(ROOT).parts):
            continue
        m = re.search(r'^readme\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
        if m:
            assert (pyproject.parent / m.group(1)).is_file(), f"{pyproject}: {m.group(1)}"


# The checker itself, on planted docs: it must fail where a reader would.

@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text(
        "# A guide\n\n## Set-up: `make channel` (first)\n\ntext\n\n"
        "## Set-up: `make channel` (first)\n")
    (tmp_path / "src.py").write_text("")
    return tmp_path


def write(root: Path, text: str) -> Path:
    path = root / "README.md"
    path.write_text(text)
    return path


def test_good_links_pass(tree: Path) -> None:
    md = write(tree, "[g](docs/guide.md) [a](docs/guide.md#set-up-make-channel-first) "
                     "[b](docs/guide.md#set-up-make-channel-first-1) [s](src.py) [d](docs/) "
                     "[web](https://example.org/x) [self](#top)\n\n# Top\n"
                     "```\n[not a link](nowhere.md)\n```\n`[code](nowhere.md)`\n"
                     "![img](docs/guide.md \"title\")\n[ref]: src.py\n")
    assert broken_links(md, tree) == []


@pytest.mark.parametrize("bad", [
    "[x](docs/missing.md)",
    "[x](docs/guide.md#no-such-heading)",
    "[x](#nowhere)",
    "![x](img/plot.png)",
    "[x](../outside.md)",
    "[ref]: docs/gone.txt",
])
def test_a_planted_bad_link_fails(tree: Path, bad: str) -> None:
    (tree.parent / "outside.md").write_text("# x\n")
    md = write(tree, f"# Top\n\n{bad}\n")
    problems = broken_links(md, tree)
    assert len(problems) == 1 and "README.md:3:" in problems[0], problems


@pytest.mark.parametrize("line", [
    "log: /work/main/envs/powerai: 46281 files",
    "cache in /tmp/pytest-of-root/pytest-3/x",
    "`/root/.cache/ddl-ce`",
    "wheels from /opt/pypi",
])
def test_a_planted_machine_path_fails(tree: Path, line: str) -> None:
    md = write(tree, f"# Top\n\n{line}\n")
    assert machine_paths(md, tree) == [f"README.md:3: {line}"]


def test_paths_that_are_not_the_machines_pass(tree: Path) -> None:
    md = write(tree, "~/envs/mine, $PREFIX/lib, envs/powerai, /sw/envs/powerai, "
                     "/run/ddl-cluster/NAME, site-packages/ddl_core/work/x\n")
    assert machine_paths(md, tree) == []
