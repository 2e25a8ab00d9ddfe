"""Packaging: what the source imports is installed by a plain `pip install .`, but for the few
modules an extra brings (README: `duetime[report]`, `duetime[itch]`, `duetime[otlp]`).

Checked statically: every import statement under `src/duetime` (in functions too) is mapped to the
distributions that provide it, and one of them must be a core dependency in pyproject.toml.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "src" / "duetime"

EXTRA_ONLY = {"matplotlib": "report", "numba": "itch"}
"""Top-level modules an extra installs; the code that imports them says which extra is missing."""
EXTRA_FOLDERS = {"feeds": "itch"}
"""Folders of the source that only an extra's command runs (the server never imports them)."""


def _name(requirement: str) -> str:
    name = re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict[str, object]:
    project: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def _core() -> set[str]:
    dependencies = _project()["dependencies"]
    assert isinstance(dependencies, list)
    return {_name(r) for r in dependencies}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "duetime"}


def _third_party() -> dict[str, set[str]]:
    """Top-level module -> the source files importing it, outside the extras' folders."""
    found: dict[str, set[str]] = {}
    for path in SOURCE.rglob("*.py"):
        relative = path.relative_to(SOURCE)
        if relative.parts[0] in EXTRA_FOLDERS:
            continue
        for name in _imports(path):
            found.setdefault(name, set()).add(str(relative))
    return found


def test_every_module_the_source_imports_is_a_core_dependency_or_an_extras() -> None:
    distributions = importlib.metadata.packages_distributions()
    core = _core()
    missing = {}
    for module, files in sorted(_third_party().items()):
        if module in EXTRA_ONLY:
            continue
        provided_by = {_name(d) for d in distributions.get(module, [module])}
        if not provided_by & core:
            missing[module] = sorted(files)
    assert not missing, f"imported, but not installed by `pip install .`: {missing}"


@pytest.mark.parametrize(("module", "extra"), sorted(EXTRA_ONLY.items()))
def test_the_extras_install_what_they_are_for(module: str, extra: str) -> None:
    extras = _project()["optional-dependencies"]
    assert isinstance(extras, dict)
    distributions = importlib.metadata.packages_distributions()
    assert {_name(d) for d in distributions[module]} & {_name(r) for r in extras[extra]}
