"""The package layout's import rules, checked on the source (every import, lazy ones inside functions
and `if TYPE_CHECKING:` blocks included).

- only `specchat/llama/` imports llama_cpp, only `specchat/models/` huggingface_hub;
- `specchat/decoding/` imports nothing of llama, models, server, cli or bench (engines reach it through
  the `decoding.model.Model` protocol);
- `specchat/server/` imports neither `specchat.llama` nor llama_cpp;
- the foundations (`errors`, `store`, `terminal`) import no other part of specchat;
- each sub-package imports only the parts below it (`ALLOWED`), so imports flow one way:
  cli -> server, bench, models -> llama -> decoding -> foundations;
- the parts of specchat (its sub-packages and top-level modules) import each other without a cycle;
- no two modules import each other, directly or round a longer loop (a lazy import inside a function
  counts: it hides the cycle from Python, not from a reader, who must read both modules to follow one);
- no module is over `MAX_LINES` lines: split it by responsibility before it grows past that.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specchat"
FOUNDATIONS = {"errors", "store", "terminal"}
#: the longest a module may be, in lines
MAX_LINES = 600
#: which other parts each sub-package may import (besides the foundations); cli may import every part
ALLOWED: dict[str, set[str]] = {
    "decoding": set(),
    "llama": {"decoding"},
    "models": {"decoding", "llama"},
    "server": {"decoding"},
    "bench": {"decoding"},
}


def module_name(path: Path) -> str:
    parts = ["specchat", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute name) for every import statement in the file, wherever it is: the module for
    `import m`, and `m.name` for each name of `from m import name` (a module or something in m)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"


MODULES = sorted(PACKAGE.rglob("*.py"))
IMPORTS = [(path, line, target) for path in MODULES for line, target in imports(path)]


def part(module: str) -> str | None:
    """The part of specchat a module belongs to: its sub-package or top-level module."""
    pieces = module.split(".")
    return pieces[1] if pieces[0] == "specchat" and len(pieces) > 1 else None


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(PACKAGE.parent)}:{line}"


def assert_none(rule: Callable[[Path, str], bool], what: str) -> None:
    """Fail naming every import that breaks the rule (file, line and what it imports)."""
    bad = [f"{where(p, line)} imports {target}" for p, line, target in IMPORTS if rule(p, target)]
    assert not bad, f"{what}:\n  " + "\n  ".join(bad)


def test_the_walk_sees_the_package():
    names = {module_name(p) for p in MODULES}
    assert {"specchat.decoding.loop", "specchat.llama.engine", "specchat.server.app"} <= names
    assert any(is_llama_cpp(t) for _p, _l, t in IMPORTS)


def in_part(path: Path, name: str) -> bool:
    return part(module_name(path)) == name


def is_llama_cpp(target: str) -> bool:
    return target == "llama_cpp" or target.startswith("llama_cpp.")


def test_only_the_llama_package_imports_llama_cpp():
    assert_none(lambda p, t: is_llama_cpp(t) and not in_part(p, "llama"), "llama_cpp outside specchat/llama")


def test_only_the_models_package_talks_to_the_hub():
    assert_none(
        lambda p, t: t.split(".")[0] == "huggingface_hub" and not in_part(p, "models"),
        "huggingface_hub outside specchat/models",
    )


def test_decoding_imports_no_engine_models_server_cli_or_bench():
    banned = {"llama", "models", "server", "cli", "bench"}
    assert_none(
        lambda p, t: in_part(p, "decoding") and (part(t) in banned or is_llama_cpp(t)),
        "specchat/decoding may import only the foundations and itself",
    )


def test_server_imports_no_engine():
    assert_none(
        lambda p, t: in_part(p, "server") and (part(t) == "llama" or is_llama_cpp(t)),
        "specchat/server must not import the engine",
    )


def test_foundations_import_no_other_part():
    def rule(p: Path, t: str) -> bool:
        here = part(module_name(p))
        return here in FOUNDATIONS and part(t) is not None and part(t) not in FOUNDATIONS

    assert_none(rule, "the foundations (errors, store, terminal) import no other part of specchat")


def test_each_package_imports_only_the_parts_below_it():
    def rule(p: Path, t: str) -> bool:
        here, there = part(module_name(p)), part(t)
        if here not in ALLOWED or there is None or there == here or there in FOUNDATIONS:
            return False
        return there not in ALLOWED[here]

    assert_none(rule, f"imports against the layout's direction (allowed: {ALLOWED})")


def test_parts_import_each_other_without_a_cycle():
    edges: dict[str, dict[str, str]] = {}  # part -> {imported part: one import that makes the edge}
    for p, line, target in IMPORTS:
        src, dst = part(module_name(p)), part(target)
        if src and dst and src != dst:
            edges.setdefault(src, {}).setdefault(dst, f"{where(p, line)} imports {target}")

    state: dict[str, str] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in edges.get(node, {}):
            if state.get(nxt) == "open":
                cycle = [*stack[stack.index(nxt) :], nxt] if nxt in stack else [node, nxt]
                links = [edges[a][b] for a, b in itertools.pairwise(cycle)]
                pytest.fail("import cycle " + " -> ".join(cycle) + ":\n  " + "\n  ".join(links))
            if nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])


def module_of(target: str, names: set[str]) -> str | None:
    """The specchat module an import's target names: the module itself, or for `from P import n`
    given as `P.n` where n is not a module, the package P (its `__init__`); None outside specchat."""
    while target and target not in names:
        target = target.rpartition(".")[0]
    return target or None


def module_graph() -> dict[str, dict[str, str]]:
    """module -> {module it imports: one import that makes the edge}, every import counted."""
    names = {module_name(p) for p in MODULES}
    edges: dict[str, dict[str, str]] = {}
    for p, line, target in IMPORTS:
        src, dst = module_name(p), module_of(target, names)
        if dst is not None and dst != src:
            edges.setdefault(src, {}).setdefault(dst, f"{where(p, line)} imports {target}")
    return edges


def find_cycle(edges: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle in the graph, as the nodes round it (the first repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = "done"
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_cycle_search_finds_and_names_a_cycle():
    edges = {"a": {"b": "a:1 imports b"}, "b": {"c": "b:2 imports c"}, "c": {"a": "c:3 imports a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": ""}, "b": {}}) is None


def test_modules_import_each_other_without_a_cycle():
    edges = module_graph()
    assert "specchat.models.registry" in edges["specchat.models.loader"]  # the walk resolves relative ones
    cycle = find_cycle(edges)
    if cycle is not None:
        links = [edges[a][b] for a, b in itertools.pairwise(cycle)]
        pytest.fail("import cycle " + " -> ".join(cycle) + ":\n  " + "\n  ".join(links))


def test_no_module_is_over_the_line_limit():
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in MODULES
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split each by responsibility): {long}"
