"""Multi-turn episodes against single-turn sampling at the same samples and lengths, on one
in-process engine (``trainer/rollout/multiturn``: every episode advances on its own, its tool
runs at once and its next turn joins the running batch).

Each sample has a plan of ``--turns`` turn lengths (``--turn-tokens`` on average, from half to
one and a half of it, seeded; ``ignore_eos``), so turns end at different steps as real ones do:

    multi-turn    the episodes of ``MultiTurn``: after each turn a tool (the calculator under
                  its time limit; with ``--tool-ms``, that much waiting on the tool pool first)
                  answers with an observation, the next turn continues the episode's session
    single-turn   one request per sample for the plan's total, all in one batch

Printed per mode: model tokens, wall seconds, tokens/s, decode steps, decode seconds (engine
host + GPU wait), the engine thread's host seconds in decode, the seconds outside decode
(prefill, scheduling, the episode loop) and the tools' seconds (summed over samples). Then the
split of the time outside decode: the engine thread's prefill steps and seconds, the commands
it ran between steps (session opens and closes) and its idle seconds; the episode loop's
seconds opening sessions, submitting turns, waiting, taking turns and observations in, closing
sessions (and in how many calls), its wake-ups, and the gap from a turn's return to the next
turn's submit (median and slowest). Last, multi-turn's share of single-turn's tokens/s, and
whether the per-turn barrier is gone: the first turn 2 started before the slowest turn 1
ended (per-turn timestamps).

Every prefill step is recorded (multiturn_probe.py): rows, continuing rows, new tokens, held KV,
wall / launch / thread-CPU / GPU-wait ms; the rows carry the medians of the continuation prefill
steps and of the fresh ones, and the JSON every step. ``--cudnn-sdp off,on`` runs the whole
comparison once per setting of the engine's cuDNN attention (layers/attention.py
`set_cudnn_sdp`; off first, torch's per-shape cuDNN graphs then start cold), in one process.
``--profile DIR`` adds one multi-turn run per setting under torch.profiler (after the timed
ones, so they are not slowed): DIR/cudnn_<setting>/ gets the top kernels and CPU ops and the
ops of the prefill steps alone (multiturn_profile.py), and the printed line says what share of
the prefill steps' wall each op took.

    python -m benchmarks.engine.multiturn_throughput --model-dir models/SmolLM2-135M-Instruct
    python -m benchmarks.engine.multiturn_throughput --tiny       # CPU, the tiny test model
    python -m benchmarks.engine.multiturn_throughput --tiny --prompts 64 --samples 8  # host-bound
    python -m benchmarks.engine.multiturn_throughput --model-dir M --cudnn-sdp off,on --profile P
"""

from __future__ import annotations

import argparse
import cProfile
import json
import random
import tempfile
import time
from pathlib import Path

from benchmarks.engine.multiturn_probe import (StepProbe, one_look as step_look, profiled,
                                              python_profile_text, step_summary)
from benchmarks.engine.multiturn_profile import one_look
from trainer.rollout.engines.interface import Backend, RolloutConfig
from trainer.rollout.multiturn.environment import Step
from trainer.rollout.multiturn.loop import MultiTurn
from trainer.rollout.multiturn.tools import calculator, run_tool
from trainer.rollout.samples.data import Prompt
from trainer.rollout.samples.generate import GenerateContext, Request

OBS_SLACK = 48  # room per turn for an observation and the next turn's header


class FixedLength(Backend):
    """The engine, every request decoding exactly its ``max_new_tokens`` (``ignore_eos``)."""

    def __init__(self, inner):
        self.inner, self.has_sessions = inner, inner.has_sessions

    def run(self, requests, cfg):
        return self.inner.run([_fixed(r) for r in requests], cfg)

    def submit(self, request, cfg):
        return self.inner.submit(_fixed(request), cfg)

    def submit_many(self, requests, cfg):
        return self.inner.submit_many([_fixed(r) for r in requests], cfg)

    def open_session(self) -> str:
        return self.inner.open_session()

    def close_session(self, session_id: str) -> None:
        self.inner.close_session(session_id)

    def open_sessions(self, count: int) -> list[str]:
        return self.inner.open_sessions(count)

    def close_sessions(self, session_ids: list[str]) -> None:
        self.inner.close_sessions(session_ids)


