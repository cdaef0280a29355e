"""The layering stays as designed: url -> zmap -> format -> api -> cdl -> integrations -> cli, no cycles.

Two checks. Statically, every import in every module (top-level or inside a function, where lazy imports
hide) goes to the same layer or a lower one, and the modules form no cycle. Dynamically, importing every
module of a layer in a fresh interpreter loads no module of a higher layer.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nczmap"
# Lowest first. A module belongs to the first layer whose prefix matches it.
LAYERS = [
    (
        "foundation",
        (
            "nczmap._version",
            "nczmap._lazy",
            "nczmap.errors",
            "nczmap.registry",
            "nczmap.concurrency",
            "nczmap.checksum",
            "nczmap.progress",
            "nczmap.collector",
        ),
    ),
    ("url", ("nczmap.url",)),
    ("zmap", ("nczmap.zmap", "nczmap.manifest")),
    ("format", ("nczmap.format",)),
    ("api", ("nczmap.api",)),
    ("cdl", ("nczmap.cdl", "nczmap.cdl_text")),
    ("integrations", ("nczmap.integrations",)),
    ("tools", ("nczmap.cli", "nczmap.__main__", "nczmap.testing")),
]
# Inside the format layer: the model never reaches what reads, writes or opens it.
FORMAT_MODEL = (
    "nczmap.format.types",
    "nczmap.format.jsonutil",
    "nczmap.format.codecs",
    "nczmap.format.dialects",
    "nczmap.format.model",
    "nczmap.format.selection",
    "nczmap.format.variable",
    "nczmap.format.dataset",
)
FORMAT_USERS = (
    "nczmap.format.reader",
    "nczmap.format.writer",
    "nczmap.format.metadata",
    "nczmap.format.opening",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes):
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def imports_of(module: str) -> set[str]:
    """nczmap modules ``module`` imports anywhere in its body (a package counts as its __init__)."""
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{module}: use absolute imports"
            base = node.module or ""
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in MODULES else base)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: imports_of(module) for module in MODULES}


def test_every_module_has_a_layer():
    for module in MODULES:
        if module != "nczmap":
            layer_of(module)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "nczmap"))
def test_no_upward_import(module):
    upward = sorted(
        target for target in GRAPH[module] if target != "nczmap" and layer_of(target) > layer_of(module)
    )
    assert not upward, f"{module} ({LAYERS[layer_of(module)][0]}) imports higher layers: {upward}"


def test_submodules_never_import_their_package_facade():
    for module, targets in GRAPH.items():
        for target in targets:
            is_package = MODULES[target].name == "__init__.py"
            assert not (is_package and module.startswith(target + ".")), f"{module} imports {target}"


def test_no_import_cycle():
    # The root package is a facade that loads its parts lazily; every other edge counts.
    graph = {m: {t for t in targets if t != "nczmap"} for m, targets in GRAPH.items() if m != "nczmap"}
    visiting, done, path = set(), set(), []

    def visit(node: str) -> None:
        visiting.add(node)
        path.append(node)
        for target in sorted(graph[node]):
            if target in visiting:
                cycle = [*path[path.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in done and target not in visiting:
                visit(target)
        path.pop()
        visiting.discard(node)
        done.add(node)

    for module in sorted(graph):
        if module not in done:
            visit(module)


def test_the_format_model_never_reaches_its_readers_and_writers():
    for start in FORMAT_MODEL:
        seen, stack = set(), [start]
        while stack:
            node = stack.pop()
            for target in GRAPH[node] - seen:
                seen.add(target)
                stack.append(target)
        assert not seen & set(FORMAT_USERS), f"{start} reaches {sorted(seen & set(FORMAT_USERS))}"


@pytest.mark.parametrize("rank", range(2, len(LAYERS) - 1))
def test_importing_a_layer_loads_nothing_above_it(rank):
    """In a fresh interpreter (the root package itself loads url and zmap, so the check starts there)."""
    name, _ = LAYERS[rank]
    mine = [m for m in MODULES if m != "nczmap" and layer_of(m) == rank]
    higher = [m for m in MODULES if m != "nczmap" and layer_of(m) > rank]
    if rank == layer_of("nczmap.integrations.netcdf4") and importlib.util.find_spec("netCDF4") is None:
        pytest.skip("netCDF4-python is not installed")
    script = (
        "import importlib, sys\n"
        f"for name in {mine!r}: importlib.import_module(name)\n"
        f"print(sorted(name for name in {higher!r} if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", f"importing the {name} layer loaded {result.stdout.strip()}"
