"""The operator's tree shows its three jobs, and its imports run one way (docs/operator.md draws them).

Every module of operator/ belongs to one unit; a unit may import only the units its row of MAY_IMPORT names:

    spec         the InferenceService API; used by everything
    shared       config, kube, events, times, metric_names
    reconcile    room 1: the children and the status            (spec, shared)
    autoscaling  room 2: spec.replicas from metrics             (spec, shared, reconcile)
    install      room 3: CRDs, chart, manifests                 (spec, shared)
    process      __main__, handlers, preflight, peering         (spec, shared, reconcile, autoscaling)
    command      `python -m kubeinfer.operator.crd` and co.     (install)

So reconcile never imports autoscaling, the install neither room, and nothing but `__main__` imports the kopf
handlers. The autoscaling room's sub-rooms are units of their own, imported one way:

    autoscaling.sizing     the replica model, calibration, fleet sizing     (shared)
    autoscaling.signals    what is read: metrics sources, pods             (spec, shared, reconcile, sizing)
    autoscaling.policies   reactive and predictive, their types            (shared, signals, sizing)
    autoscaling.simulator  the policies against the limits on traces        (shared, policies, signals, sizing)
    autoscaling            the pass at the top                              (all of them)
 The imports are read from the source (every import statement, those inside functions too), so a
lazy import cannot hide a dependency. The same file holds the 300-line limit of operator/, runtime/ and kernels/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator"
PACKAGE = "kubeinfer.operator"
MAX_LINES = 300

ROOMS = ("reconcile", "autoscaling", "install")
AUTOSCALING_ROOMS = ("sizing", "signals", "policies", "simulator")
SHARED = {"config", "kube", "events", "times", "metric_names"}
PROCESS = {"__main__", "handlers", "preflight", "peering"}
COMMANDS = {"crd", "chart", "manifests", "rbac"}

MAY_IMPORT: dict[str, set[str]] = {
    "package": set(),
    "spec": {"spec"},
    "shared": {"spec", "shared"},
    "reconcile": {"spec", "shared", "reconcile"},
    "autoscaling.sizing": {"shared", "autoscaling.sizing"},
    "autoscaling.signals": {"spec", "shared", "reconcile", "autoscaling.sizing", "autoscaling.signals"},
    "autoscaling.policies": {"shared", "autoscaling.sizing", "autoscaling.signals", "autoscaling.policies"},
    "autoscaling.simulator": {"shared", "autoscaling.sizing", "autoscaling.signals", "autoscaling.policies",
                              "autoscaling.simulator"},
    "autoscaling": {"spec", "shared", "reconcile", "autoscaling", *(f"autoscaling.{r}" for r in AUTOSCALING_ROOMS)},
    "install": {"spec", "shared", "install"},
    "process": {"spec", "shared", "reconcile", "autoscaling", *(f"autoscaling.{r}" for r in AUTOSCALING_ROOMS),
                "process"},
    "command": {"install"},
}


def module_name(path: Path, root: Path = OPERATOR, package: str = PACKAGE) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


MODULES = {module_name(p): p for p in sorted(OPERATOR.rglob("*.py"))}


def unit(module: str) -> str | None:
    parts = module.split(".")[2:]   # after kubeinfer.operator
    if not parts:
        return "package"
    head = parts[0]
    if head == "autoscaling" and len(parts) > 1 and parts[1] in AUTOSCALING_ROOMS:
        return f"autoscaling.{parts[1]}"
    if head == "spec" or head in ROOMS:
        return head
    if len(parts) == 1:
        for name, members in (("shared", SHARED), ("process", PROCESS), ("command", COMMANDS)):
            if head in members:
                return name
    return None


def imports(path: Path, module: str) -> set[str]:
    """The kubeinfer modules `module` imports: `from pkg import sub` counts as `pkg.sub` when that is a module."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {name for name in found if name.split(".")[0] == "kubeinfer"}


GRAPH = {module: {m for m in imports(path, module) if m in MODULES} for module, path in MODULES.items()}


def test_every_module_belongs_to_a_unit() -> None:
    unplaced = [m for m in MODULES if unit(m) is None]
    assert not unplaced, f"place these in a room (or in a unit of this test): {unplaced}"


def test_imports_run_one_way() -> None:
    wrong = [f"{source} imports {target} ({unit(source)} -> {unit(target)})"
             for source, targets in sorted(GRAPH.items()) for target in sorted(targets)
             if unit(target) not in MAY_IMPORT[unit(source) or "package"]]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles() -> None:
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(GRAPH[module]):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_unit_table_itself_has_no_cycle() -> None:
    """A room allowed to import another must not be importable by it (self-imports aside)."""
    for source, targets in MAY_IMPORT.items():
        for target in targets - {source}:
            assert source not in MAY_IMPORT[target], f"{source} and {target} may import each other"


def test_only_the_entry_point_imports_the_handlers() -> None:
    importers = []
    for folder, package in ((OPERATOR, PACKAGE), (ROOT / "runtime", "kubeinfer.runtime"),
                            (ROOT / "kernels", "kubeinfer.kernels"), (ROOT / "kubeinfer", "kubeinfer")):
        for path in folder.rglob("*.py"):
            module = module_name(path, folder, package)
            if f"{PACKAGE}.handlers" in imports(path, module) and module != f"{PACKAGE}.__main__":
                importers.append(module)
    assert not importers, f"only kubeinfer.operator.__main__ may import the handlers: {importers}"


def test_the_operator_never_imports_the_runtime_or_the_kernels() -> None:
    """The operator's image carries no torch (Containerfile, target operator)."""
    wrong = {m: sorted(t for t in imports(p, m) if t.startswith(("kubeinfer.runtime", "kubeinfer.kernels")))
             for m, p in MODULES.items()}
    assert not {m: t for m, t in wrong.items() if t}


@pytest.mark.parametrize("room", ["spec", *ROOMS, *(f"autoscaling/{r}" for r in AUTOSCALING_ROOMS)])
def test_each_room_says_what_it_owns_and_may_import(room: str) -> None:
    doc = ast.get_docstring(ast.parse((OPERATOR / room / "__init__.py").read_text())) or ""
    assert "Owns:" in doc and ("May import:" in doc or "imports nothing else" in doc), doc


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_commands_stay_thin(name: str) -> None:
    """They re-export a room's module, nothing more: no logic lives outside the rooms."""
    tree = ast.parse((OPERATOR / f"{name}.py").read_text())
    logic = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert not logic and len((OPERATOR / f"{name}.py").read_text().splitlines()) <= 12


def test_no_module_over_300_lines() -> None:
    """One concept per module (shared/STYLE.md): a file past 300 lines is asking to be split."""
    long = {str(p.relative_to(ROOT)): n for folder in ("operator", "runtime", "kernels")
            for p in sorted((ROOT / folder).rglob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """setuptools installs only the packages pyproject.toml lists (the folders are mapped to import names, so
    discovery cannot find them): a folder left out works from the checkout and is missing from every image."""
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {"kubeinfer." + ".".join(init.parent.relative_to(ROOT).parts)
               for top in ("operator", "runtime", "kernels") for init in (ROOT / top).rglob("__init__.py")}
    assert folders - listed == set()