def _fixed(r):
    r.sampling_params["ignore_eos"] = True
    return r


class CalculatorTool:
    """Answers every turn but the last with the calculator's output under its time limit
    (``run_tool``: the shipped calculator is ``@bounded`` and runs on the environment's thread)
    or, with ``tool_ms``, after that much waiting on the tool pool, as a tool call over the
    network would."""

    def __init__(self, turns: int, tool_ms: float):
        self.turns, self.tool_ms = turns, tool_ms

    def step(self, conversation) -> Step:
        k = len(conversation.turns)
        if k >= self.turns:
            return Step(done=True, reward=0.0)
        tool = self._tool if self.tool_ms else calculator
        out = run_tool(tool, {"expression": f"{k + 3} * 7 + {conversation.sample_index}"})
        return Step(f"<tool_response>\n{out}\n</tool_response>", tool_calls=1)

    def _tool(self, expression: str) -> str:
        time.sleep(self.tool_ms / 1e3)
        return calculator(expression)


class PlannedTurns(MultiTurn):
    """``MultiTurn`` whose turn ``t`` of sample (i, k) decodes ``plan[i * n + k][t]`` tokens."""

    plan: list[list[int]] = []
    n: int = 1

    def _budget(self, ctx, e) -> int:
        return min(self.plan[e.prompt_index * self.n + e.sample_index][len(e.turns)],
                   self._room(ctx, e))


def length_plan(samples: int, turns: int, mean: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[max(1, int(mean * (0.5 + rng.random()))) for _ in range(turns)]
            for _ in range(samples)]


def make_prompts(tokenizer, count: int) -> list[Prompt]:
    out = []
    for i in range(count):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"Problem {i}: what is {i + 3} * 7 + {i % 5}? "
                                         "Use the calculator tool."}],
            tokenize=False, add_generation_prompt=True)
        out.append(Prompt(text, tokenizer(text, add_special_tokens=False)["input_ids"], "", {}))
    return out


ENGINE_THREAD = ("prefill_steps", "prefill_s", "commands", "command_s", "idle_s")


def _counters(rollout) -> dict:
    """The decode counters, and where the rest of the engine thread's time went."""
    steps = rollout.engine.step_stats
    return {**rollout.decode_counters(), **{k: getattr(steps, k) for k in ENGINE_THREAD}}


def _measured(rollout, run) -> tuple[list, dict]:
    before = _counters(rollout)
    begin = time.perf_counter()
    traces = run()
    wall = time.perf_counter() - begin
    after = _counters(rollout)
    delta = {k.split("/")[-1]: after[k] - before[k] for k in after}
    decode = delta["decode_host_s"] + delta["decode_gpu_wait_s"]
    return traces, {"wall_s": wall, "decode_steps": int(delta["decode_steps"]), "decode_s": decode,
                    "decode_host_s": delta["decode_host_s"], "outside_decode_s": wall - decode,
                    **{k: delta[k] for k in ENGINE_THREAD}, "start": begin}


def single_turn(ctx, prompts, n, plan) -> tuple[list, dict]:
    requests = [Request(p.input_ids, sum(plan[i * n + k])) for i, p in enumerate(prompts)
                for k in range(n)]
    gens = ctx.generate(requests)
    return gens, {"model_tokens": sum(len(g.response_ids) for g in gens), "tool_s": 0.0}


def multi_turn(ctx, prompts, n, plan, args) -> tuple[list, dict]:
    plugin = PlannedTurns(CalculatorTool(args.turns, args.tool_ms).step, max_turns=args.turns)
    plugin.plan, plugin.n = plan, n
    traces = plugin(ctx, prompts, n)
    metas = [t.meta for t in traces]
    return traces, {"model_tokens": sum(m["model_tokens"] for m in metas),
                    "tool_s": sum(m["env_seconds"] for m in metas),
                    "turns_per_sample": sum(m["turns"] for m in metas) / len(metas),
                    **barrier(metas), **turn_gaps(metas), **plugin.host_times.to_dict()}


