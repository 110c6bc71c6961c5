"""The house plan, checked on the source: imports point down, never in a circle.

`workers/rljob_workers` is split by the process each part runs in (CONTRIBUTING.md, "Layout"): the
driver may import every pool server's entry points; a pool server imports only the packages
under it. `operator/rljob_operator` is split into rooms by what each does (CONTRIBUTING.md, "The
operator's rooms"): a room imports only the rooms below it, and the pure ones no I/O. Every import
counts, the ones inside functions and under TYPE_CHECKING too: a lazy import is still an arrow, and a
circle through one is still a circle.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from conftest import REPO

TOP = "rljob_workers"
# The pool servers' packages, and what each may import (besides itself, the api and the protos).
POOL_PACKAGES: Mapping[str, frozenset[str]] = {
    "common": frozenset(),
    "tasks": frozenset(),
    "models": frozenset({"tasks"}),
    "weights": frozenset({"common"}),
    "engines": frozenset({"common", "weights"}),
    "trainer": frozenset({"common", "weights"}),
    "rollout": frozenset({"common", "engines", "weights"}),
    "reward": frozenset({"common", "engines"}),
    "environment": frozenset({"common"}),
}
# The driver's rooms, from the ground up: each may import the rooms below it and every pool package, never
# one above it (CONTRIBUTING.md, "The driver's rooms").
DRIVER_FLOORS = ("errors", "pools", "controller", "telemetry", "placement", "run", "commands", "cli")
ALLOWED: Mapping[str, frozenset[str]] = {
    **POOL_PACKAGES,
    "driver": frozenset({"driver." + room for room in DRIVER_FLOORS}),  # its __init__ names them all
    **{
        "driver." + room: frozenset({*POOL_PACKAGES, *("driver." + below for below in DRIVER_FLOORS[:floor])})
        for floor, room in enumerate(DRIVER_FLOORS)
    },
}

OPERATOR = "rljob_operator"
# The operator's rooms, from the ground up: the shared values (three modules), the pure builders and the pure
# status, the cluster's adapters, the actions over them, the process; each may import only the rooms below it.
OPERATOR_FLOORS = ("names", "options", "config", "render", "status", "kube", "reconcile", "process", "__main__")
OPERATOR_ALLOWED: Mapping[str, frozenset[str]] = {
    room: frozenset(OPERATOR_FLOORS[:floor]) for floor, room in enumerate(OPERATOR_FLOORS)
}
# The rooms whose path says "pure": no client of the API server, kopf, gRPC channels or Prometheus, no event loop.
OPERATOR_PURE = ("names", "options", "config", "render", "status")
IO_LIBRARIES = ("kopf", "kubernetes", "grpc", "prometheus_client", "asyncio", "socket")


def modules(root: Path, top: str = TOP) -> dict[str, Path]:
    """Dotted module name -> file, for every module of package `top` under `root`."""
    found = {}
    for path in sorted((root / top).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        package = module if is_package else module.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
        target = ".".join([*base, *([node.module] if node.module else [])])
        yield target
        yield from (f"{target}.{alias.name}" for alias in node.names)


def import_graph(root: Path, top: str = TOP) -> dict[str, set[str]]:
    """module -> the modules of `top` it imports anywhere in its source."""
    mods = modules(root, top)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        targets = {t for node in ast.walk(tree) for t in _imported(node, name, is_package)}
        graph[name] = {t for t in targets if t in mods and t != name}
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _package(module: str) -> str:
    """The room a module of rljob_workers stands in: its package, or under `driver/` its room there."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "driver":
        return f"driver.{parts[2]}"
    return parts[1] if len(parts) > 1 else ""


