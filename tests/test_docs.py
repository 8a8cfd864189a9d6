"""The docs name files that exist: every repository path in ``README.md``, ``*/README.md`` and
``docs/*.md`` (inline code, code blocks, links) is checked, so a moved or renamed module shows up
here rather than in a reader's failed ``ls``. A file removed since is named with the commit that
has it, ``<commit>:<path>`` (as ``git show`` takes it), and checked in the history."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted({ROOT / "README.md", *ROOT.glob("*/README.md"), *ROOT.glob("docs/*.md")})
EXTENSIONS = (".py", ".sh", ".md", ".toml", ".json", ".jsonl", ".yaml", ".yml", ".txt", ".png",
              ".csv", ".cfg", ".svg")
# A bare file name is checked for source and docs; a bare data, plot or config name
# (`metrics.jsonl`, `reward.png`, `run.yaml`) is what a run writes, not a repository file.
BARE_CHECKED = (".py", ".sh", ".md")
# Paths that a run or the reader creates, or that live in another project: never in the repository.
NOT_IN_REPO_PREFIXES = (
    "runs/", "logs/", "ckpt/", "data/",  # a run's outputs and prepared data sets (scripts write them)
    "simplelr_level3to5/", "simplelr_qwen_level3to5/",  # prepare_simplelr's outputs (dataset/)
    "tasks/",  # the reader's lm-eval task folder (docs/clients.md)
    "examples/",  # AReaL's config paths (recipes/README.md)
    "path/to/",  # a placeholder
)
NOT_IN_REPO_NAMES = {
    "my_reward.py", "draft_answer.py",  # plug-ins the reader writes (recipes/README.md)
    "my_env.py", "my_tools.py", "check_my_tools.py",  # what the reader writes (docs/environments.md)
    "summary.md",  # evaluation's output
}

_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_HISTORIC = re.compile(r"^([0-9a-f]{7,40}):([\w./-]+)$")  # `git show 26f0fbe:benchmarks/x.py`
_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", "node_modules", ".pytest_cache"}


def _repo_paths() -> set[str]:
    """Every file and folder of the checkout, relative to the root: what git tracks or would
    track (ignored local folders such as a downloaded ``models/`` are not the repository's);
    without git, a walk that skips .git, venvs and caches."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return _walked_paths()
    files = {f for f in listed if f}
    return files | {p.as_posix() for f in files for p in Path(f).parents if p != Path(".")}


def _walked_paths() -> set[str]:
    out = set()
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        rel = Path(folder).relative_to(ROOT).as_posix()
        prefix = "" if rel == "." else rel + "/"
        out.update(prefix + name for name in [*dirs, *files])
    return out


def _words(text: str) -> list[str]:
    """Words of inline code and code blocks (a code word that starts with ``..`` points outside
    the repository: ``../shared/...``)."""
    words = [w for block in _FENCE.findall(text) for w in block.split()]
    return words + [w for span in _INLINE.findall(_FENCE.sub("", text)) for w in span.split()]


def _links(text: str) -> list[str]:
    """Markdown link targets that are files (not URLs, not anchors), relative to the doc."""
    targets = [t.split("#")[0] for t in _LINK.findall(_FENCE.sub("", text))]
    return [t for t in targets if t and ":" not in t]


def _as_path(word: str, top: set[str]) -> str | None:
    """The repository path ``word`` names, or None when it is not one (a URL, an absolute or
    outside path, a flag, a placeholder or glob, a metric key such as ``rollout/decode_steps``)."""
    word = word.strip("\"',;()").split("#")[0].split("::")[0].split(":")[0].removeprefix("./")
    if not word or word.startswith(("/", "$", "~", "..", "-", ".")) or re.search(r"[<>{}*\[\]=]", word):
        return None
    if word.startswith(NOT_IN_REPO_PREFIXES) or word in NOT_IN_REPO_NAMES:
        return None
    name = word.rstrip("/")
    if "/" not in name:
        return word if word.endswith(BARE_CHECKED) else None
    if word.endswith(EXTENSIONS) or word.endswith("/") or name.split("/")[0] in top:
        return name
    return None


def _exists(path: str, doc: Path, repo: set[str]) -> bool:
    """At the root, beside the doc, or below a package folder (the docs name modules relative to
    their package: ``server/app.py``, ``rollout/config.py``, ``arguments.py``)."""
    beside = (doc.parent / path).resolve()
    if beside.is_relative_to(ROOT) and beside.exists():
        return True
    return path in repo or any(p.endswith("/" + path) for p in repo)


def _missing(doc: Path, text: str, repo: set[str]) -> set[str]:
    top = {p for p in repo if "/" not in p and (ROOT / p).is_dir()}
    named = {p for w in _words(text) if (p := _as_path(w, top))}
    missing = {p for p in named if not _exists(p, doc, repo)}
    return missing | {t for t in _links(text) if not (doc.parent / t).exists()}


def _git(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None


def _missing_historic(text: str) -> set[str]:
    """``<commit>:<path>`` words whose commit lacks the path. Unchecked (not missing) only where
    the history is not here: no git, or a shallow clone without the commit."""
    named = {m.group(0) for w in _words(text) if (m := _HISTORIC.match(w.strip("\"',;()")))}
    out = set()
    for spec in named:
        found = _git("cat-file", "-e", spec)
        if found is None or found.returncode == 0:
            continue
        commit_here = _git("cat-file", "-e", spec.split(":")[0] + "^{commit}")
        shallow = _git("rev-parse", "--is-shallow-repository")
        if commit_here.returncode != 0 and shallow.stdout.strip() == "true":
            continue
        out.add(spec)
    return out


# `python -m` targets of this repository's packages (others, e.g. `lm_eval`, are not ours)
_PACKAGES = {"trainer": "trainer", "sglang_kvc": "sglang-kvc/sglang_kvc", "evaluation": "evaluation",
             "dataset": "dataset", "recipes": "recipes", "checkpoint_tools": "checkpoint_tools",
             "benchmarks": "benchmarks"}
_RUN_MODULE = re.compile(r"python3? -m ([\w.]+)")


def _missing_modules(text: str) -> set[str]:
    out = set()
    for module in _RUN_MODULE.findall(text):
        top, _, rest = module.partition(".")
        if top in _PACKAGES:
            base = ROOT / _PACKAGES[top] / rest.replace(".", "/")
            if not (base.with_suffix(".py").exists() or (base / "__main__.py").exists()):
                out.add(module)
    return out


@pytest.fixture(scope="module")
def repo() -> set[str]:
    return _repo_paths()


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.relative_to(ROOT).as_posix())
def test_named_paths_exist(doc, repo):
    rel = doc.relative_to(ROOT).as_posix()
    missing = _missing(doc, doc.read_text(), repo)
    assert not missing, f"{rel} names paths that do not exist: {sorted(missing)}"
    gone_then = _missing_historic(doc.read_text())
    assert not gone_then, f"{rel} names commits without these paths: {sorted(gone_then)}"
    gone = _missing_modules(doc.read_text())
    assert not gone, f"{rel} runs modules that do not exist: python -m {sorted(gone)}"


def test_the_checker_sees_paths_and_skips_the_rest(repo):
    text = "\n".join([
        "`server/generate_routes.py` `trainer/nope/` `gone.py` [x](../trainer/README.md)",
        "[y](missing.md) [z](https://x.org/a.md) [w](#section) `server/app.py` `arguments.py`",
        "`rollout/decode_steps` `runs/x/metrics.jsonl` `<bench>/samples.jsonl` `/models/Qwen`",
        "`https://x.org/a.py` `reward.png` `../shared/x.md` `--out=a.py`",
        "```", "./scripts/test.sh -m launch", "./scripts/nope.sh", "```"])
    doc = ROOT / "docs" / "probe.md"  # paths resolve beside docs/; the file is never written
    assert _missing(doc, text, repo) == {"server/generate_routes.py", "trainer/nope", "gone.py",
                                         "missing.md", "scripts/nope.sh"}
    # a removed file, named with a commit: checked in the history, not in the checkout
    assert _missing(doc, "`git show 26f0fbe:benchmarks/bench_gemm.py`", repo) == set()
    assert _missing_modules("`python -m trainer.train`, `python -m trainer.nope`, `python -m lm_eval`"
                            " `python -m sglang_kvc.launch_server`") == {"trainer.nope"}


def test_the_checker_looks_removed_files_up_in_the_history():
    found = _git("cat-file", "-e", "26f0fbe^{commit}")
    if found is None or found.returncode != 0:
        pytest.skip("no git history here (a shallow clone)")
    assert _missing_historic("`git show 26f0fbe:benchmarks/bench_gemm.py` `26f0fbe:nope.py` "
                             "`abc1234:x.py`") == {"26f0fbe:nope.py", "abc1234:x.py"}
