"""The package layout the READMEs promise: imports between top-level packages go one way, the
trainer's sides do not reach back into the loop, and answer extraction has one home."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"sglang_kvc": ROOT / "sglang-kvc" / "sglang_kvc", "checkpoint_tools": ROOT / "checkpoint_tools",
            "dataset": ROOT / "dataset", "evaluation": ROOT / "evaluation", "trainer": ROOT / "trainer",
            "recipes": ROOT / "recipes"}
# README "Architecture": what each package may import of the others
ALLOWED = {"sglang_kvc": set(), "checkpoint_tools": set(), "dataset": set(),
           "evaluation": {"dataset"},
           "trainer": {"sglang_kvc", "checkpoint_tools", "evaluation", "dataset"},
           "recipes": {"sglang_kvc", "checkpoint_tools", "evaluation", "dataset", "trainer"}}


def _imports(path: Path, package: str) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved against ``package``)."""
    rel = path.relative_to(PACKAGES[package]).with_suffix("")
    here = [package, *rel.parts[:-1]]  # the package a relative import starts from
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            names.add(".".join([*base, node.module] if node.module else base))
    return names


def _modules(package: str):
    return sorted(PACKAGES[package].rglob("*.py"))


def test_packages_import_one_way():
    for package, allowed in ALLOWED.items():
        for path in _modules(package):
            for name in _imports(path, package):
                top = name.split(".")[0]
                if top in PACKAGES and top != package:
                    assert top in allowed, f"{path.relative_to(ROOT)} imports {name}"


def test_trainer_sides_do_not_import_the_loop():
    loop = {"trainer.train", "trainer.arguments", "trainer.quickstart"}
    for side in ("rollout", "learner", "algorithms"):
        for path in (PACKAGES["trainer"] / side).rglob("*.py"):
            hits = {n for n in _imports(path, "trainer") if n in loop}
            assert not hits, f"{path.relative_to(ROOT)} imports {hits}"
    for path in (PACKAGES["trainer"] / "algorithms").rglob("*.py"):
        bad = {n for n in _imports(path, "trainer") if n.startswith(("megatron", "trainer.learner",
                                                                     "trainer.rollout"))}
        assert not bad, f"{path.relative_to(ROOT)}: algorithms are pure tensor maths, imports {bad}"


def test_trainer_top_level_stays_small():
    top = [p.name for p in PACKAGES["trainer"].glob("*.py")]
    assert len(top) <= 8, top