def _operator_room(module: str) -> str:
    """The room a module of rljob_operator stands in: its subpackage, or the top-level module itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def forbidden_arrows(
    graph: Mapping[str, set[str]],
    allowed: Mapping[str, frozenset[str]] = ALLOWED,
    room: Callable[[str], str] = _package,
) -> list[str]:
    """Each import from one package (or room) into another that the plan does not allow."""
    bad = []
    for module, targets in sorted(graph.items()):
        source = room(module)
        for target in sorted(targets):
            dest = room(target)
            if dest and dest != source and dest not in allowed.get(source, frozenset()):
                bad.append(f"{module} -> {target} ({source} may not import {dest})")
    return bad


@pytest.mark.parametrize(("folder", "top"), [("workers", TOP), ("api", "rljob_api"), ("operator", "rljob_operator")])
def test_no_import_circle(folder, top):
    assert circles(import_graph(REPO / folder, top)) == []


def test_workers_import_only_downward():
    graph = import_graph(REPO / "workers")
    assert forbidden_arrows(graph) == []
    packages = {_package(m) for m in graph} - {""}
    assert packages == set(ALLOWED), "a new package or room needs its place in ALLOWED and in CONTRIBUTING.md's layout"


def test_the_operator_imports_only_downward():
    graph = import_graph(REPO / "operator", OPERATOR)
    assert forbidden_arrows(graph, OPERATOR_ALLOWED, _operator_room) == []
    rooms = {_operator_room(m) for m in graph} - {""}
    assert rooms == set(OPERATOR_FLOORS), "a new room needs its floor in OPERATOR_FLOORS and in CONTRIBUTING.md"


def io_imports(root: Path, top: str = OPERATOR, pure: tuple[str, ...] = OPERATOR_PURE) -> list[str]:
    """Each import of an I/O library (IO_LIBRARIES) by a module of a pure room, as 'module -> library'."""
    found = []
    for name, path in modules(root, top).items():
        if _operator_room(name) not in pure:
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            for target in _imported(node, name, path.name == "__init__.py"):
                if target.split(".")[0] in IO_LIBRARIES:
                    found.append(f"{name} -> {target}")
    return sorted(set(found))


def test_the_operator_pure_rooms_do_no_io():
    assert io_imports(REPO / "operator") == []


def test_no_pool_process_code_under_the_driver():
    """Each pool's Ray actor lives beside its server: nothing under driver/ defines a Ray actor class."""
    actors = [
        f"{path.relative_to(REPO)}: {node.name}"
        for path in sorted((REPO / "workers" / TOP / "driver").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and any("remote" in ast.unparse(d) for d in node.decorator_list)
    ]
    assert actors == []


def _tree(root: Path, files: Mapping[str, str], top: str = TOP) -> Path:
    for name, source in files.items():
        path = root / top / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for folder in [root / top, *(p for p in (root / top).rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return root


# The shapes the old flat layout had, each of which the checks must catch.
OLD_DEFECTS = {
    "a driver module and its helper importing each other (local <-> local_run)": {
        "driver/local.py": "def run():\n    from .local_run import LocalRun\n",
        "driver/local_run.py": "from rljob_workers.driver.local import SetupError\n",
    },
    "an engine base importing the engines that import it back": {
        "engines/base.py": "def make_engine():\n    from .hf import HF\n",
        "engines/hf.py": "from .base import Engine\n",
    },
    "a lazy import inside a function closing a circle (functions <-> kinds)": {
        "reward/functions.py": "def from_spec():\n    from . import kinds\n",
        "reward/kinds.py": "from .functions import load_function\n",
    },
}


@pytest.mark.parametrize("files", OLD_DEFECTS.values(), ids=list(OLD_DEFECTS))
def test_a_circle_is_found(tmp_path, files):
    assert circles(import_graph(_tree(tmp_path, files))) != []


@pytest.mark.parametrize(
    "source",
    [
        "from rljob_workers.driver.controller.idle import BusyClock\n",  # the router's old arrow, from a server
        "from ..driver import metrics\n",
        "import typing\nif typing.TYPE_CHECKING:\n    import rljob_workers.driver.metrics\n",
    ],
    ids=["absolute", "relative", "type-checking"],
)
def test_a_server_importing_the_driver_is_found(tmp_path, source):
    root = _tree(
        tmp_path,
        {"reward/router.py": source, "driver/metrics.py": "X = 1\n", "driver/controller/idle.py": "BusyClock = 1\n"},
    )
    assert forbidden_arrows(import_graph(root)) != []


# The brief's limits: modules under 400 lines, functions under 60 (generated stubs aside).
MODULE_LINES, FUNCTION_LINES = 400, 60
SOURCE_ROOTS = ("api", "operator", "workers", "benchmarks", "tests", "proto")


def oversized(root: Path) -> list[str]:
    """Every module of MODULE_LINES lines or more and every function of FUNCTION_LINES or more, as
    'path: what (lines)'."""
    found = []
    for top in SOURCE_ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            if "gen" in path.relative_to(root).parts:
                continue
            source = path.read_text()
            where = path.relative_to(root)
            if (lines := len(source.splitlines())) >= MODULE_LINES:
                found.append(f"{where}: the module ({lines})")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length >= FUNCTION_LINES:
                        found.append(f"{where}: {node.name} ({length})")
    return found


def test_modules_and_functions_stay_small():
    assert oversized(REPO) == []


def test_an_oversized_module_and_function_are_found(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "big.py").write_text("def long_one():\n" + body + "\n" * MODULE_LINES)
    (tmp_path / "workers" / "gen").mkdir()
    (tmp_path / "workers" / "gen" / "stub.py").write_text("\n" * MODULE_LINES)  # generated: not counted
    assert oversized(tmp_path) == [
        f"workers/big.py: the module ({FUNCTION_LINES + 1 + MODULE_LINES})",
        f"workers/big.py: long_one ({FUNCTION_LINES + 1})",
    ]


def test_a_driver_room_importing_one_above_it_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "driver/pools/router.py": "from rljob_workers.driver.controller.loop import Controller\n",
            "driver/controller/loop.py": "Controller = 1\n",
        },
    )
    assert forbidden_arrows(import_graph(root)) == [
        "rljob_workers.driver.pools.router -> rljob_workers.driver.controller.loop (driver.pools may not import "
        "driver.controller)"
    ]


@pytest.mark.parametrize(
    ("files", "arrow"),
    [
        (
            {"render/pods.py": "from rljob_operator.status.observe import Observed\n", "status/observe.py": "X = 1\n"},
            "rljob_operator.render.pods -> rljob_operator.status.observe (render may not import status)",
        ),
        (
            {"status/compute.py": "def f():\n    from ..kube.client import Kube\n", "kube/client.py": "Kube = 1\n"},
            "rljob_operator.status.compute -> rljob_operator.kube.client (status may not import kube)",
        ),
        (
            {"names.py": "from rljob_operator.process.handlers import RESOURCE\n", "process/handlers.py": "X = 1\n"},
            "rljob_operator.names -> rljob_operator.process.handlers (names may not import process)",
        ),
    ],
    ids=["absolute", "lazy-relative", "from-the-ground"],
)
def test_an_operator_room_importing_one_above_it_is_found(tmp_path, files, arrow):
    graph = import_graph(_tree(tmp_path, files, OPERATOR), OPERATOR)
    assert forbidden_arrows(graph, OPERATOR_ALLOWED, _operator_room) == [arrow]


def test_an_io_import_in_a_pure_operator_room_is_found(tmp_path):
    files = {
        "render/pods.py": "import kubernetes.client\n",
        "status/volumes.py": "async def f():\n    import asyncio\n",
        "kube/client.py": "import kubernetes\n",  # an I/O room: allowed
    }
    assert io_imports(_tree(tmp_path, files, OPERATOR)) == [
        "rljob_operator.render.pods -> kubernetes.client",
        "rljob_operator.status.volumes -> asyncio",
    ]
