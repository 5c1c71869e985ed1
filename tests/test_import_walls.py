"""The walls of docs/architecture.md that the harness change fixed, checked on the import graph (every import
of lm/, top-level or inside a function, read from the source with ast)."""

import ast
from pathlib import Path

LM = Path(__file__).resolve().parent.parent / "lm"


# Module-level import cycles that another branch removes: each named, with the change that removes it.
KNOWN_CYCLES: list = []  # none: a cycle is fixed, not listed


def _all_imports(tree):
    """Every import statement of a module, wherever it sits."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _run_time_imports(tree):
    """The imports that can run: everywhere (module, class and function bodies) but an `if TYPE_CHECKING:` block,
    which holds type hints only."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif _type_checking(node):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))
    return found


def import_graph(imports=_all_imports):
    """{module: modules of lm it imports} (`imports`: which import statements of a module count)."""
    modules = {}
    for path in LM.rglob("*.py"):
        parts = list(path.relative_to(LM.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                    )
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


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycles_among_lm_modules():
    """Modules import each other in one direction. A cycle, even through an import deferred into a function,
    means two modules are one layer split in two files (and a load-time one makes the import order decide which
    names exist). KNOWN_CYCLES is empty."""
    assert cycles(import_graph(_run_time_imports)) == sorted(KNOWN_CYCLES)


def test_the_cycle_check_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse(
        "import lm.x\nif TYPE_CHECKING:\n    import lm.y\ndef f():\n    import lm.z\n"
        "try:\n    import lm.w\nexcept ImportError:\n    pass\n"
    )
    assert sorted(n.names[0].name for n in _run_time_imports(tree)) == ["lm.w", "lm.x", "lm.z"]


def test_model_code_imports_neither_the_config_root_nor_the_layers_above():
    """lm/model is single-device PyTorch: it never imports lm.config (the root that assembles every section),
    lm.core, lm.engine, lm.data or the apps, not even inside a function (docs/architecture.md, the walls)."""
    graph = import_graph()
    above = ("lm.config", "lm.core", "lm.engine", "lm.data", "lm.cli", "lm.glue", "lm.zoo", "lm.sweep", "lm.report")
    breaches = sorted(
        (m, t)
        for m, ts in graph.items()
        if m.startswith("lm.model")
        for t in ts
        if t.startswith(above) and not t.startswith("lm.config_base")
    )
    assert breaches == []


def test_the_engine_never_imports_the_core_or_the_apps():
    graph = import_graph()
    breaches = sorted(
        (m, t)
        for m, ts in graph.items()
        if m.startswith("lm.engine")
        for t in ts
        if t.split(".")[1] in ("core", "cli", "glue", "data")
    )
    assert breaches == []


def test_the_config_root_is_in_no_import_cycle():
    """lm/config.py assembles RunSchema from the sections' config modules; they import the leaf lm/config_base.py."""
    graph = import_graph()
    back = sorted(m for m in reachable(graph, "lm.config") if "lm.config" in reachable(graph, m))
    assert back == []


def test_names_explain_themselves():
    """No one-letter aliases of lm's modules (`dist as D`), and no two unrelated classes share the name Task (the loop's
    TrainTask, GLUE's GlueTaskSpec, lm prepare's SourcePiece)."""
    aliases, tasks = [], []
    for path in LM.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            ours = (
                isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("lm")
                or isinstance(node, ast.Import)
                and any(a.name.startswith("lm.") for a in node.names)
            )
            if ours:  # torch's `functional as F` is the field's idiom; lm's own modules get real names
                aliases += [
                    f"{path.name}: {a.name} as {a.asname}" for a in node.names if a.asname and len(a.asname) == 1
                ]
            if isinstance(node, ast.ClassDef) and node.name == "Task":
                tasks.append(str(path.relative_to(LM.parent)))
    assert aliases == [] and tasks == []