def test_one_home_for_answer_extraction():
    """``last_boxed``/``match_brace``/countdown checks are defined only in evaluation.grader."""
    defined: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in _modules(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and ("boxed" in node.name or "countdown" in
                                                          node.name or node.name == "match_brace"):
                    if not node.name.endswith(("_question", "_task")):  # generators, not checkers
                        defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    for name, where in defined.items():
        assert all(w.startswith("evaluation/grader/") for w in where), (name, where)
    assert {"last_boxed", "final_boxed", "match_brace", "check_countdown", "score_countdown"} <= set(defined)


# --------------------------------------------------------------------------- import graph

def _module_name(package: str, path: Path) -> str:
    parts = path.relative_to(PACKAGES[package]).with_suffix("").parts
    return ".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def _import_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` -> the package's modules it imports, wherever the import
    stands (a function-local import closes a cycle as surely as a top-level one, only later)."""
    files = {_module_name(package, p): p for p in _modules(package)}
    return {name: _imported_modules(name, path, set(files)) - {name}
            for name, path in files.items()}


def _imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(_known(a.name, modules) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*here[: len(here) - node.level + 1], *filter(None, [node.module])]) \
                if node.level else node.module
            # ``from pkg import mod`` imports the submodule; ``from mod import name``, the module
            for a in node.names:
                full = f"{base}.{a.name}"
                out.add(_known(full if full in modules else base, modules))
    return out - {None}


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (None: outside the package)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, then "done"

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt, path + [nxt])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_cycle_finder_sees_function_local_imports():
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}
    assert _find_cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
    assert _find_cycle({"p.a": {"p.b"}, "p.b": set()}) is None
    assert "trainer.train" in _import_graph("trainer")["trainer.ray.trainer_actor"]  # local import


def test_train_imports_nothing_from_ray():
    """The loop does not reach up into its Ray launcher; the launcher hands it what it needs."""
    ray = {m for m in _import_graph("trainer")["trainer.train"]
           if m.split(".")[:2] == ["trainer", "ray"]}
    assert not ray, f"trainer/train.py imports {sorted(ray)}"


def test_the_loop_gets_its_rollouts_from_the_assembly():
    """``train.py``, its configuration and its command reach the engines only through the
    rollout side: nothing under ``rollout/engines/`` is imported by them."""
    graph = _import_graph("trainer")
    for module in ("trainer.train", "trainer.run_config", "trainer.startup.cli"):
        engines = {m for m in graph[module] if m.startswith("trainer.rollout.engines")}
        assert not engines, f"{module} imports {sorted(engines)}"


# the loop's two doors (docs/doors.md): train.py reaches each side through its door alone
DOORS = {"trainer.rollout.side", "trainer.learner.learner"}
MAX_LOOP_IMPORTS = 10


def _behind_the_doors(names: set[str]) -> set[str]:
    """The modules of ``names`` that sit behind a side's door (its internals)."""
    return {n for n in names
            if n.startswith(("trainer.rollout", "trainer.learner", "trainer.algorithms"))
            and n not in DOORS}


def test_train_reads_as_the_algorithm():
    """``trainer/train.py`` imports at most 10 project modules, and of the rollout and learner
    sides only their doors: the loop does no joining work of its own."""
    names = {n for n in _imports(PACKAGES["trainer"] / "train.py", "trainer")
             if n.split(".")[0] in PACKAGES}
    assert len(names) <= MAX_LOOP_IMPORTS, sorted(names)
    assert not _behind_the_doors(names), f"trainer/train.py imports {sorted(_behind_the_doors(names))}"
    assert DOORS <= names  # the loop does go through both doors


def test_door_check_sees_an_internal():
    assert _behind_the_doors({"trainer.rollout.side", "trainer.learner.learner", "trainer.launch"}) == set()
    assert _behind_the_doors({"trainer.learner.grpo_update", "trainer.rollout.learner_batch",
                              "trainer.algorithms.adaptive_budget"}) == {
        "trainer.learner.grpo_update", "trainer.rollout.learner_batch",
        "trainer.algorithms.adaptive_budget"}


@pytest.mark.parametrize("package", ["trainer", "sglang_kvc"])
def test_no_import_cycles(package):
    cycle = _find_cycle(_import_graph(package))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# --------------------------------------------------------------------------- the engine's public API

def _engine_submodule_imports(path: Path) -> list[str]:
    """``sglang_kvc.<submodule>`` imports anywhere in ``path`` (function-local ones too):
    ``import sglang_kvc.x``, ``from sglang_kvc.x import y`` and ``from sglang_kvc import x``
    where x is a submodule rather than a public name."""
    submodules = {p.stem if p.suffix else p.name for p in PACKAGES["sglang_kvc"].iterdir()
                  if p.suffix == ".py" or (p / "__init__.py").exists()} - {"__init__"}
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            hits += [a.name for a in node.names if a.name.startswith("sglang_kvc.")]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.startswith("sglang_kvc."):
                hits.append(node.module)
            elif node.module == "sglang_kvc":
                hits += [f"sglang_kvc.{a.name}" for a in node.names if a.name in submodules]
    return hits


def test_trainer_uses_only_the_engines_public_api():
    """The trainer imports ``sglang_kvc`` through its top level (``sglang_kvc/__init__.py``)."""
    for path in _modules("trainer"):
        hits = _engine_submodule_imports(path)
        assert not hits, f"{path.relative_to(ROOT)} imports {hits}: use sglang_kvc's public API"


def test_public_api_check_sees_local_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import sglang_kvc\nfrom sglang_kvc import Engine\n"
                   "def f():\n    from sglang_kvc.engine import engine\n    from sglang_kvc import weights\n")
    assert _engine_submodule_imports(src) == ["sglang_kvc.engine", "sglang_kvc.weights"]


