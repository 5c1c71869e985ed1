"""The walls of docs/architecture.md that the harness change fixed, checked on the import graph (every import
of lm/, top-level or inside a function, read from the source with ast)."""

import ast
from pathlib import Path

LM = Path(__file__).resolve().parent.parent / "lm"


def import_graph():
    """{module: modules of lm it imports}."""
    modules = {}
    for path in LM.rglob("*.py"):
        parts = list(path.relative_to(LM.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for n in names:
                while n and n not in modules:
                    n = n.rpartition(".")[0]
                if n and n != name:
                    targets.add(n)
        graph[name] = targets
    return graph


def reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for n in graph[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return seen


def test_the_engine_never_imports_the_core_or_the_apps():
    graph = import_graph()
    breaches = sorted((m, t) for m, ts in graph.items() if m.startswith("lm.engine") for t in ts
                      if t.split(".")[1] in ("core", "cli", "glue", "data"))
    assert breaches == []


def test_the_config_root_is_in_no_import_cycle():
    """lm/config.py assembles RunSchema from the sections' config modules; they import the leaf lm/config_base.py."""
    graph = import_graph()
    back = sorted(m for m in reachable(graph, "lm.config") if "lm.config" in reachable(graph, m))
    assert back == []


def test_names_explain_themselves():
    """No one-letter aliases of lm's modules (`dist as D`), and no two unrelated classes share the name Task (the loop's
    TrainTask, GLUE's GlueTaskSpec, lm-prepare's SourcePiece)."""
    aliases, tasks = [], []
    for path in LM.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            ours = isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lm") or \
                isinstance(node, ast.Import) and any(a.name.startswith("lm.") for a in node.names)
            if ours:  # torch's `functional as F` is the field's idiom; lm's own modules get real names
                aliases += [f"{path.name}: {a.name} as {a.asname}" for a in node.names if a.asname and len(a.asname) == 1]
            if isinstance(node, ast.ClassDef) and node.name == "Task":
                tasks.append(str(path.relative_to(LM.parent)))
    assert aliases == [] and tasks == []
