"""The docs point at what exists: every module of trl_collm/ is on the map (docs/architecture.md's rooms), every
relative link resolves (file and heading), and every repository path a doc names in backticks is in the tree.

Why: the package move of issue 31 (MIGRATION.md) renamed modules and test files; a doc that still names the old
path sends a newcomer to nothing. These checks read text only (no import of torch), so they run in a second.
MIGRATION.md and docs/history.md name the old paths on purpose and are left out of the path check.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "trl_collm"
DOC_GLOBS = ["*.md", "docs/**/*.md", "benchmarks/**/README*.md", "examples/**/README*.md"]
OLD_PATHS_ON_PURPOSE = {"MIGRATION.md", "docs/history.md"}
NOT_OURS = {"examples/scripts/ppo/ppo.py"}  # TRL's own PPO example, named as the model examples/ppo.py follows
# A backticked repository path: starts at a top-level folder of the tree; placeholders (<x>, {x}, *, $X) are skipped.
REPO_PATH = re.compile(r"`((?:trl_collm|tests|benchmarks|tools|examples|docs|\.ci)/[\w./\-]*)`")


def doc_files() -> list[Path]:
    return sorted({p for g in DOC_GLOBS for p in ROOT.glob(g) if ".venv" not in p.parts})


def rooms_section() -> str:
    page = (ROOT / "docs" / "architecture.md").read_text()
    return page.split("\n## Rooms\n")[1].split("\n## ")[0]


def unmapped_modules(modules: list[str], rooms: str) -> list[str]:
    """The modules (paths relative to trl_collm/) the rooms text does not name.

    A module is named by its path (`team/agents.py`), or by its file name on a table row (a line) that also names
    its folder (`building/` ... `oracle.py`); a top-level module by its file name (`chat.py`).
    """
    missing = []
    for rel in modules:
        parent, _, name = rel.rpartition("/")
        if f"`{rel}`" in rooms:
            continue
        rows = [line for line in rooms.splitlines() if f"`{name}`" in line]
        if any(not parent or f"{parent.rpartition('/')[2]}/" in row for row in rows):
            continue
        missing.append(rel)
    return missing


def package_modules() -> list[str]:
    return sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts
    )


def test_every_module_is_on_the_architecture_map():
    assert unmapped_modules(package_modules(), rooms_section()) == []


def test_the_map_check_finds_an_unmapped_module():
    """The rule above can fail: a module named nowhere, or only on a row of another folder, is reported."""
    rooms = "| `team/agents.py` | ... |\n| `tasks/` | `building/` (`oracle.py`) |\n| `chat.py` | ... |"
    modules = ["team/agents.py", "tasks/building/oracle.py", "chat.py", "team/ghost.py", "sandbox/oracle.py"]
    assert unmapped_modules(modules, rooms) == ["team/ghost.py", "sandbox/oracle.py"]


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a `# comment` in a code block is no heading
    return {github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    text = path.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            broken.append(f"{target} (no such heading)")
    return broken


def test_every_relative_link_resolves():
    found = {str(p.relative_to(ROOT)): broken_links(p) for p in doc_files()}
    assert {doc: links for doc, links in found.items() if links} == {}


def test_the_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "b.md").write_text("# Adding a backend (`register_backend`)\n```\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#adding-a-backend-register_backend) [gone](c.md) [bad](b.md#not-a-heading) [web](https://x.y/z)"
    )
    assert broken_links(page) == ["c.md (no such file)", "b.md#not-a-heading (no such heading)"]


def missing_paths(text: str) -> list[str]:
    missing = []
    for path in REPO_PATH.findall(text):
        path = path.rstrip(".")
        made_by_a_script = any(part.startswith(".") for part in path.split("/")[1:])  # e.g. vs_comlrl/.venv-comlrl
        if path not in NOT_OURS and not made_by_a_script and not (ROOT / path).exists():
            missing.append(path)
    return missing


def test_every_repository_path_in_the_docs_exists():
    found = {
        str(p.relative_to(ROOT)): missing_paths(p.read_text())
        for p in doc_files()
        if str(p.relative_to(ROOT)) not in OLD_PATHS_ON_PURPOSE
    }
    assert {doc: paths for doc, paths in found.items() if paths} == {}


def test_the_path_check_finds_a_moved_file():
    text = "`trl_collm/team/agents.py`, `tests/test_house.py`, `docs/data/vs_comlrl_<date>.json`, `tools/`, `tools/.x`"
    assert missing_paths(text) == ["tests/test_house.py"]


def test_the_example_configs_page_lists_every_folder_and_counts_the_files():
    """examples/configs/README.md's task table has one row per folder, and its file count is the tree's."""
    configs = ROOT / "examples" / "configs"
    page = (configs / "README.md").read_text()
    folders = sorted(p.name for p in configs.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    rows = sorted(re.findall(r"^\| `([\w-]+)` \| \d+ \|", page, re.M))
    assert rows == folders
    count = len(list(configs.glob("*/*.yaml")))
    assert f"All {count} files" in page, f"examples/configs/README.md should say 'All {count} files'"


BENCHMARK_KINDS = ["compare", "gpu", "research", "speed"]


def test_the_benchmarks_page_names_every_kind_and_script():
    """CONTRIBUTING.md sends readers to benchmarks/README.md for every benchmark: benchmarks/ holds one folder per kind
    and no loose script, the page gives each folder a line, and each file in a folder is named on it."""
    bench = ROOT / "benchmarks"
    page = (bench / "README.md").read_text()
    kinds = sorted(p.name for p in bench.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert kinds == BENCHMARK_KINDS
    assert [p.name for p in bench.iterdir() if p.suffix in (".py", ".sh", ".txt")] == []
    assert [kind for kind in kinds if not re.search(rf"^- \[`{kind}/`\]", page, re.M)] == []
    files = sorted(p.name for p in bench.glob("*/*") if p.suffix in (".py", ".sh", ".txt"))
    assert len(files) > 20  # the glob reaches into the kind folders
    assert [name for name in files if name not in page] == []


def missing_tests(text: str) -> list[str]:
    """`tests/test_x.py::test_y` references whose file or test function is not there."""
    missing = []
    for file, name in re.findall(r"(tests/test_\w+\.py)::(\w+)", text):
        path = ROOT / file
        if not path.exists() or not re.search(rf"^\s*(async )?def {name}\b", path.read_text(), re.M):
            missing.append(f"{file}::{name}")
    return missing


def test_every_named_test_exists():
    found = {str(p.relative_to(ROOT)): missing_tests(p.read_text()) for p in doc_files()}
    assert {doc: tests for doc, tests in found.items() if tests} == {}


def test_the_test_check_finds_a_renamed_test():
    text = "`tests/test_docs_map.py::test_every_named_test_exists`, "
    text += "`tests/test_docs_map.py::test_gone`, `tests/test_x.py::t`"
    assert missing_tests(text) == ["tests/test_docs_map.py::test_gone", "tests/test_x.py::t"]


def test_the_index_links_every_page():
    """docs/index.md is the way in: every page of docs/ is linked from it."""
    docs = ROOT / "docs"
    index = (docs / "index.md").read_text()
    linked = {(docs / t.partition("#")[0]).resolve() for t in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", index)}
    pages = [p for p in docs.rglob("*.md") if p.name != "index.md"]
    assert sorted(str(p.relative_to(docs)) for p in pages if p.resolve() not in linked) == []
