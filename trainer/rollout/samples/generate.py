"""Generate plug-ins (``--custom-generate-function-path``): a user function that decides which
requests a rollout makes, as slime's custom generate functions do, without forking the loop.

    def generate(ctx: GenerateContext, prompts: list[Prompt], n: int) -> list[Trace]: ...

It runs on every rank that hosts an engine, over that engine's shard of the prompts, and returns
the traces to train on (``rollout/samples/traces.py``). It talks to the engine in *waves*:
``ctx.generate(requests)`` sends a list of requests at once (they are batched by the engine) and
returns their generations in order. A class works too: it is built once with the options of
``--custom-generate-args key=value ...`` and then called like the function, so it can keep state
between rollouts (a replay buffer). ``ctx.mode`` is ``"train"`` or ``"eval"``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
from typing import Callable

from ..engines.interface import Generation, RolloutConfig, SampleRequest
from .data import Prompt
from .plugin_base import GeneratePlugin
from .plugins import load_plugin
from .single_turn import SingleTurn
from .rewards import RewardInput
from .traces import Call, Trace

FLAG = "--custom-generate-function-path"
_WAVE_STRIDE, _GROUP_STRIDE = 1_000_003, 100_003  # distinct sampling seeds per wave and group


@dataclasses.dataclass
class Request:
    input_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()  # stop strings (kept in the text: no_stop_trim)
    session: dict | None = None  # {"id", "rid"}: input_ids continue that session's KV


class GenerateContext:
    """What a plug-in may use on this rank: its engine(s), the tokenizer, the reward model."""

    def __init__(self, backend, cfg: RolloutConfig, tokenizer, rewards, *, mode: str = "train",
                 context_length: "int | None | Callable[[], int | None]" = None):
        self.backend, self.cfg, self.tokenizer, self.rewards = backend, cfg, tokenizer, rewards
        self.mode, self._context_length = mode, context_length
        self.waves = 0
        self.sent = 0  # requests made through this context (generate, submit)
        self.truncated = 0  # requests shortened to fit the context (APR's over-length children)

    @property
    def context_length(self) -> int | None:
        """Tokens a request may span; asked of the engine on first use when given as a
        callable (the default plug-in never asks)."""
        if callable(self._context_length):
            self._context_length = self._context_length()
        return self._context_length

    def stats(self) -> dict:
        """What the manager reports of a plug-in's requests (none made here: nothing)."""
        return {"truncated": self.truncated} if self.sent else {}

    # --- the engine --------------------------------------------------------------------------
    def generate(self, requests: list[Request]) -> list[Generation]:
        """One wave: every request in flight at once (one batch); generations in request
        order."""
        fitted = [self.fit(r) for r in requests]
        gens = self.backend.run(self._sample_requests([r for r, _ in fitted]), self.cfg)
        for gen, (r, truncated) in zip(gens, fitted):
            gen.meta["truncated"] = truncated
            gen.meta["input_ids"] = r.input_ids  # what was really sent
        self.waves += 1
        self.sent += len(requests)
        return gens

    def submit(self, request: Request, turn: int, sample: int
               ) -> "concurrent.futures.Future[Generation]":
        """One request that joins whatever the engine is running (an episode's turn), seeded by
        ``turn`` and ``sample`` (not by when it was sent: the same sample in any order)."""
        return self.submit_many([(request, turn, sample)])[0]

    def submit_many(self, turns: list[tuple[Request, int, int]]
                    ) -> "list[concurrent.futures.Future[Generation]]":
        """Several such ``(request, turn, sample)`` in one call to the engines
        (``Backend.submit_many``: the in-process engine takes them in at one step boundary)."""
        fitted = [self.fit(r) for r, _, _ in turns]
        sent = [self._sample_request(r, self._turn_seed(turn, sample))
                for (r, _), (_, turn, sample) in zip(fitted, turns)]
        self.sent += len(sent)
        futures = self.backend.submit_many(sent, self.cfg) if sent else []
        return [_annotated(f, r, truncated) for f, (r, truncated) in zip(futures, fitted)]

    def _turn_seed(self, turn: int, sample: int) -> int | None:
        if self.cfg.seed is None:
            return None
        return (self.cfg.seed + turn * _WAVE_STRIDE) % 2**31 + sample

    def _sample_request(self, r: Request, seed: int | None) -> SampleRequest:
        out = SampleRequest.of(r.input_ids, self.cfg, seed, max_new_tokens=r.max_new_tokens,
                               **({"stop": list(r.stop)} if r.stop else {}))
        out.session_params = r.session
        return out

    def _sample_requests(self, requests: list[Request]) -> list[SampleRequest]:
        """Each request with its own budget and stops; requests that share them form a group,
        seeded ``seed + wave x _WAVE_STRIDE + group x _GROUP_STRIDE`` plus their rank in it."""
        keys = [(r.max_new_tokens, r.stop) for r in requests]
        group = {key: g for g, key in enumerate(dict.fromkeys(keys))}
        rank = dict.fromkeys(group, 0)
        out = []
        for r, key in zip(requests, keys):
            out.append(self._sample_request(r, self._seed(group[key], rank[key])))
            rank[key] += 1
        return out

    def _seed(self, group: int, rank: int) -> int | None:
        if self.cfg.seed is None:
            return None
        return (self.cfg.seed + self.waves * _WAVE_STRIDE + group * _GROUP_STRIDE) % 2**31 + rank

    def fit(self, r: Request) -> tuple[Request, bool]:
        """Shorten a request that would overrun the context (flagged, never rejected): the
        prompt keeps its last tokens, the generation what room is left."""
        limit = self.context_length
        if not limit or len(r.input_ids) + r.max_new_tokens < limit:
            return r, False
        ids = r.input_ids[-(limit // 2):] if len(r.input_ids) >= limit // 2 else r.input_ids
        self.truncated += 1
        return dataclasses.replace(r, input_ids=ids,
                                   max_new_tokens=max(1, min(r.max_new_tokens, limit - len(ids) - 1))), True

    @staticmethod
    def call(gen: Generation, **fields) -> Call:
        """The trained view of a generation: the prompt it was really given (after ``fit``)."""
        return Call(gen.meta["input_ids"], gen, **fields)

    # --- text and rewards --------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def chat(self, content: str) -> list[int]:
        """A user turn through the tokenizer's chat template (plain text without one)."""
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                      tokenize=False, add_generation_prompt=True)
            return self.encode(text)
        return self.encode(content)

    def score(self, prompts: list[Prompt], texts: list[str]) -> list[float]:
        """The run's reward (``--rm-type`` / ``--custom-rm-path``) of each text."""
        items = [RewardInput(prompt=p.text, response=t, label=p.label, metadata=p.metadata)
                 for p, t in zip(prompts, texts)]
        return self.rewards.score(items) if items else []


def _annotated(future: concurrent.futures.Future, r: Request, truncated: bool
               ) -> concurrent.futures.Future:
    """``future``'s generation, marked with what was really sent (as ``generate`` marks it)."""
    outer: concurrent.futures.Future = concurrent.futures.Future()

    def done(f: concurrent.futures.Future) -> None:
        try:
            gen = f.result()
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on it
            outer.set_exception(e)
            return
        gen.meta["truncated"], gen.meta["input_ids"] = truncated, r.input_ids
        outer.set_result(gen)

    future.add_done_callback(done)
    return outer


# --- loading ---------------------------------------------------------------------------------
def parse_options(pairs: list[str] | None) -> dict:
    """``key=value`` strings -> dict; values read as JSON when they parse (numbers, booleans)."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--custom-generate-args {pair!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def load_generate_plugin(path: str, options: dict):
    """The plug-in callable: a function (options must be empty) or a class built with them."""
    return load_plugin(path, FLAG, options, "--custom-generate-args")


def rollout_metrics(plugin, traces: list[Trace]) -> dict:
    """``plugin``'s own metrics of ``traces`` (a user's plug-in has none)."""
    return plugin.metrics(traces) if isinstance(plugin, GeneratePlugin) else {}


def needs_reference(plugin) -> bool:
    """Whether the plug-in's calls carry KL coefficients (the reference model must exist)."""
    return bool(getattr(plugin, "needs_reference", False))


def run_plugin(plugin, ctx: GenerateContext, prompts: list[Prompt], n: int) -> list[Trace]:
    """``plugin``'s traces (None: the default, ``single_turn.SingleTurn``), checked."""
    traces = (SingleTurn() if plugin is None else plugin)(ctx, prompts, n)
    if not isinstance(traces, list) or not all(isinstance(t, Trace) for t in traces):
        raise TypeError(f"{FLAG}: the plug-in must return a list of Trace, got {type(traces).__name__}")
    return traces
