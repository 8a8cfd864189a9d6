"""Score a served model on math benchmarks (the module behind ``evaluation/eval.sh``).

    python -m evaluation.run_eval --url http://127.0.0.1:30000 --benchmarks math500,aime24 \\
        --prompt-template qwen-boxed --output-dir runs/eval/step100

Per benchmark it writes ``<output-dir>/<benchmark>/samples.jsonl`` (one line per problem: question,
gold, completions, extracted answers, scores, finish reasons, response tokens) and
``metrics.json`` (avg@n, unbiased pass@k, truncation ratio, mean response tokens, grader
timeouts); then ``summary.md``/``summary.json`` across benchmarks. A benchmark whose
``metrics.json`` exists is skipped, and an interrupted one resumes from
``samples.partial.jsonl``, unless ``--overwrite``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path

import httpx

from .backends import BACKENDS, BackendError, Completion, SamplingConfig, detect_backend, detect_model, make_backend
from .benchmarks import MANY_SAMPLE_BENCHMARKS, Problem, benchmark_name, default_data_dir, load_benchmark
from .grader import grade_many
from .metrics import benchmark_metrics
from .prompts import TEMPLATES, get_template
from .summary import markdown_summary


@dataclasses.dataclass
class EvalConfig:
    url: str
    benchmarks: list[str]
    output_dir: Path
    backend: str = "auto"
    model: str | None = None
    prompt_template: str = "qwen-boxed"
    tokenizer: str | None = None
    data_dir: Path | None = None
    temperature: float = 0.8
    top_p: float = 0.95
    max_tokens: int = 4096
    n_samples: int | None = None  # None: 1, and 32 for aime24/amc23
    n_samples_many: int = 32
    seed: int | None = 0
    concurrency: int = 64
    limit: int | None = None
    overwrite: bool = False
    retries: int = 3
    retry_backoff: float = 1.0  # seconds before the first retry; doubles each time
    request_timeout: float = 3600.0
    grader_timeout: float = 5.0
    grader_workers: int | None = None
    progress: bool = True

    def samples_for(self, benchmark: str) -> int:
        if self.n_samples is not None:
            return self.n_samples
        return self.n_samples_many if benchmark in MANY_SAMPLE_BENCHMARKS else 1


def parse_args(argv: list[str] | None = None) -> EvalConfig:
    p = argparse.ArgumentParser(prog="python -m evaluation.run_eval",
                                allow_abbrev=False, description="Score a served model (SGLang "
                                "/generate or OpenAI-compatible) on math benchmarks.")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--benchmarks", default="math500",
                   help="comma-separated: gsm8k, math500, minerva_math, olympiadbench, gaokao2023en, aime24, "
                        "amc23, or paths to local .jsonl files (default: math500)")
    p.add_argument("--output-dir", type=Path, required=True, help="where results are written")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="sglang (/generate), openai (/v1/completions), openai-chat (/v1/chat/completions), "
                        "or auto (probe the server; default)")
    p.add_argument("--model", default=None, help="model name for OpenAI requests (default: first of /v1/models)")
    p.add_argument("--prompt-template", choices=sorted(TEMPLATES), default="qwen-boxed",
                   help="prompt template; 'chat' applies the tokenizer's chat template (default: qwen-boxed)")
    p.add_argument("--tokenizer", default=None, help="tokenizer path, needed by --prompt-template chat "
                                                     "except with --backend openai-chat")
    p.add_argument("--data-dir", type=Path, default=None,
                   help=f"benchmark files <dir>/<name>/test.jsonl (default: {default_data_dir()})")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default 0.8)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling top-p (default 0.95)")
    p.add_argument("--max-tokens", type=int, default=4096, help="max new tokens per completion (default 4096)")
    p.add_argument("--n-samples", type=int, default=None,
                   help="samples per problem for every benchmark (default: 1, and --n-samples-many for aime24/amc23)")
    p.add_argument("--n-samples-many", type=int, default=32, help="samples per problem for aime24/amc23 (default 32)")
    p.add_argument("--seed", type=int, default=0, help="base seed; each sample gets its own (-1: send none)")
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight (default 64)")
    p.add_argument("--limit", type=int, default=None, help="only the first N problems of each benchmark")
    p.add_argument("--overwrite", action="store_true", help="redo finished benchmarks instead of skipping them")
    p.add_argument("--retries", type=int, default=3, help="retries per request on connection errors/5xx/429")
    p.add_argument("--retry-backoff", type=float, default=1.0, help="seconds before the first retry (doubles)")
    p.add_argument("--request-timeout", type=float, default=3600.0, help="seconds per HTTP request")
    p.add_argument("--grader-timeout", type=float, default=5.0, help="seconds per graded answer")
    p.add_argument("--grader-workers", type=int, default=None, help="grader processes (default: all cores)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    a = p.parse_args(argv)
    for name, value in (("--n-samples", a.n_samples), ("--n-samples-many", a.n_samples_many),
                        ("--concurrency", a.concurrency), ("--max-tokens", a.max_tokens)):
        if value is not None and value < 1:
            p.error(f"{name} must be at least 1")
    return EvalConfig(
        url=a.url, benchmarks=[b.strip() for b in a.benchmarks.split(",") if b.strip()],
        output_dir=a.output_dir, backend=a.backend, model=a.model, prompt_template=a.prompt_template,
        tokenizer=a.tokenizer, data_dir=a.data_dir, temperature=a.temperature, top_p=a.top_p,
        max_tokens=a.max_tokens, n_samples=a.n_samples, n_samples_many=a.n_samples_many,
        seed=None if a.seed < 0 else a.seed, concurrency=a.concurrency, limit=a.limit,
        overwrite=a.overwrite, retries=a.retries, retry_backoff=a.retry_backoff, request_timeout=a.request_timeout,
        grader_timeout=a.grader_timeout, grader_workers=a.grader_workers, progress=not a.no_progress)


def _settings(config: EvalConfig, n: int, backend: str) -> dict:
    """What must match for a partial run to be resumed."""
    return {"backend": backend, "prompt_template": config.prompt_template, "temperature": config.temperature,
            "top_p": config.top_p, "max_tokens": config.max_tokens, "n_samples": n, "seed": config.seed}


def _read_partial(path: Path, n: int) -> dict[int, dict]:
    done = {}
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by an interrupted write
            if len(row.get("completions", [])) == n:
                done[row["idx"]] = row
    return done


async def _generate(problems: list[Problem], prompts: list, backend, sampling: SamplingConfig, n: int,
                    config: EvalConfig, partial_path: Path, done: dict[int, dict], desc: str) -> dict[int, dict]:
    """Generate the missing samples; returns idx -> record (completions, finish reasons, tokens)."""
    semaphore = asyncio.Semaphore(config.concurrency)
    pending: dict[int, list[Completion | None]] = {p.idx: [None] * n for p in problems if p.idx not in done}
    records = dict(done)
    bar = None
    if config.progress:
        from .progress import progress_bar

        bar = progress_bar(total=len(pending) * n, desc=f"{desc} generate", unit="sample")

    with open(partial_path, "a", encoding="utf-8") as partial:
        async def one(problem: Problem, j: int) -> None:
            seed = None if config.seed is None else config.seed * 1_000_003 + problem.idx * n + j
            async with semaphore:
                try:
                    completion = await backend.complete(prompts[problem.idx], sampling, seed)
                except BackendError as exc:
                    completion = Completion("", "error", None, error=str(exc))
            slots = pending[problem.idx]
            slots[j] = completion
            if bar:
                bar.update(1)
            if all(s is not None for s in slots):
                record = {"idx": problem.idx, "question": problem.question, "gold": problem.gold,
                          **problem.extra,
                          "completions": [s.text for s in slots],
                          "finish_reasons": [s.finish_reason for s in slots],
                          "response_tokens": [s.response_tokens for s in slots]}
                errors = [s.error for s in slots if s.error]
                if errors:
                    record["errors"] = errors
                else:  # only error-free problems are kept for a resume
                    partial.write(json.dumps(record, ensure_ascii=False) + "\n")
                    partial.flush()
                records[problem.idx] = record

        try:
            await asyncio.gather(*(one(p, j) for p in problems if p.idx in pending for j in range(n)))
        finally:
            if bar:
                bar.close()
    return records


async def _prepare_backend(config: EvalConfig, client: httpx.AsyncClient):
    kind = config.backend
    if kind == "auto":
        kind = await detect_backend(config.url, client)
        if config.prompt_template == "chat" and config.tokenizer is None and kind == "openai":
            kind = "openai-chat"
    model = config.model
    if model is None and kind in ("openai", "openai-chat"):
        model = await detect_model(config.url, client)
    return kind, make_backend(kind, config.url, client, model, config.retries, config.retry_backoff)


def _prompts(config: EvalConfig, problems: list[Problem], kind: str, tokenizer) -> list:
    template = get_template(config.prompt_template)
    if kind == "openai-chat":
        return [template.messages(p.question) for p in problems]
    return [template.render(p.question, tokenizer) for p in problems]


async def evaluate_benchmark(config: EvalConfig, name: str, client: httpx.AsyncClient, kind: str,
                             backend, tokenizer) -> dict:
    """Generate, grade and write one benchmark; returns its metrics."""
    label = benchmark_name(name)
    out_dir = config.output_dir / label
    metrics_path, samples_path = out_dir / "metrics.json", out_dir / "samples.jsonl"
    partial_path, settings_path = out_dir / "samples.partial.jsonl", out_dir / "settings.json"
    n = config.samples_for(label)
    settings = _settings(config, n, kind)
    if config.overwrite:
        for path in (metrics_path, samples_path, partial_path, settings_path):
            path.unlink(missing_ok=True)
    elif metrics_path.exists():
        print(f"[{label}] already evaluated ({metrics_path}); skipping (use --overwrite to redo)", file=sys.stderr)
        return json.loads(metrics_path.read_text())
    out_dir.mkdir(parents=True, exist_ok=True)
    if partial_path.exists() and settings_path.exists():
        previous = json.loads(settings_path.read_text())
        if previous != settings:
            raise ValueError(f"{partial_path} was generated with {previous}, not {settings}; "
                             f"use --overwrite or another --output-dir")
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")

    start = time.monotonic()
    problems = load_benchmark(name, config.data_dir, config.limit)
    done = {i: r for i, r in _read_partial(partial_path, n).items() if i < len(problems)}
    if done:
        print(f"[{label}] resuming: {len(done)}/{len(problems)} problems already generated", file=sys.stderr)
    prompts = _prompts(config, problems, kind, tokenizer)
    stop = get_template(config.prompt_template).stops
    sampling = SamplingConfig(config.temperature, config.top_p, config.max_tokens, stop)
    records = await _generate(problems, prompts, backend, sampling, n, config, partial_path, done, label)
    ordered = [records[p.idx] for p in problems]
    errors = sum(f == "error" for r in ordered for f in r["finish_reasons"])
    if errors == len(ordered) * n:
        first = next(r["errors"][0] for r in ordered if r.get("errors"))
        raise BackendError(f"[{label}] every request failed; first error: {first}")

    pairs = [(c, r["gold"]) for r in ordered for c in r["completions"]]
    results = grade_many(pairs, timeout=config.grader_timeout, workers=config.grader_workers,
                         progress=config.progress)
    it = iter(results)
    for record in ordered:
        graded = [next(it) for _ in record["completions"]]
        record["extracted"] = [g.extracted for g in graded]
        record["scores"] = [g.correct for g in graded]
        record["grader_timeouts"] = [g.timed_out for g in graded]
    with open(samples_path, "w", encoding="utf-8") as f:
        for record in ordered:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    metrics = benchmark_metrics(ordered)
    metrics.update(benchmark=label, settings=settings, time_seconds=round(time.monotonic() - start, 1))
    metrics_path.write_text(json.dumps(metrics, indent=2) + "\n")
    if errors == 0:
        partial_path.unlink(missing_ok=True)
    else:
        print(f"[{label}] {errors} requests failed (scored wrong); rerun without --overwrite to retry them "
              f"after deleting {metrics_path}", file=sys.stderr)
    print(f"[{label}] {metrics['num_problems']} problems x {n}: avg@{n} {metrics[f'avg@{n}']:.1f}, "
          f"pass@k {metrics['pass@k']}, truncated {100 * metrics['truncation_ratio']:.1f}%", file=sys.stderr)
    return metrics


async def run(config: EvalConfig) -> dict[str, dict]:
    """Evaluate every benchmark of ``config``; returns benchmark -> metrics."""
    for name in config.benchmarks:  # a missing file fails now, before the server is probed
        load_benchmark(name, config.data_dir, limit=1)
    config.output_dir.mkdir(parents=True, exist_ok=True)
    limits = httpx.Limits(max_connections=config.concurrency + 4, max_keepalive_connections=config.concurrency)
    timeout = httpx.Timeout(config.request_timeout, connect=30.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        kind, backend = await _prepare_backend(config, client)
        tokenizer = None
        if config.prompt_template == "chat" and kind != "openai-chat":
            if config.tokenizer is None:
                raise ValueError("--prompt-template chat needs --tokenizer with the sglang/openai backends")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
        print(f"evaluating {config.url} with backend {kind}, template {config.prompt_template}", file=sys.stderr)
        all_metrics = {}
        for name in config.benchmarks:
            all_metrics[benchmark_name(name)] = await evaluate_benchmark(config, name, client, kind, backend, tokenizer)
    table = markdown_summary(all_metrics)
    (config.output_dir / "summary.md").write_text(table + "\n")
    (config.output_dir / "summary.json").write_text(json.dumps(all_metrics, indent=2) + "\n")
    print(table)
    return all_metrics


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        asyncio.run(run(config))
    except (BackendError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