def turn_gaps(metas: list[dict]) -> dict:
    """From a turn's return to the episode loop to its next turn's submit (the environment
    step and the loop's hops): median and slowest, in ms."""
    gaps = sorted(b[0] - a[1] for m in metas for a, b in zip(m["turn_spans"], m["turn_spans"][1:]))
    if not gaps:
        return {}
    return {"turn_gap_median_ms": 1e3 * gaps[len(gaps) // 2], "turn_gap_max_ms": 1e3 * gaps[-1]}


def barrier(metas: list[dict]) -> dict:
    """When the first turn 2 started and the slowest turn 1 ended (perf_counter seconds)."""
    ends = [m["turn_spans"][0][1] for m in metas]
    starts = [m["turn_spans"][1][0] for m in metas if len(m["turn_spans"]) > 1]
    if not starts:
        return {}
    return {"first_turn2_start": min(starts), "slowest_turn1_end": max(ends),
            "turn2_before_slowest_turn1": min(starts) < max(ends)}


def run_mode(mode, rollout, tokenizer, prompts, args, plan, probe: StepProbe) -> dict:
    longest = max(sum(p) for p in plan)
    cfg = RolloutConfig(max_response_len=longest + args.turns * OBS_SLACK, temperature=1.0,
                        seed=args.seed)
    ctx = GenerateContext(FixedLength(rollout), cfg, tokenizer, None,
                          context_length=rollout.context_length())
    run = (lambda: single_turn(ctx, prompts, args.samples, plan)) if mode == "single-turn" \
        else (lambda: multi_turn(ctx, prompts, args.samples, plan, args))
    probe.enabled = True
    try:
        (_, row), timing = _measured(rollout, run)
    finally:
        probe.enabled = False
    steps = probe.take()
    row.update(timing)
    row.update(step_summary(steps))
    row["prefill_step_log"] = steps
    row["tokens_per_s"] = row["model_tokens"] / row["wall_s"]
    graphs = rollout.engine.get_server_info().get("prefill_graphs", {})  # (over the engine's life)
    row["prefill_graph_replays"] = graphs.get("replays", 0)
    for key in ("first_turn2_start", "slowest_turn1_end"):
        if key in row:
            row[key] -= timing["start"]
    row.pop("start")
    return {"mode": mode, "cudnn_sdp": args.setting, **row}


def start_engine(args, model_dir: str, samples: int, longest: int):
    from sglang_kvc import Engine

    from trainer.rollout.engines.inprocess import EngineRollout

    cuda = args.device.startswith("cuda")
    context = longest + 512
    # a pool that holds every episode's whole context, on the CPU too: no parked KV is dropped
    # (a turn that re-prefills its history would measure memory pressure, not the host path)
    kw = dict(model_path=model_dir, device=args.device, dtype="bfloat16" if cuda else "float32",
              context_length=context, max_running_requests=samples, random_seed=args.seed,
              max_total_tokens=samples * context + 4096,
              schedule_prefill_delay_steps=args.prefill_delay_steps,
              prefill_graph_max_tokens=args.prefill_graph_max_tokens)
    if cuda:
        kw.update(cuda_graph_max_bs=min(samples, 512), mem_fraction_static=0.5)
    return EngineRollout(Engine(**kw))


def tiny_model(folder: Path) -> str:
    import torch

    from checkpoint_tools.tiny_models import make_tiny_model

    return str(make_tiny_model("qwen2.5", folder / "qwen", dtype=torch.float32))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default="models/SmolLM2-135M-Instruct")
    p.add_argument("--tiny", action="store_true",
                   help="the tiny test model on the CPU, 4 prompts x 4 samples, short turns")
    p.add_argument("--prompts", type=int, default=None, help="default 64 (--tiny: 4)")
    p.add_argument("--samples", type=int, default=None,
                   help="samples per prompt, default 8 (--tiny: 4)")
    p.add_argument("--turns", type=int, default=2)
    p.add_argument("--turn-tokens", type=int, default=None,
                   help="mean tokens per turn, default 64 (--tiny: 12)")
    p.add_argument("--tool-ms", type=float, default=0.0, help="each tool call's extra wait")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per mode after a warm-up, default 2 (--tiny: 1)")
    p.add_argument("--device", default=None, help="default: cuda when there is one, else cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--prefill-delay-steps", type=int, default=16,
                   help="the engine's --schedule-prefill-delay-steps (16, what "
                        "scripts/run-smollm2-tool.sh runs; 0: a prefill per arrival)")
    p.add_argument("--prefill-graph-max-tokens", type=int, default=8192,
                   help="the engine's flag (8192, its default: prefills whose every row holds KV "
                        "replay as CUDA graphs; 0: eager). SGLANG_KVC_PAGED_EXTEND=0 in the "
                        "environment takes the torch path for held KV (no graphs either)")
    p.add_argument("--cudnn-sdp", default="off",
                   help="comma list of the engine's cuDNN attention settings to run, in order "
                        "(off, on), e.g. off,on")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="one more multi-turn run per setting under torch.profiler; tables here")
    args = p.parse_args(argv)
    args.settings = cudnn_settings(p, args.cudnn_sdp)
    defaults = (4, 4, 12, 1) if args.tiny else (64, 8, 64, 2)  # what was not given
    for key, value in zip(("prompts", "samples", "turn_tokens", "repeats"), defaults):
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.device = args.device or default_device(args.tiny)
    return args


