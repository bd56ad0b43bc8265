"""ARCHITECTURE.md is a map that holds: every path it names exists, every `path::Name` in its
"Where things are" table is defined in that file, every citation of it names one of its
headings, and nothing cites a design document the repository does not contain.

A citation is the file name, a comma and a heading (capitalised), ending at `)`, `.`, `;`,
`:` or the end of the line, e.g. "(ARCHITECTURE.md, Subjects, streams and KV)". The README's
Layout section is part of the map too: it lists every subpackage of `libs/switchyard` and
`services`.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

MAP = REPO / "ARCHITECTURE.md"
TABLE_HEADING = "Where things are"
# Where citations can live; generated, installed and data directories are not searched.
SEARCHED = ("libs", "services", "tests", "deploy", "compose", "proto", "evals", ".ci")
ROOT_FILES = ("README.md", "ARCHITECTURE.md", "Makefile", "pyproject.toml")
SKIPPED_DIRS = {"__pycache__", "node_modules", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".conf", ".toml", ".txt", ".sh", ".json", ".cfg"}

# The old form, a numbered section of a design document that is not in the repository.
# Spelled in two pieces so this file does not cite it itself.
OLD_CITATION = re.compile("ARCHITECTURE" + r"\s*§")
# A heading starts with a capital: "ARCHITECTURE.md, checked by ..." is prose, not a citation.
CITATION = re.compile(r"ARCHITECTURE\.md, ([A-Z][^)\].;:\n\"'`]*)")
TICKED = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^(?:libs|services|proto|deploy|compose|tests|evals)/[\w./-]*$")


def _without_code_blocks(text: str) -> Iterator[str]:
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield line


@cache
def headings() -> frozenset[str]:
    return frozenset(
        line.lstrip("#").strip()
        for line in _without_code_blocks(MAP.read_text())
        if line.startswith("#")
    )


def section(text: str, heading: str) -> list[str]:
    """The lines under `## heading`, up to the next heading of the same or a higher level."""
    lines = text.splitlines()
    marker = next(
        (i for i, line in enumerate(lines) if line.lstrip("#").strip() == heading and
         line.startswith("#")), None,
    )  # fmt: skip
    assert marker is not None, f"no heading {heading!r}"
    level = len(lines[marker]) - len(lines[marker].lstrip("#"))
    out: list[str] = []
    for line in lines[marker + 1 :]:
        depth = len(line) - len(line.lstrip("#"))
        if line.startswith("#") and depth <= level:
            break
        out.append(line)
    return out


def table_rows() -> list[tuple[str, list[str]]]:
    """(concept, [path or path::Name, ...]) for every row of the concept table."""
    rows: list[tuple[str, list[str]]] = []
    for line in section(MAP.read_text(), TABLE_HEADING):
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "concept" or set(cells[0]) <= {"-", " "}:
            continue
        assert len(cells) == 2, f"a row has two cells, concept | where: {line}"
        rows.append((cells[0], TICKED.findall(cells[1])))
    return rows


def _defined(node: ast.stmt) -> set[str]:
    """The names a module- or class-level statement defines."""
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else []
    if isinstance(node, ast.AnnAssign):
        targets = [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def defines(path: Path, name: str) -> bool:
    """Whether the module at `path` defines `name` (dotted: `Class.method`) itself."""
    body: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in name.split("."):
        found = next((node for node in body if part in _defined(node)), None)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def searched_files() -> Iterator[Path]:
    for name in ROOT_FILES:
        if (REPO / name).is_file():
            yield REPO / name
    for top in SEARCHED:
        for path in sorted((REPO / top).rglob("*")):
            if SKIPPED_DIRS & set(path.relative_to(REPO).parts) or not path.is_file():
                continue
            if path.suffix in TEXT_SUFFIXES or path.name.startswith(("Dockerfile", "run")):
                yield path


def citations() -> Iterator[tuple[str, int, str, str]]:
    """(file, line, text, cited heading or "" for the old form) of every citation."""
    for path in searched_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        rel = str(path.relative_to(REPO))
        for n, line in enumerate(text.splitlines(), 1):
            if OLD_CITATION.search(line):
                yield rel, n, line.strip(), ""
            for m in CITATION.finditer(line):
                yield rel, n, line.strip(), m.group(1).strip()


# --- the concept table ---------------------------------------------------------------------


def test_the_concept_table_answers_in_one_hop() -> None:
    rows = table_rows()
    assert 30 <= len(rows) <= 60, len(rows)
    assert all(refs for _, refs in rows), [c for c, refs in rows if not refs]
    concepts = [c for c, _ in rows]
    assert len(set(concepts)) == len(concepts), "a concept is listed twice"
    for needed in ("token bucket", "admission", "fair queue", "placement", "partition()",
                   "pull loop", "ownership", "heartbeats", "allowlist", "validator", "walls",
                   "watchdog", "signing", "hash chain", "idempotency", "cancel", "token streams",
                   "tracing", "replay", "llama.cpp", "vLLM", "sim", "prompt layout",
                   "fleet launcher", "metrics catalog", "capacity plan"):  # fmt: skip
        assert any(needed in c for c in concepts), f"no row for {needed!r}"


def test_every_path_and_name_in_the_table_exists() -> None:
    missing: list[str] = []
    for concept, refs in table_rows():
        for ref in refs:
            path_text, _, name = ref.partition("::")
            path = REPO / path_text
            if not path.exists() or (path_text.endswith("/") and not path.is_dir()):
                missing.append(f"{concept}: {path_text} does not exist")
            elif name and (path.suffix != ".py" or not defines(path, name)):
                missing.append(f"{concept}: {path_text} defines no {name}")
    assert missing == []


def test_every_repository_path_the_map_names_exists() -> None:
    named = {
        ref.partition("::")[0]
        for line in _without_code_blocks(MAP.read_text())
        for ref in TICKED.findall(line)
        if REPO_PATH.match(ref.partition("::")[0])
    }
    assert named, "the map names no paths"
    assert sorted(p for p in named if not (REPO / p).exists()) == []


def test_defines_sees_classes_functions_methods_and_constants(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("X = 1\nY: int = 2\nclass C:\n    def m(self): ...\nasync def f(): ...\n")
    assert all(defines(module, n) for n in ("X", "Y", "C", "C.m", "f"))
    assert not any(defines(module, n) for n in ("Z", "C.z", "f.x", "m"))


# --- citations -----------------------------------------------------------------------------


def test_nothing_cites_a_design_document_the_repository_lacks() -> None:
    old = [f"{f}:{n}: {text}" for f, n, text, heading in citations() if not heading]
    assert old == []


def test_every_citation_names_a_heading_of_the_map() -> None:
    found = list(citations())
    assert any(heading for *_, heading in found), "no citations found: is the pattern right?"
    wrong = [
        f"{f}:{n}: {heading!r}" for f, n, _, heading in found if heading and heading not in
        headings()
    ]  # fmt: skip
    assert wrong == [], f"headings are: {sorted(headings())}"


def test_the_citation_pattern_reads_the_forms_we_write() -> None:
    samples = {
        "(ARCHITECTURE.md, Subjects, streams and KV).": "Subjects, streams and KV",
        "# fsync (ARCHITECTURE.md, Security boundaries)": "Security boundaries",
        "see ARCHITECTURE.md, Layers: core first": "Layers",
    }
    assert CITATION.search("the layers of ARCHITECTURE.md, checked by make lint") is None
    for text, heading in samples.items():
        m = CITATION.search(text)
        assert m is not None and m.group(1).strip() == heading
        assert heading in headings()
    assert OLD_CITATION.search("ARCHITECTURE " + "§4") and not OLD_CITATION.search("§4")


# --- the README's layout -------------------------------------------------------------------


def subpackages() -> list[str]:
    """Every package below `libs/switchyard` and `services`, as `services/edge/routes/`."""
    found: list[str] = []
    for root in (REPO / "libs" / "switchyard", REPO / "services"):
        for init in sorted(root.rglob("__init__.py")):
            if init.parent != root and not SKIPPED_DIRS & set(init.parts):
                found.append(f"{init.parent.relative_to(root)}/")
    return found


def test_the_readme_layout_lists_every_subpackage() -> None:
    layout = "\n".join(section((REPO / "README.md").read_text(), "Layout"))
    packages = subpackages()
    assert "edge/" in packages and "scheduling/" in packages and "bench/peers/" in packages
    missing = [p for p in packages if not re.search(rf"(?<![\w/]){re.escape(p)}", layout)]
    assert missing == []
