"""Layering: the graph of `targetlm`-internal imports has no cycle.

Every module of `src/targetlm` is parsed with `ast`; module-level imports and imports inside
functions (lazy imports) both count as edges, so a cycle cannot hide behind a deferred import.
Imports under `if TYPE_CHECKING:` count for cycles too: they never run, but two modules that
name each other's types still cannot be read or type-checked apart, and such a cycle turns
into a runtime one the day one of the names is used at run time (an `isinstance`, a default).
The rules about what a module may reach (`test_imports_run_downwards` and the like) are about
what runs, so they follow runtime imports only.

The layers are the picture in the package's docstring (`help(targetlm)`): every module of the
package lies in one of its layers, and no import, runtime or for types, runs from a layer up
to a layer above it.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import targetlm

ROOT = Path(targetlm.__file__).resolve().parent


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules(root: Path = ROOT) -> dict[str, Path]:
    return {_module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest known module that `name` (a module or `module.attribute`) lies in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _ancestors(name: str) -> list[str]:
    """The packages above `name`: `a.b.c` -> `[a, a.b]`."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _nodes(tree: ast.AST, type_checking: bool):
    """Every node of `tree`; without `type_checking`, not the bodies of `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if (
            not type_checking
            and isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


@functools.cache  # parsed once per session: the tests only read it
def import_graph(type_checking: bool = False, root: Path = ROOT) -> dict[str, set[str]]:
    """`{module: {imported modules of the package}}`, over every import statement in the file;
    with `type_checking`, the imports under `if TYPE_CHECKING:` as well.

    `from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg`;
    relative imports are resolved against the importing module's package. Importing
    `a.b.c` runs the `__init__` of package `a.b` first, so it is an edge to `a.b` as well,
    unless the importer lies inside `a.b` (whose `__init__` is then already running).
    """
    modules = _modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in _nodes(tree, type_checking):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if target.split(".")[0] != root.name:
                    continue
                resolved = _resolve(target, modules)
                if resolved is None:
                    continue
                for ancestor in _ancestors(resolved):
                    if ancestor in modules and not _inside(name, ancestor):
                        graph[name].add(ancestor)
                if resolved != name:
                    graph[name].add(resolved)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as `[a, b, ..., a]`, or None (iterative depth-first search)."""
    colour = dict.fromkeys(graph, 0)  # 0 unseen, 1 on the current path, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        colour[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                stack.pop()
            elif colour[nxt] == 1:
                return path[path.index(nxt) :] + [nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_import_graph_is_built_from_every_module():
    graph = import_graph()
    assert "targetlm.config" in graph and "targetlm.modules.model" in graph
    assert graph["targetlm.modules.model"], "the model imports its parts"


def test_find_cycle_reports_the_modules_of_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles():
    cycle = find_cycle(import_graph(type_checking=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def layers(doc: str | None = targetlm.__doc__) -> list[set[str]]:
    """The package docstring's picture of its layers, top first: the names on each line.

    The picture is the docstring's literal block (after ``::``): one layer a line, its
    top-level modules and packages joined by `` · ``, then two or more spaces and a caption.
    """
    block = (doc or "").split("::\n\n", 1)[-1].split("\n\n", 1)[0]
    rows = [re.split(r"\s{2,}", line.strip(), maxsplit=1)[0] for line in block.splitlines()]
    return [set(row.split(" · ")) for row in rows if row]


def _top(module: str) -> str:
    """The top-level module or package of the package that `module` lies in."""
    return module.split(".")[1] if "." in module else module


def arrows_back_up(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every import of `graph` from a module to a module of a higher layer, as `a -> b`."""
    level = {name: i for i, names in enumerate(layers) for name in names}
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        if "." in a
        for b in targets
        if "." in b and level[_top(b)] < level[_top(a)]
    )


def test_the_picture_of_the_layers_places_every_module_once():
    placed = [name for layer in layers() for name in layer]
    assert len(placed) == len(set(placed)), "a name in two layers of the picture"
    modules = {_top(m) for m in import_graph() if "." in m}
    assert set(placed) == modules, (
        f"not in the picture: {sorted(modules - set(placed))}; "
        f"in the picture, not in the package: {sorted(set(placed) - modules)}"
    )


def test_the_readme_draws_the_same_layers():
    readme = (ROOT.parent.parent / "README.md").read_text(encoding="utf-8")
    block = (targetlm.__doc__ or "").split("::\n\n", 1)[-1].split("\n\n", 1)[0]
    picture = "\n".join(line.removeprefix("    ") for line in block.splitlines())
    assert f"```\n{picture}\n```" in readme


def test_no_import_runs_back_up_the_layers():
    """Lazy imports and imports for types count: 0 arrows run from a layer to one above it."""
    assert arrows_back_up(import_graph(type_checking=True), layers()) == []


def test_an_import_from_a_higher_layer_is_an_arrow_back_up(tmp_path):
    picture = "pkg.\n\nLayers::\n\n    top · side  drivers\n    low         parts\n\nEnd.\n"
    assert layers(picture) == [{"top", "side"}, {"low"}]
    package = _package(
        tmp_path,
        {
            "top.py": "from pkg import low\n",
            "side.py": "from pkg.top import x\n",
            "low.py": "def f():\n    from pkg.side import y\n",
        },
    )
    graph = import_graph(root=package)
    assert arrows_back_up(graph, layers(picture)) == ["pkg.low -> pkg.side"]


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text, encoding="utf-8")
    return package


def test_a_cycle_through_a_type_checking_import_is_a_cycle(tmp_path):
    """One module imports the other at run time, the other imports it back for its types only
    (the shape `data.vocab` and `data.tokenizers` once had): the cycle test finds it."""
    package = _package(
        tmp_path,
        {
            "vocab.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg.tokenizers import Tokenizer\n",
            "tokenizers.py": "from pkg.vocab import Vocabulary\n",
        },
    )
    assert find_cycle(import_graph(root=package)) is None  # what runs has no cycle
    cycle = find_cycle(import_graph(type_checking=True, root=package))
    assert cycle == ["pkg.tokenizers", "pkg.vocab", "pkg.tokenizers"]


def test_a_cycle_through_a_lazy_relative_import_is_a_cycle(tmp_path):
    package = _package(
        tmp_path,
        {
            "a.py": "def f():\n    from . import b\n",
            "b.py": "from .a import f\n",
        },
    )
    assert find_cycle(import_graph(root=package)) == ["pkg.a", "pkg.b", "pkg.a"]


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def test_configuration_is_plain_data():
    """`targetlm.config` imports no model code: only the registry's error and type checks."""
    assert _reachable(import_graph(), "targetlm.config") <= {"targetlm.registry"}


def test_the_equations_import_nothing_of_the_package():
    """`targetlm.functional` is pure functions on tensors: it neither needs nor re-exports
    another module (the chunked loss is imported from `targetlm.chunked`)."""
    assert import_graph()["targetlm.functional"] == set()


def test_a_checkpoint_is_readable_without_the_training_package():
    graph = import_graph()
    for module in ("targetlm.checkpoint", "targetlm.runs"):
        reached = _reachable(graph, module)
        assert not {m for m in reached if _inside(m, "targetlm.training")}, module


@pytest.mark.parametrize(
    "lower",
    [
        "targetlm.data",
        "targetlm.functional",
        "targetlm.lexicon",
        "targetlm.modules",
        "targetlm.objectives",
        "targetlm.registry",
    ],
)
def test_imports_run_downwards(lower):
    """Components never import what wires or drives them, nor the configuration (DESIGN.md:
    only builders and cli read it; components take plain keyword arguments)."""
    graph = import_graph()
    upper = ("targetlm.builders", "targetlm.cli", "targetlm.config", "targetlm.inference")
    upper += ("targetlm.runs", "targetlm.training")
    for module in [m for m in graph if _inside(m, lower)]:
        wrong = sorted(m for m in _reachable(graph, module) if any(_inside(m, u) for u in upper))
        assert not wrong, f"{module} imports {', '.join(wrong)}"


def test_tasks_sit_above_inference_and_below_the_drivers():
    """A task owns its evaluation and decoder (it calls ``targetlm.inference``), so inference
    never imports a task; the trainer, the commands and the builders drive tasks, which never
    import them (nor the configuration, read by name only under ``TYPE_CHECKING``)."""
    graph = import_graph()
    for module in [m for m in graph if _inside(m, "targetlm.inference")]:
        wrong = sorted(m for m in _reachable(graph, module) if _inside(m, "targetlm.tasks"))
        assert not wrong, f"{module} imports {', '.join(wrong)}"
    drivers = ("targetlm.builders", "targetlm.cli", "targetlm.config", "targetlm.runs")
    drivers += ("targetlm.training",)
    for module in [m for m in graph if _inside(m, "targetlm.tasks")]:
        wrong = sorted(m for m in _reachable(graph, module) if any(_inside(m, d) for d in drivers))
        assert not wrong, f"{module} imports {', '.join(wrong)}"