def test_public_api_names_resolve():
    import sglang_kvc

    for name in sglang_kvc.__all__:
        assert getattr(sglang_kvc, name) is not None, name


def test_importing_sglang_kvc_is_cheap():
    """The CPU-only trainer paths import it for flags: names load on first use, torch with them."""
    code = "import sys, sglang_kvc; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_decode_graphs_get_their_parts_not_the_runner():
    """``DecodeGraphs`` is handed a ``GraphParts`` (model_runner builds it): nothing in
    cuda_graph.py names the runner, so what a captured step touches is listed in one place."""
    tree = ast.parse((PACKAGES["sglang_kvc"] / "engine" / "cuda_graph.py").read_text())
    names = set()
    for n in ast.walk(tree):
        names.update([n.attr] if isinstance(n, ast.Attribute) else [n.id] if isinstance(n, ast.Name)
                     else [n.arg] if isinstance(n, ast.arg) else [])
    assert "runner" not in names


# --------------------------------------------------------------------------- the engines: one door

ROLLOUT = PACKAGES["trainer"] / "rollout"
ENGINES = ROLLOUT / "engines"
# the flags' fields that say where engines run, the objects that stand for them
TOPOLOGY = {"server_urls", "engine_urls", "engine_process", "num_gpus", "per_gpu", "remote"}
ENGINE_OBJECTS = {"engine", "engines", "backend", "fleet"}
ENGINE_CLASSES = {"EngineRollout", "HTTPRollout", "NoEngines", "EngineFleet"}


def _leaf(node) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) \
        else None


def _placement_branches(path: Path) -> list[str]:
    """Where ``path`` decides by the engines' topology: a condition (if, while, conditional
    expression) that names a topology field, compares an engine object with None or asks
    ``isinstance`` of an engine class."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.If, ast.IfExp, ast.While)):
            continue
        for sub in ast.walk(node.test):
            if _leaf(sub) in TOPOLOGY:
                hits.append(f"{path.name}:{node.lineno} names {_leaf(sub)}")
            elif isinstance(sub, ast.Compare) and _leaf(sub.left) in ENGINE_OBJECTS and any(
                    isinstance(op, (ast.Is, ast.IsNot)) for op in sub.ops):
                hits.append(f"{path.name}:{node.lineno} compares {_leaf(sub.left)} with None")
            elif isinstance(sub, ast.Call) and _leaf(sub.func) == "isinstance" and \
                    {_leaf(n) for n in ast.walk(sub.args[1])} & ENGINE_CLASSES:
                hits.append(f"{path.name}:{node.lineno} isinstance of an engine class")
    return hits


def _outside_engines() -> list[Path]:
    """The loop and the rollout side's modules that are not the engines package."""
    return [PACKAGES["trainer"] / "train.py",
            *(p for p in ROLLOUT.rglob("*.py") if not p.is_relative_to(ENGINES))]


def test_topology_is_decided_only_in_the_engines_package():
    """train.py, the manager, the rollout sources and the samples never branch on where the
    engines run: they hold an ``Engines`` (rollout/engines/factory.py decides which)."""
    hits = [h for path in _outside_engines() for h in _placement_branches(path)]
    assert not hits, hits


