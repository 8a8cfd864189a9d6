"""One default per flag (issue 65, item 5): the test walks ``python -m trainer.train``'s flags
and, for each, counts where a default VALUE is written: the flag's ``add_argument(default=...)``
and the fields of the same name of the config dataclasses in ``trainer/`` that hold a literal.
A flag that reads its default from the config (``default=_LOSS.eps_clip``), or a config field
without a default of its own, declares it once. A field that says "unset" (None, or False for an
on/off flag) declares nothing, unless the flag's own default is something else.

``max_tokens_per_gpu`` was None in the flags and 8192 in ``TrainConfig``: the run meant "sized
from free memory", the config another value. ``--max-turns``' 4 was written three times
(``rollout/multiturn/flags.py`` twice, ``loop.py``).

A flag's default lives in the config it fills, and the flag reads it from there
(``learner/settings.py``, ``algorithms/settings.py``: no torch, so ``--help`` stays fast); where
the config's module cannot be read by the flags, the flag declares it and the config field has
no default (``RolloutPlan.reward_bias``). Any flag declared twice fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

from trainer.arguments import build_parser

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "trainer"
# files of other commands, with parsers of their own that share some dests (--seed, --lr)
OTHER_TOOLS = {"warmup.py", "quickstart.py", "startup/preflight.py", "startup/torchrun.py"}


def _literal(node: ast.expr | None):
    """(True, value) for a literal default, (False, None) for an expression that refers to one."""
    if node is None:
        return True, None
    try:
        return True, ast.literal_eval(node)
    except ValueError:
        return False, None


def _files():
    for path in sorted(TRAINER.rglob("*.py")):
        if str(path.relative_to(TRAINER)) not in OTHER_TOOLS:
            yield path, ast.parse(path.read_text())


def flag_defaults() -> dict[str, tuple[bool, object, str]]:
    """dest -> (literal?, value, where) of every ``add_argument("--x", ...)`` in trainer/."""
    found = {}
    for path, tree in _files():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and str(node.args[0].value).startswith("--")):
                kw = {k.arg: k.value for k in node.keywords}
                dest = kw["dest"].value if "dest" in kw else node.args[0].value[2:].replace("-", "_")
                literal, value = _literal(kw.get("default"))
                if ast.unparse(kw.get("action", ast.Constant(None))) in ("'store_true'",):
                    literal, value = True, False
                found[dest] = (literal, value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def config_defaults() -> dict[str, list[tuple[object, str]]]:
    """field name -> [(literal value, where)] of the dataclass fields in trainer/ with one."""
    found: dict[str, list] = {}
    for path, tree in _files():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            if not any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
                continue
            for st in cls.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value:
                    literal, value = _literal(st.value)
                    if literal:
                        where = f"{path.relative_to(ROOT)}:{st.lineno} {cls.name}"
                        found.setdefault(st.target.id, []).append((value, where))
    return found


def _unset(value) -> bool:
    return value is None or value is False


def declarations(dest: str, flags, configs) -> list[str]:
    """Where ``dest``'s default is written (more than one: declared twice). The flag's None
    counts as soon as a config writes a value under it (the run means "automatic", the config
    something else: max_tokens_per_gpu's 8192)."""
    literal, value, where = flags[dest]
    fields = [f"{field_where} ({field_value!r})" for field_value, field_where in configs.get(dest, [])
              if not _unset(field_value) or (literal and field_value != value)]
    flag = literal and (not _unset(value) or bool(fields))
    return [f"{where} (flag: {value!r})"] * flag + fields


def test_each_flag_default_is_declared_once():
    flags, configs = flag_defaults(), config_defaults()
    dests = {a.dest for a in build_parser()._actions if a.dest in flags}
    twice = {d: declarations(d, flags, configs) for d in sorted(dests)}
    twice = {d: places for d, places in twice.items() if len(places) > 1}
    print(f"{len(dests)} flags; declared twice: {len(twice)}")
    assert not twice, twice


def test_max_tokens_per_gpu_is_declared_once_as_sized_from_memory():
    """The flag's None ("sized from free memory at the first pass") is TrainConfig's too."""
    import dataclasses

    from trainer.learner.settings import TrainConfig

    flags, configs = flag_defaults(), config_defaults()
    assert declarations("max_tokens_per_gpu", flags, configs) == []
    default = {f.name: f.default for f in dataclasses.fields(TrainConfig)}["max_tokens_per_gpu"]
    assert default is None and build_parser().get_default("max_tokens_per_gpu") is None


def test_the_walk_sees_a_second_declaration():
    """The checker on hand-made cases: a config literal beside a flag literal, a config value
    under a flag that says None, a flag reading the config's default."""
    flags = {"a": (True, 4, "f:1"), "b": (True, None, "f:2"), "c": (False, None, "f:3")}
    configs = {"a": [(4, "C.a")], "b": [(8192, "C.b")], "c": [(0.2, "C.c")]}
    assert declarations("a", flags, configs) == ["f:1 (flag: 4)", "C.a (4)"]
    assert declarations("b", flags, configs) == ["f:2 (flag: None)", "C.b (8192)"]
    assert declarations("c", flags, configs) == ["C.c (0.2)"]
