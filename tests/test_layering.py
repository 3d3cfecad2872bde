"""The dependency direction of docs/architecture.md: gateway -> {routers, policies, providers,
local_tier} -> core. providers, routers and policies never import each other; nothing
imports gateway; core imports only the standard library and msgspec."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "gateway", "routers", "policies", "providers", "local_tier")
ALLOWED = {
    "core": set(),
    "providers": {"core"},
    "routers": {"core"},
    "policies": {"core"},
    "local_tier": {"core"},
    "gateway": {"core", "routers", "policies", "providers", "local_tier"},
}
CORE_THIRD_PARTY = {"msgspec"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_the_design_allows(package):
    wrong = {}
    for path in modules(package):
        own = imports_of(path) & set(PACKAGES) - {package}
        bad = own - ALLOWED[package]
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert wrong == {}


def test_core_imports_only_stdlib_and_msgspec():
    stdlib = set(sys.stdlib_module_names)
    wrong = {}
    for path in modules("core"):
        extra = imports_of(path) - stdlib - CORE_THIRD_PARTY - {"core", "__future__"}
        if extra:
            wrong[str(path.relative_to(ROOT))] = sorted(extra)
    assert wrong == {}


def test_the_checker_sees_a_violation(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("import gateway.app\nfrom routers.executor import Executor\n")
    assert imports_of(sample) == {"gateway", "routers"}


# gateway/'s rooms, outermost first: a room imports only rooms after it (docs/architecture.md,
# "gateway/ by role"). The entry points (cli, asgi) build the app; app.py wires the routes.
ROOMS = (
    "cli",
    "asgi",
    "app",
    "console",
    "routes",
    "jobs",
    "request",
    "telemetry",
    "dialects",
    "process",
    "http",
)


def gateway_imports(path: Path) -> set[str]:
    """The gateway rooms (and top-level modules) that ``path`` imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.update(n.split(".")[1] for n in names if n.startswith("gateway.") and "." in n)
    return found


def room_of(path: Path) -> str:
    relative = path.relative_to(ROOT / "gateway")
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def test_gateway_rooms_import_inwards_only():
    wrong = {}
    for path in modules("gateway"):
        room = room_of(path)
        if room not in ROOMS:
            continue  # gateway/__init__.py: the version only
        allowed = set(ROOMS[ROOMS.index(room) :])
        bad = gateway_imports(path) - allowed
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert wrong == {}


def test_every_gateway_module_lives_in_a_room():
    loose = {room_of(p) for p in modules("gateway")} - set(ROOMS)
    assert loose == {"__init__"}