def test_placement_branch_finder_sees_each_kind(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("if self.engine is None:\n    pass\nx = 1 if cfg.remote else 2\n"
                   "while isinstance(b, HTTPRollout):\n    pass\n"
                   "if self.rewards is None:\n    pass\n")
    assert sorted(h.split(" ", 1)[1] for h in _placement_branches(src)) == [
        "compares engine with None", "isinstance of an engine class", "names remote"]


def test_only_the_engines_package_talks_to_sglang_kvc():
    """In trainer/rollout/ only engines/ imports ``sglang_kvc``; engines/ imports nothing of
    the rest of rollout/ (samples and the loop side sit above it)."""
    for path in (p for p in ROLLOUT.rglob("*.py")):
        names = _imports(path, "trainer")
        if path.is_relative_to(ENGINES):
            up = {n for n in names if n.startswith("trainer.rollout.")
                  and not n.startswith("trainer.rollout.engines")}
            assert not up, f"{path.relative_to(ROOT)} imports {up}"
        else:
            engine = {n for n in names if n.split(".")[0] == "sglang_kvc"}
            assert not engine, f"{path.relative_to(ROOT)} imports {engine}: go through Engines"


def test_one_health_wait_one_parent_death_guard():
    """Polling ``/health`` and ``PR_SET_PDEATHSIG`` are written once (engines/lifecycle.py),
    for the engine processes, the Ray engine actors and the router alike; the weight
    transports reach engines through the Engines interface, not their failover slots."""
    polls, guards = set(), set()
    for path in _modules("trainer"):
        tree = ast.parse(path.read_text())
        for loop in (n for n in ast.walk(tree) if isinstance(n, ast.While)):
            if any(isinstance(c, ast.Call) and _leaf(c.func) == "healthy" for c in ast.walk(loop)):
                polls.add(path.relative_to(ROOT).as_posix())
        if "prctl" in {_leaf(n) for n in ast.walk(tree)}:
            guards.add(path.relative_to(ROOT).as_posix())
    assert polls == guards == {"trainer/rollout/engines/lifecycle.py"}, (polls, guards)
    for name in ("weight_sync.py", "transports.py"):
        tree = ast.parse((ENGINES / name).read_text())
        slots = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                 and n.attr == "urls" and _leaf(n.value) == "engines"]
        assert not slots, f"{name}:{slots} reads the failover slots (engines.urls)"


def test_tests_wait_for_a_server_through_one_fixture():
    """A test waits for a server's ``/health`` through conftest's ``wait_healthy`` (the trainer's
    one health wait), not through a polling loop of its own."""
    loops = []
    for path in (p for p in (ROOT / "tests").rglob("*.py") if p != Path(__file__)):
        tree = ast.parse(path.read_text())
        for loop in (n for n in ast.walk(tree) if isinstance(n, (ast.While, ast.For))):
            if any(isinstance(c, ast.Constant) and isinstance(c.value, str) and
                   c.value.endswith("/health") for c in ast.walk(loop)):
                loops.append(f"{path.relative_to(ROOT)}:{loop.lineno}")
    assert not loops, loops


def test_runtime_helpers_are_written_once():
    """``default_device``, ``free_port`` and ``teardown`` are defined once, low enough for the
    trainer and the converters both (``checkpoint_tools/runtime.py``; ``trainer/launch.py`` and
    ``cpu_megatron.py`` hand them on); no trainer module takes them from ``cpu_megatron`` (the
    CPU stand-ins of Megatron, which a GPU run has no use for)."""
    helpers, defined = {"default_device", "free_port", "teardown"}, set()
    for package in ("trainer", "checkpoint_tools"):
        for path in _modules(package):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and node.name in helpers:
                    defined.add((node.name, path.relative_to(ROOT).as_posix()))
    assert defined == {(h, "checkpoint_tools/runtime.py") for h in helpers}, defined
    for path in _modules("trainer"):
        for node in ast.walk(ast.parse(path.read_text())):
            from_stand_ins = isinstance(node, ast.ImportFrom) and (node.module or "").endswith(
                "cpu_megatron") and {a.name for a in node.names} & helpers
            attribute = isinstance(node, ast.Attribute) and node.attr in helpers and \
                _leaf(node.value) == "cpu_megatron"
            assert not (from_stand_ins or attribute), f"{path.relative_to(ROOT)}:{node.lineno}"


# benchmarks that time engine internals on their own; each says which in its docstring
COMPONENT_BENCHMARKS = {"engine/compaction.py", "engine/decode_attention.py", "engine/sampler.py",
                        "engine/decode_tail.py", "engine/fp8_quality.py", "engine/prefill_sdpa.py",
                        "engine/prefill_host.py"}
