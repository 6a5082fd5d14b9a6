"""The layering, read from the source: no import cycles among rtvoice's own modules, and nothing in the engine
imports from the transports (``app/``).

Every module under ``app/`` and ``engine/`` is parsed (not imported) under its installed name (``app/whep/sdp.py``
is ``rtvoice.app.whep.sdp``), relative imports resolved. An import of ``package.name`` counts as an import of the
module ``package.name`` when there is one, else of ``package`` (a name it defines). Imports inside functions and
under ``TYPE_CHECKING`` count too: a cycle hidden in a function or a type hint is still a cycle in the design. A
package's ``__init__`` that imports its own modules (to re-export them) is not a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = {"rtvoice.app": REPO / "app", "rtvoice.engine": REPO / "engine"}


def modules() -> dict[str, Path]:
    """Installed name -> source file, for every module of the layers (packages by their ``__init__``)."""
    found = {}
    for prefix, root in LAYERS.items():
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((prefix, *parts))] = path
    return found


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name the module imports, relative imports made absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (a name resolves to the longest module it starts with)."""
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets = set()
        for imported in imported_names(name, path):
            parts = imported.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in known:
                    targets.add(candidate)
                    break
        targets.discard(name)
        if path.name == "__init__.py":  # re-exports of its own modules are not a cycle
            targets = {target for target in targets if not target.startswith(name + ".")}
        graph[name] = targets
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the groups of modules that import each other, directly or through others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_parser_sees_the_modules_and_their_imports() -> None:
    graph = import_graph()
    assert "rtvoice.app.main" in graph and "rtvoice.engine.scheduler" in graph
    assert "rtvoice.engine.models.base" in graph["rtvoice.engine.scheduler"]  # an absolute import
    assert "rtvoice.engine.models.cosyvoice2.frontend" in graph["rtvoice.engine.models.cosyvoice2.voice"]  # relative


def test_a_cycle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert [group for group in strongly_connected(graph) if len(group) > 1] == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = [group for group in strongly_connected(graph) if len(group) > 1]
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(group) for group in cycles)


def test_the_engine_does_not_import_the_transports() -> None:
    graph = import_graph()
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name.startswith("rtvoice.engine")
        for target in targets
        if target.startswith("rtvoice.app")
    )
    assert not wrong, wrong


# -- the engine's facade ---------------------------------------------------------------------------------------

ENGINE_INTERNALS = (
    "rtvoice.engine.scheduler",
    "rtvoice.engine.admission",
    "rtvoice.engine.core",
    "rtvoice.engine.runner",
    "rtvoice.engine.policy",
    "rtvoice.engine.cost",
    "rtvoice.engine.cloning",
    "rtvoice.engine.models.piper",
    "rtvoice.engine.models.cosyvoice2",
)
"""What only the engine itself uses: the scheduler and its parts, the runner, the model packages."""
CHECKS_BEFORE_A_STREAM = {"check_text", "resolve_voice", "check_sample_rate", "check_options", "scheduler"}
"""What transports once called or read themselves before opening a stream; ``Engine.open_stream`` checks a request."""


def test_transports_use_only_the_engine_facade() -> None:
    graph = import_graph()
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if name.startswith("rtvoice.app")
        for target in targets
        if target.startswith(ENGINE_INTERNALS)
    )
    assert not wrong, wrong


def engine_attributes_read(path: Path) -> set[str]:
    """Attributes read off anything named ``engine`` (``engine.x``, ``self.engine.x``) in a file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "engine") or (
                isinstance(owner, ast.Attribute) and owner.attr == "engine"
            ):
                names.add(node.attr)
    return names


def test_the_attribute_reader_sees_reads_off_the_engine(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text("engine.open_stream(r)\nself.engine._voices.get(x)\nother.scheduler\n")
    assert engine_attributes_read(source) == {"open_stream", "_voices"}


def test_transports_leave_requests_to_the_engine() -> None:
    """No transport checks text, voices, rates or options itself, nor reads the engine's scheduler or privates."""
    wrong = sorted(
        f"{path.relative_to(REPO)} reads engine.{attribute}"
        for path in (REPO / "app").rglob("*.py")
        for attribute in engine_attributes_read(path)
        if attribute in CHECKS_BEFORE_A_STREAM or attribute.startswith("_")
    )
    assert not wrong, wrong


# -- tests, benchmarks and what they share ------------------------------------------------------------------

SHARED_BY_TESTS_AND_BENCH = "testkit"
MUST_NOT_IMPORT = {"tests": {"bench"}, "bench": {"tests"}, SHARED_BY_TESTS_AND_BENCH: {"tests", "bench"}}
"""``tests/`` and ``bench/`` never import each other; what both use lives in ``testkit/``, which imports neither."""


def top_level_imports(path: Path) -> set[str]:
    """The top-level packages a file imports absolutely (``from bench.servers import x`` -> ``bench``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_import_reader_sees_top_level_packages(tmp_path: Path) -> None:
    source = tmp_path / "example.py"
    source.write_text("import os.path\nfrom bench.servers import x\nfrom . import y\n\ndef f():\n    import tests.a\n")
    assert top_level_imports(source) == {"os", "bench", "tests"}


def test_tests_and_bench_do_not_import_each_other() -> None:
    wrong = sorted(
        f"{path.relative_to(REPO)} imports {package}"
        for folder, forbidden in MUST_NOT_IMPORT.items()
        for path in (REPO / folder).rglob("*.py")
        for package in top_level_imports(path) & forbidden
    )
    assert not wrong, wrong