def cudnn_settings(p: argparse.ArgumentParser, value: str) -> list[str]:
    """--cudnn-sdp's settings: a comma list of distinct off/on, in order (an argparse error
    naming the flag otherwise). Shared with continuation_prefill.py."""
    settings = [v.strip() for v in value.split(",")]
    if any(v not in ("off", "on") for v in settings) or len(set(settings)) != len(settings):
        p.error(f"--cudnn-sdp {value!r}: a comma list of distinct off/on")
    return settings


def default_device(tiny: bool) -> str:
    """cuda when there is one, unless the tiny CPU model is asked for."""
    import torch

    return "cuda" if torch.cuda.is_available() and not tiny else "cpu"


def benchmark(args, model_dir: str) -> dict:
    from transformers import AutoTokenizer

    from sglang_kvc import cudnn_sdp_allowed, set_cudnn_sdp

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = make_prompts(tokenizer, args.prompts)
    plan = length_plan(args.prompts * args.samples, args.turns, args.turn_tokens, args.seed)
    rollout = start_engine(args, model_dir, args.prompts * args.samples,
                           max(sum(p) for p in plan) + args.turns * OBS_SLACK)
    probe = StepProbe(rollout.engine.loop)
    rows, profiles, default = [], {}, cudnn_sdp_allowed()
    try:
        for args.setting in args.settings:
            set_cudnn_sdp(args.setting == "on")
            rows += setting_rows(rollout, tokenizer, prompts, args, plan, probe)
            if args.profile:
                profiles[args.setting] = profile_run(rollout, tokenizer, prompts, args, plan, probe)
            save(args, {"args": vars(args), "rows": rows, "summary": summary(rows),
                        "profiles": profiles})  # a run cut at its limit keeps the settings done
    finally:
        set_cudnn_sdp(default)
        rollout.close()
    return {"args": vars(args), "rows": rows, "summary": summary(rows), "profiles": profiles}


def setting_rows(rollout, tokenizer, prompts, args, plan, probe) -> list[dict]:
    """A warm-up of both modes (graphs captured, caches filled), then the timed repeats."""
    print(f"cudnn_sdp {args.setting}: warm-up, then {args.repeats} repeat(s) of both modes",
          flush=True)
    for mode in ("single-turn", "multi-turn"):
        run_mode(mode, rollout, tokenizer, prompts[:2], args, plan, probe)
    return [run_mode(mode, rollout, tokenizer, prompts, args, plan, probe)
            for _ in range(args.repeats) for mode in ("single-turn", "multi-turn")]


