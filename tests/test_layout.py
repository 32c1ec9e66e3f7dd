"""The package's shape: layers import downward only, no import cycle, fixtures stay out of production code.

Reads the source with ``ast`` (nothing is imported), so a violation names the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "localflash"

# Each top-level part of the package and its layer: a part may import only parts of a lower layer
# (and itself). cli/ and serve/ sit on the public API; testing/ (fixtures) may use anything.
LAYERS = [
    ("archs", "errors"),
    ("llama", "prompt"),
    ("formats",),
    ("hub",),  # models by name: below plan/ (remote headers) and registry/ (hf: paths)
    ("speculative", "plan"),
    ("registry", "phases"),
    ("config", "session"),
    ("engine",),
    ("api", "train"),
    ("bench",),
    ("serve",),
    ("cli",),
    ("testing",),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}
# what cli/ and serve/ may import: the public API and the parts below the engine that have no state
PUBLIC = {"api", "errors", "config", "archs", "registry", "plan", "hub", "bench", "prompt", "train", "formats", "cli", "serve", "__init__"}
MAX_LINES = 500
MAX_TOP_LEVEL = 10


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def root_exports() -> dict[str, str]:
    """What ``from localflash import NAME`` (or ``localflash.NAME``) really imports: NAME -> the module behind it.

    The root re-exports lazily (``_API`` in ``localflash/__init__.py``, read by its ``__getattr__``) and may import
    names itself; both are read from the source. ``__version__`` and the like live in the root itself.
    """
    out = {}
    for node in ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_API" for t in node.targets):
            out |= {name: f"localflash.{mod}" for name, mod in ast.literal_eval(node.value).items()}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("localflash"):
            out |= {(a.asname or a.name): node.module for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id: "localflash" for t in targets if isinstance(t, ast.Name)}
    return out


def imports(path: Path, mods: dict[str, Path]) -> list[tuple[str, int]]:
    """(module imported, line) for every localflash import in ``path``, lazy ones included.

    A name taken from the package root (``from localflash import LLM``, or ``localflash.LLM`` after ``import
    localflash``) counts as an import of the module the root re-exports it from; a root name that is neither a
    submodule nor a known re-export is reported as ``localflash.?NAME`` (no layer: the guard fails on it).
    """
    found = []
    root = root_exports()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("localflash"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in mods:
                    found.append((sub, node.lineno))
                elif node.module == "localflash":
                    found.append((root.get(a.name, f"localflash.?{a.name}"), node.lineno))
                else:
                    found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("localflash")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "localflash"
              and f"localflash.{node.attr}" not in mods and node.attr in root):
            found.append((root[node.attr], node.lineno))
    return found


def part(module: str) -> str:
    bits = module.split(".")
    return bits[1] if len(bits) > 1 else "__init__"


def test_no_relative_imports_so_the_graph_below_is_complete():
    bad = [f"{p}:{n.lineno}" for p in PACKAGE.rglob("*.py")
           for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))) if isinstance(n, ast.ImportFrom) and n.level]
    assert not bad, f"relative imports (use absolute ones): {bad}"


def test_every_part_has_a_layer():
    assert {part(m) for m in modules()} - {"__init__"} <= set(LAYER)


def test_layers_import_downward_only():
    mods = modules()
    bad = []
    for mod, path in mods.items():
        src = part(mod)
        if src == "__init__":
            continue
        for target, line in imports(path, mods):
            dst = part(target)
            if dst.startswith("?"):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {src} imports {dst[1:]} from the package root, which neither "
                           "has such a submodule nor re-exports it")
                continue
            if dst in (src, "__init__"):  # its own part, or a name living in the root itself (__version__)
                continue
            if LAYER.get(dst, -1) >= LAYER[src]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {src} (layer {LAYER[src]}) imports {target} (layer {LAYER.get(dst)})")
    assert not bad, "\n".join(bad)


def test_root_re_exports_count_as_imports_of_their_real_modules(tmp_path):
    """``from localflash import LLM`` in a low layer reaches the API layer: the guard must see localflash.api, not the root."""
    mods = modules()
    assert root_exports()["LLM"] == "localflash.api" and root_exports()["Completion"] == "localflash.session"
    low = tmp_path / "low.py"
    low.write_text("import localflash\nfrom localflash import LLM, __version__\n\ndef f():\n    return localflash.load\n")
    assert imports(low, mods) == [("localflash", 1), ("localflash.api", 2), ("localflash", 2), ("localflash.api", 5)]


def test_cli_and_serve_use_only_the_public_api():
    mods = modules()
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target}"
           for mod, path in mods.items() if part(mod) in ("cli", "serve")
           for target, line in imports(path, mods) if part(target) not in PUBLIC]
    assert not bad, "\n".join(bad)


def test_no_production_module_imports_the_test_fixtures():
    mods = modules()
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {target}"
           for mod, path in mods.items() if part(mod) != "testing"
           for target, line in imports(path, mods) if part(target) == "testing"]
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    mods = modules()
    graph = {m: {t for t, _ in imports(p, mods) if t in mods and t != m} for m, p in mods.items()}
    # a package's __init__ re-exporting its own submodules is not a cycle of the design
    for m in graph:
        graph[m] = {t for t in graph[m] if not (t.startswith(m + ".") or m.startswith(t + "."))}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_only_llama_imports_llama_cpp_and_only_train_imports_torch():
    bad = []
    for p in PACKAGE.rglob("*.py"):
        rel = p.relative_to(PACKAGE)
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""] if isinstance(n, ast.ImportFrom) else []
            for name in names:
                root = name.split(".")[0]
                if root == "llama_cpp" and rel.parts[0] != "llama":
                    bad.append(f"{rel}:{n.lineno}: llama_cpp")
                if root == "torch" and rel.parts[0] != "train":
                    bad.append(f"{rel}:{n.lineno}: torch")
    assert not bad, bad


def test_the_top_level_shows_the_layers():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    assert not list(PACKAGE.rglob("utils.py"))


def test_no_module_is_past_the_size_guide():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def test_benchmarks_run_without_sys_path_edits():
    root = PACKAGE.parent / "benchmarks"
    bad = [str(p.relative_to(root)) for p in root.rglob("*.py") if "sys.path.insert" in p.read_text(encoding="utf-8")]
    assert not bad, bad
