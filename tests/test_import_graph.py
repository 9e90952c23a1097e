"""The package's import rules (docs/architecture.md, "Layers"): every module of hscl_zoo/ sits in
one layer of `LAYERS`, imports only its own layer and those below, and no import circle exists;
and no module outgrows `MAX_LINES`.

Every import statement counts, wherever it is: at module level, inside a function, under
``if TYPE_CHECKING:``, relative or absolute. A deferred import is still a dependency: it only
hides the circle from the interpreter, not from a reader. The graph is read with `ast`, never by
importing the package, so it costs nothing and sees code that never runs.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hscl_zoo"
DOC = ROOT / "docs" / "architecture.md"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("hscl_zoo._files", "hscl_zoo._lazy", "hscl_zoo._options", "hscl_zoo._provenance", "hscl_zoo._roots",
              "hscl_zoo._table", "hscl_zoo._version", "hscl_zoo.config_help", "hscl_zoo.configs", "hscl_zoo.protocol")),
    ("data", ("hscl_zoo.data", "hscl_zoo.data.*")),
    ("losses", ("hscl_zoo.losses", "hscl_zoo.losses.*")),
    ("config", ("hscl_zoo.training.config", "hscl_zoo.training.overrides")),
    ("graphs", ("hscl_zoo.graphs", "hscl_zoo.graphs.*")),
    ("files", ("hscl_zoo.zoo.hub", "hscl_zoo.zoo.model_types", "hscl_zoo.zoo.pins", "hscl_zoo.zoo.registry",
               "hscl_zoo.zoo.releases",
               "hscl_zoo.zoo.saving", "hscl_zoo.zoo.schema", "hscl_zoo.zoo.shards", "hscl_zoo.zoo.sources")),
    ("models", ("hscl_zoo.models", "hscl_zoo.timm_models")),
    ("measures", ("hscl_zoo.audit", "hscl_zoo.features", "hscl_zoo.probes", "hscl_zoo.retrieval")),
    ("zoo", ("hscl_zoo.zoo", "hscl_zoo.zoo.*", "hscl_zoo.graphs.cards")),
    ("reproduction", ("hscl_zoo.reproduction", "hscl_zoo.reproduction.*", "hscl_zoo.graphs.figures",
                      "hscl_zoo.graphs.summary")),
    ("evaluation", ("hscl_zoo.embedding", "hscl_zoo.evaluation", "hscl_zoo.export", "hscl_zoo.graphs.recipe")),
    ("publishing", ("hscl_zoo.publishing", "hscl_zoo.publishing.*", "hscl_zoo.graphs.release")),
    ("training", ("hscl_zoo.training", "hscl_zoo.training.*")),
    ("evidence", ("hscl_zoo.reproduction.evidence",)),
    ("top", ("hscl_zoo", "hscl_zoo.cli", "hscl_zoo.cli_commands")),
)
"""The layers, lowest first: a module may import its own layer and those listed before it. A
module's layer is the one naming it exactly, else the one whose wildcard matches it."""

MAX_LINES = 400
"""A module longer than this holds more than one job: split it by job (docs/architecture.md)."""


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `package` (a package by its __init__.py)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module of the package, line) of every import statement anywhere in the file: a name taken
    from a package counts as its submodule when it is one, else as the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.append((target, node.lineno))
    return found


def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line of the first such import}."""
    modules = module_files(package)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        graph[name] = {}
        for target, line in imported_modules(name, path, modules):
            graph[name].setdefault(target, line)
    return graph


def layer_of(module: str, layers=LAYERS) -> int | None:
    """Index in `layers` of the module's layer: an exact name first, else a matching wildcard."""
    for exact in (True, False):
        for index, (_, patterns) in enumerate(layers):
            for pattern in patterns:
                if ("*" not in pattern) == exact and fnmatch.fnmatchcase(module, pattern):
                    return index
    return None


def upward_imports(graph: dict[str, dict[str, int]], layers=LAYERS) -> list[str]:
    return [f"{source} ({layers[layer_of(source, layers)][0]}) imports {target} "
            f"({layers[layer_of(target, layers)][0]}), line {line}"
            for source, targets in sorted(graph.items()) for target, line in sorted(targets.items())
            if layer_of(target, layers) > layer_of(source, layers)]


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import circles: each strongly connected group of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph(PACKAGE)


def test_every_module_sits_in_a_layer(graph):
    assert [module for module in graph if layer_of(module) is None] == []


def test_no_module_imports_a_higher_layer(graph):
    assert upward_imports(graph) == []


def test_no_import_circles(graph):
    assert cycles(graph) == []


def test_no_module_is_over_the_line_bound():
    """The package's modules and the benchmarks' scripts."""
    files = [*module_files(PACKAGE).values(), *sorted((ROOT / "benchmarks").glob("*.py"))]
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines()) for path in files}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_the_architecture_doc_states_these_layers():
    """docs/architecture.md's table between the layers markers lists `LAYERS`, in order."""
    text = DOC.read_text(encoding="utf-8")
    table = re.search(r"<!-- layers:start -->(.*?)<!-- layers:end -->", text, re.S).group(1)
    rows = [line.strip().strip("|").split("|") for line in table.strip().splitlines()[2:]]
    stated = tuple((name.strip(), tuple(re.findall(r"`([^`]+)`", modules))) for name, modules in rows)
    assert stated == LAYERS


def test_the_graph_counts_deferred_type_checking_and_relative_imports(tmp_path):
    """The reader on a package of its own: a circle made only of an import inside a function and
    one under TYPE_CHECKING is found, as are a relative import and one deferred into a function
    that climb a layer."""
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "a.py").write_text("def f():\n    from pkg.low import b\n")
    (package / "low" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.low.a import f\n")
    (package / "low" / "c.py").write_text("from ..high import d\n")
    (package / "low" / "e.py").write_text("def f():\n    import pkg.high\n")
    (package / "high.py").write_text("import pkg.low.a as a\n")
    layers = (("low", ("pkg", "pkg.low", "pkg.low.*")), ("high", ("pkg.high",)))
    found = import_graph(package)
    assert found["pkg.low.a"] == {"pkg.low.b": 2} and found["pkg.low.b"] == {"pkg.low.a": 3}
    assert cycles(found) == [["pkg.low.a", "pkg.low.b"]]
    assert upward_imports(found, layers) == ["pkg.low.c (low) imports pkg.high (high), line 1",
                                             "pkg.low.e (low) imports pkg.high (high), line 2"]