def profile_run(rollout, tokenizer, prompts, args, plan, probe) -> dict:
    """One multi-turn run under torch.profiler; its row and the tables' summary. A profiler
    that fails is reported, not raised: the timed rows are kept."""
    folder = Path(args.profile) / f"cudnn_{args.setting}"
    print(f"cudnn_sdp {args.setting}: profiled multi-turn run -> {folder}", flush=True)
    run = lambda: run_mode("multi-turn", rollout, tokenizer, prompts, args, plan, probe)
    probe.python_profile = cProfile.Profile()
    try:
        row, tables = profiled(rollout.engine.loop, run, folder, args.device.startswith("cuda"))
    except Exception as e:  # noqa: BLE001 - the timed numbers matter more than the profile
        print(f"profile failed: {e!r}", flush=True)
        return {"error": repr(e)}
    finally:
        folder.mkdir(parents=True, exist_ok=True)
        text = python_profile_text(probe.python_profile)
        (folder / "launch_python.txt").write_text(text)
        print(text[:3000], flush=True)
        probe.python_profile = None
    (folder / "prefill_steps.json").write_text(json.dumps(row["prefill_step_log"], indent=1))
    return {"row": {k: v for k, v in row.items() if k != "prefill_step_log"}, "tables": tables}


def summary(rows: list[dict]) -> dict:
    """Per cuDNN setting: multi-turn's best tokens/s over single-turn's, the barrier."""
    out = {}
    for setting in dict.fromkeys(r["cudnn_sdp"] for r in rows):
        mine = [r for r in rows if r["cudnn_sdp"] == setting]
        best = {m: max(r["tokens_per_s"] for r in mine if r["mode"] == m)
                for m in ("single-turn", "multi-turn")}
        multi = [r for r in mine if r["mode"] == "multi-turn"]
        out[setting] = {"multi_over_single_tokens_per_s": best["multi-turn"] / best["single-turn"],
                        "barrier_gone": all(r.get("turn2_before_slowest_turn1", False)
                                            for r in multi)}
    return out


COLUMNS = ("mode", "cudnn_sdp", "model_tokens", "wall_s", "tokens_per_s", "decode_steps", "decode_s",
           "decode_host_s", "outside_decode_s", "tool_s", "first_turn2_start", "slowest_turn1_end")


# where the time outside decode went: the engine thread's (prefill steps, commands between
# steps such as session opens/closes, idle), then the episode loop's (host_times.py)
SPLIT = ("mode", "cudnn_sdp", "prefill_steps", "prefill_s", "commands", "command_s", "idle_s", "open_s",
         "submit_s", "wait_s", "handle_s", "close_s", "close_calls", "finish_s", "wakeups",
         "turn_gap_median_ms", "turn_gap_max_ms")


# each prefill step (multiturn_probe.py), medians: continuation steps (rows continuing a
# session) against fresh ones
STEPS = ("mode", "cudnn_sdp", "continuation_steps", "continuation_wall_s",
         "continuation_rows_median", "continuation_tokens_median", "continuation_wall_ms_median",
         "continuation_launch_ms_median", "continuation_thread_cpu_ms_median",
         "continuation_prev_wait_ms_median", "continuation_own_wait_ms_median",
         "continuation_take_ms_median", "continuation_schedule_ms_median",
         "continuation_finish_ms_median",
         "continuation_other_ms_median", "fresh_steps",
         "fresh_tokens_median", "fresh_wall_ms_median", "fresh_launch_ms_median",
         "fresh_own_wait_ms_median")


def report(out: dict) -> None:
    for columns in (COLUMNS, SPLIT, STEPS):
        widths = [max(11, len(c)) for c in columns]
        print(" ".join(f"{c:>{w}}" for c, w in zip(columns, widths)))
        for r in out["rows"]:
            print(" ".join(f"{_cell(r.get(c)):>{w}}" for c, w in zip(columns, widths)))
    for setting, s in out["summary"].items():
        print(f"cudnn_sdp {setting}: multi-turn / single-turn tokens/s: "
              f"{s['multi_over_single_tokens_per_s']:.2f}  (target on one H200 at 64 x 8: >= 0.50); "
              f"barrier gone (a turn 2 started before the slowest turn 1 ended): {s['barrier_gone']}")
    for r in out["rows"]:
        if r["mode"] == "multi-turn":
            print(f"cudnn_sdp {r['cudnn_sdp']}: {step_look(r)}")
    for setting, p in out["profiles"].items():
        print(f"profile cudnn_sdp {setting}: " + (p["error"] if "error" in p else one_look(p["tables"])))


def _cell(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def save(args, out: dict) -> None:
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))


def main(argv=None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model(Path(tmp)) if args.tiny else args.model_dir
        out = benchmark(args, model_dir)
    report(out)
    save(args, out)
    return out


if __name__ == "__main__":
    main()