BENCHMARKS = ROOT / "benchmarks"
BENCHMARK_GROUPS = {"engine", "training", "studies", "grid", "plots", "common"}


def test_benchmarks_drive_the_engine_through_its_public_names():
    """A benchmark of the whole engine imports only ``sglang_kvc``'s public names; a component
    micro-benchmark (listed above) names the internals it times ('Internals timed')."""
    for path in sorted(BENCHMARKS.rglob("*.py")):
        name = path.relative_to(BENCHMARKS).as_posix()
        hits = _engine_submodule_imports(path)
        if name in COMPONENT_BENCHMARKS:
            assert "Internals timed" in (ast.get_docstring(ast.parse(path.read_text())) or ""), \
                f"{name}: say which internals it times"
        else:
            assert not hits, f"benchmarks/{name} imports {hits}: use sglang_kvc's public API"
    assert all((BENCHMARKS / name).is_file() for name in COMPONENT_BENCHMARKS)


def _edits_sys_path(path: Path) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "path" and _leaf(n.value) == "sys"
               for n in ast.walk(ast.parse(path.read_text())))


def test_benchmarks_are_a_package_grouped_by_kind():
    """Every benchmark sits in one group's package and runs as ``python -m
    benchmarks.<group>.<name>``: none reaches another through ``sys.path``."""
    for path in sorted(BENCHMARKS.rglob("*.py")):
        rel = path.relative_to(BENCHMARKS)
        assert rel.parts[0] in BENCHMARK_GROUPS or rel.as_posix() == "__init__.py", rel
        assert not _edits_sys_path(path), f"benchmarks/{rel} edits sys.path"
    assert all((BENCHMARKS / group / "__init__.py").is_file() for group in BENCHMARK_GROUPS)


def test_sys_path_check_sees_an_edit(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import sys\ndef f():\n    sys.path.insert(0, 'x')\n")
    assert _edits_sys_path(src)
    src.write_text('"""sys.path is not edited here."""\nimport os\nos.path.join("a")\n')
    assert not _edits_sys_path(src)


def _benchmark_imports(path: Path) -> set[str]:
    """The benchmark modules ``path`` imports (function-local imports too), as dotted names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
            subs = {f"{node.module}.{a.name}" for a in node.names}
            names |= {s for s in subs if (ROOT / (s.replace(".", "/") + ".py")).is_file()} or {node.module}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("benchmarks.")}
    return names


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (module -> modules it imports), or [] when there is none."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def test_benchmarks_import_without_a_circle():
    """The grid's CLI, report and waves read runs from one module (grid/runs.py) instead of
    importing each other."""
    graph = {".".join(p.relative_to(ROOT).with_suffix("").parts): _benchmark_imports(p)
             for p in BENCHMARKS.rglob("*.py")}
    assert _circle(graph) == []
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


def test_no_two_benchmark_groups_import_each_other():
    """Issue 65: the groups (common, engine, training, studies, grid, plots) form a one-way graph:
    what two groups share lives in common/ (the grid once imported studies' layouts and run
    folders while studies imported the grid's runs)."""
    group_of = lambda module: module.split(".")[1]  # noqa: E731
    groups: dict[str, set[str]] = {}
    for path in BENCHMARKS.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module.count(".") >= 2:
            groups.setdefault(group_of(module), set()).update(
                group_of(m) for m in _benchmark_imports(path) if m.count(".") >= 1)
    pairs = sorted({tuple(sorted((a, b))) for a, seen in groups.items() for b in seen
                    if b != a and a in groups.get(b, ())})
    assert pairs == [], f"benchmark groups importing each other: {pairs}"
    assert _circle({g: seen - {g} for g, seen in groups.items()}) == []


def test_one_build_checkpoint_in_the_benchmarks():
    defined = [p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*.py")
               for node in ast.walk(ast.parse(p.read_text()))
               if isinstance(node, ast.FunctionDef) and node.name == "build_checkpoint"]
    assert defined == ["common/checkpoint.py"], defined
