"""The package's shape: imports flow one way and never in a circle.

Read from the source (every ``import`` statement, function-level ones included), the
modules of ``tvm_armq`` form a directed acyclic graph, and the folders are layers:
``intrinsics/`` (instructions) imports nothing of ``schedules/`` or of the top package,
``schedules/`` (computes and schedules) nothing of the top package, and the first stage,
``tvm_armq/frontend/`` (TFLite in, Relax out), like ``tvm_armq/zoo/`` (the test models),
nothing of the later ones (``tvm_armq/passes/``, ``tvm_armq/device/``, the top package).
No module imports a private name (``_x``) of another, every module opens with a docstring
saying what it does, and no function-level import rebinds one of its function's parameters.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# package name -> folder (setup.cfg's package_dir)
FOLDERS = {"tvm_armq": REPO / "tvm_armq",
           **{f"tvm_armq.{stage}": REPO / "tvm_armq" / stage
              for stage in ("frontend", "passes", "device", "zoo")},
           "tvm_armq.schedules": REPO / "schedules",
           "tvm_armq.intrinsics": REPO / "intrinsics"}
LAYER = {"tvm_armq.intrinsics": 0, "tvm_armq.schedules": 1, "tvm_armq.frontend": 2,
         "tvm_armq.zoo": 2, "tvm_armq": 3, "tvm_armq.passes": 3, "tvm_armq.device": 3}


def _modules() -> dict[str, Path]:
    out = {}
    for package, folder in FOLDERS.items():
        for path in folder.glob("*.py"):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    return module if module in FOLDERS else module.rsplit(".", 1)[0]


def _imports(module: str, path: Path) -> list[tuple[str, str]]:
    """(imported tvm_armq module, imported name or "") of every import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = _package(module).split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    out.append((f"{base}.{alias.name}", ""))
                elif base in MODULES:
                    out.append((base, alias.name))
        elif isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names if alias.name in MODULES]
    return [(m, name) for m, name in out if m != module]


GRAPH = {m: sorted({dep for dep, _ in _imports(m, p)}) for m, p in MODULES.items()}


def test_the_import_graph_is_acyclic():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for dep in GRAPH[m]:
            if state.get(dep) == 1:
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
    assert len(GRAPH) > 30 and sum(map(len, GRAPH.values())) > 50  # the graph was read


def test_imports_flow_from_the_top_package_to_schedules_to_intrinsics():
    up = [f"{m} imports {dep}" for m, deps in GRAPH.items() for dep in deps
          if LAYER[_package(dep)] > LAYER[_package(m)]]
    assert not up, "imports against the layers:\n" + "\n".join(up)


def test_no_module_imports_a_private_name_of_another():
    private = [f"{m} imports {name} from {dep}" for m, p in MODULES.items()
               for dep, name in _imports(m, p) if name.startswith("_")]
    assert not private, "\n".join(private)


def test_every_module_says_what_it_does():
    silent = [m for m, p in MODULES.items() if p.stat().st_size
              and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not silent, f"modules without an opening docstring: {silent}"


def _bound_by_import(func: ast.AST) -> set[str]:
    """Names a function-level ``import`` binds inside ``func`` (nested functions included)."""
    out = set()
    for node in ast.walk(func):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def test_no_function_level_import_hides_a_parameter():
    # ``from .intrinsics import kernels`` inside compile_tflite(..., kernels=...) once
    # replaced the caller's dict by the module on one branch only (bf16).
    hidden = []
    for m, p in MODULES.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
                params |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
                hidden += [f"{m}.{node.name}: {n}" for n in params & _bound_by_import(node)]
    assert not hidden, "a function-level import rebinds a parameter:\n" + "\n".join(hidden)
