"""benchmarks/<name>.py as a module, for tests of the benchmark scripts (benchmarks/ is not a package), and the lm
names a script uses, for the test that catches a script left behind by a rename in lm (tests/test_bench_scripts.py)."""

import ast
import dataclasses
import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lm_references(source: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every lm name `source` uses: `from lm.x import y` and `import lm.x` anywhere (in
    functions too, where most scripts import), and the attribute chains read off such a name (lm.x.f, y.attr),
    each in the scope its import binds (a function's own `from tokenizers import Tokenizer` hides lm's)."""
    found: list[tuple[int, str]] = []

    def bind(node: ast.AST, names: dict[str, str | None]) -> None:
        if isinstance(node, ast.ImportFrom):
            lm = node.level == 0 and node.module is not None and node.module.split(".")[0] == "lm"
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}" if lm else None
                if lm:
                    found.append((node.lineno, f"{node.module}.{a.name}"))
        elif isinstance(node, ast.Import):
            for a in node.names:
                lm = a.name.split(".")[0] == "lm"
                names[a.asname or a.name.split(".")[0]] = (a.name if a.asname else "lm") if lm else None
                if lm:
                    found.append((node.lineno, a.name))

    def scan(body: list[ast.stmt], outer: dict[str, str | None]) -> None:
        names = dict(outer)
        for node in (n for stmt in body for n in walk_scope(stmt)):  # this scope's imports, then its reads
            bind(node, names)
        for stmt in body:
            for node in walk_scope(stmt):
                if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
                    chain, base = [], node
                    while isinstance(base, ast.Attribute):
                        chain.append(base.attr)
                        base = base.value
                    if isinstance(base, ast.Name) and names.get(base.id):
                        found.append((node.lineno, ".".join([names[base.id], *reversed(chain)])))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    scan(node.body, names)

    scan(ast.parse(source).body, {})
    # a chain a.b.c is read as a.b too: keep the longest of each
    return sorted({(line, d) for line, d in found if not any(o.startswith(d + ".") for _, o in found)})


def walk_scope(node: ast.AST):
    """ast.walk that stops at a nested function or class (yielding it, not its body)."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) and hasattr(node, "body"):
        if isinstance(node, ast.Lambda):
            yield from walk_scope(node.body)
        return
    for child in ast.iter_child_nodes(node):
        yield from walk_scope(child)


def unresolved(dotted: str) -> str | None:
    """None when the dotted lm name exists today (a module, or attributes of one; a dataclass field counts), else
    which part is missing."""
    parts = dotted.split(".")
    obj: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, ModuleType) and hasattr(obj, "__path__") and _is_module(".".join(parts[: i + 1])):
            obj = importlib.import_module(".".join(parts[: i + 1]))
        elif dataclasses.is_dataclass(obj) and part in {f.name for f in dataclasses.fields(obj)}:
            return None  # an instance's field: what it holds is not known here
        else:
            return f"{'.'.join(parts[:i])} has no {part}"
    return None


def _is_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None
