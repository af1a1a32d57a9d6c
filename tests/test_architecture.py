"""The house's rules, read from the code: imports point down the layers of
docs/design.md and never round a circle; every module says its one concern first, and no
module or function outgrows a reader (500 and 80 lines, 8 parameters); no class declares
what a host class must provide (a mixin's stubs) unless it is an interface."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("storage", "sweep_kernels", "actors", "sweep", "benchmarks")
# Bottom first: a module may import from its own layer or one below, never above.
LAYERS = (
    ("storage", "sweep_kernels"),
    ("actors",),
    # the exit codes, the output's form; the one hook into Triton's autotuner
    ("sweep", "sweep.console", "sweep.numbers", "sweep.autotune.hook"),
    ("sweep.spec",),
    ("sweep.results",),
    ("sweep.search",),
    ("sweep.engines",),
    ("sweep.run",),
    ("sweep.report",),
    ("sweep.api", "sweep.result", "sweep.cli", "sweep.command", "sweep.__main__", "sweep.submit",
     "sweep.best", "sweep.dispatch", "sweep.tuned", "sweep.observers", "sweep.autotune",
     "sweep.capture_cmd", "sweep.exec_cmd"),
    ("benchmarks",),
)
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def layer(name: str) -> int:
    """The layer of the longest prefix of name that LAYERS names."""
    best, rank = "", -1
    for k, names in enumerate(LAYERS):
        for prefix in names:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > len(best):
                best, rank = prefix, k
    assert rank >= 0, f"{name} is on no layer of LAYERS"
    return rank


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules this file imports, at its top or inside a function (a lazy
    import still ties the two)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from pkg import mod` names a module; `from mod import name` its module.
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    edges = {}
    for name, path in known.items():
        edges[name] = {m for m in imports(path, known) if m != name}
    return edges


def test_no_import_runs_up_a_layer():
    up = [f"{a} -> {b}" for a, bs in graph().items() for b in bs if layer(b) > layer(a)]
    assert not up, "imports that run up a layer (see docs/design.md):\n" + "\n".join(up)


def test_no_modules_import_each_other_round_a_circle():
    edges = graph()
    done: set[str] = set()
    circles = []

    def visit(name: str, path: list[str]) -> None:
        path.append(name)
        for other in sorted(edges[name]):
            if other in path:
                circles.append(" -> ".join([*path[path.index(other):], other]))
            elif other not in done:
                visit(other, path)
        path.pop()
        done.add(name)

    for name in sorted(edges):
        if name not in done:
            visit(name, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_every_module_opens_with_its_concern_and_stays_readable():
    problems = []
    for name, path in modules().items():
        text = path.read_text()
        tree = ast.parse(text)
        if not ast.get_docstring(tree):
            problems.append(f"{name}: no opening docstring")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            problems.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{name}.{node.name}: {length} lines")
    assert not problems, "\n".join(problems)


MAX_PARAMETERS = 8  # past that, a signature wants a record


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> int:
    a = node.args
    named = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    if method and named and named[0].arg in ("self", "cls"):
        named = named[1:]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def _is_kernel(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A Triton kernel: its parameters are the kernel's, not a design's."""
    return any("jit" in ast.unparse(d) or "autotune" in ast.unparse(d)
               for d in node.decorator_list)


def test_no_internal_function_takes_more_than_eight_parameters():
    over = []
    for name, path in modules().items():
        for scope, node, method in _functions(ast.parse(path.read_text()), name):
            public_api = name == "sweep.api" and not node.name.startswith("_") and not method
            if public_api or _is_kernel(node):  # the API's keyword options, a kernel's own
                continue
            if _parameters(node, method) > MAX_PARAMETERS:
                over.append(f"{scope}.{node.name}: {_parameters(node, method)} parameters")
    assert not over, "functions past the limit of parameters (gather them in a record):\n" \
        + "\n".join(over)


def _functions(tree: ast.Module, module: str):
    """(scope, function, whether a method) of every function, nested ones too."""
    def walk(node: ast.AST, scope: str, in_class: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield scope, child, in_class
                yield from walk(child, f"{scope}.{child.name}", False)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{scope}.{child.name}", True)
            else:
                yield from walk(child, scope, in_class)
    yield from walk(tree, module, False)


def test_no_method_is_a_stub_outside_a_protocol_or_abstract_class():
    # A stub that raises NotImplementedError declares what a host class must provide: a
    # mixin's way to reach up. An interface says so (Protocol, ABC); a mixin does not.
    stubs = []
    for name, path in modules().items():
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef):
                continue
            kinds = {ast.unparse(b) for b in cls.bases} | \
                {ast.unparse(k.value) for k in cls.keywords if k.arg == "metaclass"}
            if any(k.split(".")[-1] in ("Protocol", "ABC", "ABCMeta") or
                   k.startswith("Protocol[") for k in kinds):
                continue
            for node in cls.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    body = [s for s in node.body if not (isinstance(s, ast.Expr) and
                                                         isinstance(s.value, ast.Constant))]
                    if len(body) == 1 and isinstance(body[0], ast.Raise) and \
                            "NotImplementedError" in ast.unparse(body[0]):
                        stubs.append(f"{name}.{cls.name}.{node.name}")
    assert not stubs, "method stubs outside a Protocol or ABC:\n" + "\n".join(stubs)
