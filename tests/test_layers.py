"""The package's layers run one way (docs/architecture.md): every import inside reinforge/ (at
module level or inside a function alike) points down the table or within its own package, no two
modules import each other through any chain, and no module grows past the size one person holds
in their head."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "reinforge"

# Bottom to top: a unit may import its own package and the units of lower layers only.
LAYERS: list[tuple[str, ...]] = [
    ("sandbox", "batch", "algorithms", "recipes", "precision"),  # pure mechanisms
    ("config",),                                                  # typed config sections, loading
    ("models", "tasks", "tracking"),                              # model loading, examples, the run directory
    ("rollout", "learner", "curriculum", "rewards"),              # the step's components
    ("experience",),                                              # what one step trains on
    ("agents",),                                                  # multi-turn environments, tools, the agent loop
    ("evaluation", "scale"),                                      # held-out statistics, Ray rollout workers
    ("lifecycle",),                                               # a run's life: checkpoint, resume, stop, summary
    ("sft", "reward_models"),                                     # stages before or beside RL
    ("trainer",),                                                 # the RL controller loop
    ("cli",),                                                     # the command line
    ("",),                                                        # reinforge/__init__.py: the public face
]
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}

# Files that must stay whole, with the reason (a module over MAX_LINES needs an entry here).
MAX_LINES = 540
WHOLE = {
    "sandbox/launcher.py": "sent as one stdlib-only program to a fresh interpreter; read top to bottom in review",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(imported reinforge module, line) for every import in the file, resolved to the module
    it loads: ``from pkg import sub`` is ``pkg.sub`` when that is a module, else ``pkg``."""
    out = []
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_pkg else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join(here + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            if t == "reinforge" or t.startswith("reinforge."):
                while t not in MODULES:
                    t = t.rsplit(".", 1)[0]
                out.append((t, node.lineno))
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_unit_has_a_layer():
    assert {_unit(m) for m in MODULES} <= set(LAYER_OF), "add the new package or module to LAYERS"


def test_no_import_points_up_a_layer():
    upward = []
    for module, imports in GRAPH.items():
        for target, line in imports:
            src, dst = _unit(module), _unit(target)
            if src != dst and LAYER_OF[dst] >= LAYER_OF[src]:
                upward.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target} "
                              f"(layer {LAYER_OF[src]} -> {LAYER_OF[dst]})")
    assert not upward, "imports that point up or sideways:\n" + "\n".join(upward)


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in GRAPH[v]:
            if w == v:
                continue
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
                found.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert not _cycles(), "modules importing each other (through any chain, lazy imports included)"


def test_no_module_is_past_the_size_one_person_holds():
    big = {str(p.relative_to(PACKAGE)): n for p in MODULES.values()
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert set(big) <= set(WHOLE), f"modules over {MAX_LINES} lines: {big}"


@pytest.mark.parametrize("bad", ["upward", "cycle"])
def test_the_checks_catch_what_they_guard(bad, monkeypatch):
    """The rules fail on a planted violation (so a passing run means something)."""
    graph = {k: list(v) for k, v in GRAPH.items()}
    if bad == "upward":
        graph["reinforge.batch"].append(("reinforge.trainer.trainer", 1))
        monkeypatch.setattr(sys.modules[__name__], "GRAPH", graph)
        with pytest.raises(AssertionError, match="reinforge.trainer.trainer"):
            test_no_import_points_up_a_layer()
    else:
        graph["reinforge.tracking.io"].append(("reinforge.tracking.run_dir", 1))
        monkeypatch.setattr(sys.modules[__name__], "GRAPH", graph)
        assert any("reinforge.tracking.io" in c for c in _cycles())


def test_the_cli_and_the_public_face_load_no_torch():
    """The CLI installs its signal handlers before anything heavy loads, and ``import reinforge``
    stays cheap: its names load on first use."""
    import subprocess

    code = ("import sys, reinforge, reinforge.cli; "
            "assert 'torch' not in sys.modules, 'torch loaded'; "
            "reinforge.RunConfig; assert 'reinforge.config' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
