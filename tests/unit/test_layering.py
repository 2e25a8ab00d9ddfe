"""Layering: the pure modules import no event loop, no transport and no front end.

Checked statically: the import statements of each module are parsed with `ast` and followed
through the duetime package, so the test is fast and needs no fresh interpreter. Imports under
`if TYPE_CHECKING:` are skipped (they never run). Each module reached brings its parent packages
along, as a real import does, except the root `duetime/__init__.py`: it re-exports the public
API (the Engine) by design, and the rule is about what each module itself depends on.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest


def _source_root() -> Path:
    spec = importlib.util.find_spec("duetime")  # locates the package without importing it
    assert spec is not None
    assert spec.origin is not None
    return Path(spec.origin).parent.parent


SOURCE_ROOT = _source_root()

PURE = [
    "duetime.scheduling.edf",
    "duetime.scheduling.batching",
    "duetime.frontend.codec",
    "duetime.validation",
    "duetime.config",
    "duetime.requestparams",
]
# Declared pure in their docstrings; checked while they exist (they are newer than the rule).
PURE_IF_PRESENT = ["duetime.scheduling.admission", "duetime.scheduling.profile"]
FORBIDDEN_TOP_LEVEL = {"asyncio", "grpc", "httptools", "uvloop"}
CORE = ["duetime.engine"]
"""Modules every front end is built on: they may run an event loop, but import no front end."""
CONFIG_SCHEMA = {"duetime.frontend.proto", "duetime.frontend.proto.model_config_pb2"}
"""Triton's ModelConfig schema, generated into frontend/proto, which repository.tritonconfig
parses config.pbtxt with: a protobuf message, no HTTP or gRPC type, and the one front-end module
the core reaches (until it moves out of frontend/)."""


def module_file(root: Path, name: str) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _runtime_import_nodes(ast.Module(body=[other], type_ignores=[]))
        elif isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        else:
            yield from _runtime_import_nodes(child)


def imports_of(root: Path, name: str) -> set[str]:
    """Every module the file of `name` imports at run time, relative imports resolved."""
    path = module_file(root, name)
    assert path is not None, name
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_import_nodes(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parent = ".".join(parts[: len(parts) - node.level + 1])
            base = f"{parent}.{base}" if base else parent
        found.add(base)
        for alias in node.names:  # `from package import submodule`
            if module_file(root, f"{base}.{alias.name}") is not None:
                found.add(f"{base}.{alias.name}")
    return found


def import_chains(root: Path, start: str, top: str = "duetime") -> dict[str, list[str]]:
    """Each module reachable from `start` -> the chain of modules that imports it."""
    chains: dict[str, list[str]] = {start: [start]}
    queue = deque([start])
    parts = start.split(".")
    for package in (".".join(parts[:i]) for i in range(2, len(parts))):
        chains[package] = [start, package]
        queue.append(package)
    while queue:
        current = queue.popleft()
        targets = set(imports_of(root, current))
        for name in list(targets):  # importing a.b.c runs a.b's __init__ too (not the root's)
            parts = name.split(".")
            targets.update(".".join(parts[:i]) for i in range(2, len(parts)))
        for name in sorted(targets):
            if name in chains:
                continue
            chains[name] = [*chains[current], name]
            if name.startswith(f"{top}.") and module_file(root, name) is not None:
                queue.append(name)
    return chains


def violations(root: Path, module: str) -> list[str]:
    bad = []
    for name, chain in import_chains(root, module).items():
        frontend = name.startswith("duetime.frontend.") and name != module
        if name.split(".")[0] in FORBIDDEN_TOP_LEVEL or frontend:
            bad.append(" -> ".join(chain))
    return sorted(bad)


def frontend_imports(root: Path, module: str, allowed: set[str]) -> list[str]:
    """The chains by which `module` imports a front-end module not in `allowed`."""
    return sorted(
        " -> ".join(chain)
        for name, chain in import_chains(root, module).items()
        if name.startswith("duetime.frontend.") and name not in allowed
    )


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_loop_transport_or_frontend(module: str) -> None:
    assert module_file(SOURCE_ROOT, module) is not None, f"{module} is missing"
    assert violations(SOURCE_ROOT, module) == []


@pytest.mark.parametrize("module", PURE_IF_PRESENT)
def test_newer_pure_module_imports_no_loop_transport_or_frontend(module: str) -> None:
    if module_file(SOURCE_ROOT, module) is None:
        pytest.skip(f"{module} does not exist (yet)")
    assert violations(SOURCE_ROOT, module) == []


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_frontend(module: str) -> None:
    """The engine read `timeout` and `priority` from duetime.frontend.parameters, so the core
    imported the front-end package (they are in duetime.requestparams now)."""
    assert module_file(SOURCE_ROOT, module) is not None, f"{module} is missing"
    assert frontend_imports(SOURCE_ROOT, module, CONFIG_SCHEMA) == []


def test_importing_the_engine_loads_no_frontend_module() -> None:
    """As the static check, in a fresh interpreter (an import the parse cannot see counts)."""
    script = (
        "import sys, duetime.engine\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('duetime.frontend.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert set(done.stdout.split()) - CONFIG_SCHEMA == set()


# -- the checker itself ------------------------------------------------------------------------


def test_checker_sees_direct_and_transitive_imports_in_duetime() -> None:
    assert "duetime.scheduling.scheduler -> asyncio" in violations(
        SOURCE_ROOT, "duetime.scheduling.scheduler"
    )
    chains = import_chains(SOURCE_ROOT, "duetime.repository.registry")
    assert "asyncio" in chains
    assert chains["asyncio"][0] == "duetime.repository.registry"


def test_checker_on_a_made_up_package(tmp_path: Path) -> None:
    pkg = tmp_path / "duetime"
    (pkg / "frontend").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import asyncio  # the root is not followed\n")
    (pkg / "frontend" / "__init__.py").write_text("")
    (pkg / "frontend" / "codec.py").write_text("from .. import helpers\n")
    (pkg / "frontend" / "http.py").write_text("")
    (pkg / "helpers.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import grpc\n"
        "else:\n"
        "    import json\n"
        "def lazy():\n"
        "    from duetime.frontend import http\n"
    )
    assert imports_of(tmp_path, "duetime.frontend.codec") == {"duetime", "duetime.helpers"}
    assert imports_of(tmp_path, "duetime.helpers") == {
        "typing",
        "json",
        "duetime.frontend",
        "duetime.frontend.http",
    }
    assert violations(tmp_path, "duetime.frontend.codec") == [
        "duetime.frontend.codec -> duetime.helpers -> duetime.frontend.http"
    ]
    assert frontend_imports(tmp_path, "duetime.helpers", set()) == [
        "duetime.helpers -> duetime.frontend.http"
    ]
    assert frontend_imports(tmp_path, "duetime.helpers", {"duetime.frontend.http"}) == []
