"""Randomized sessions under memory pressure (issue 66): seeded rounds of new sessions, turns
continued (the same turn twice: branches), plain requests sharing prompts, aborts and closes,
on a pool small enough that parked KV is dropped, and retracts that preempt what runs, for dense /
R-KV / SnapKV x keep-prompt (the chain's first prompt, or with --compress-pin-turns every turn's)
x prefix cache. The engine checks the KV ownership invariant after every step and command (conftest.py turns it on); after each round `used` is what parked
requests and the cache hold, and 0 once every session is closed. Every finished turn's
log-probs match an HF forward over its context (dense) or the replay of its eviction record
(compressed; a turn recomputed densely, or continuing a chain that was, replays dense up to
that point, as `eviction_record_dense_from` says)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest
import torch

from sglang_kvc.engine.engine import Engine
from tests.sglang_kvc.compression.test_session_compression import T, masked_logprobs

B, N, W, POOL = 10, 5, 3, 128
MAX_CONTEXT = 64  # turns past it are not continued (the pool must hold any request alone)


@dataclass
class Turn:
    rid: str
    ids: list[int]  # its whole prompt: the context it continued, then its new tokens
    session: str | None
    parent: "Turn | None"
    out: dict | None = None
    aborted: bool = False

    @property
    def context(self) -> list[int]:
        return self.ids + self.out["output_ids"]


@dataclass
class Config:
    seed: int
    algo: str | None
    keep_prompt: bool
    prefix_cache: bool
    pin_turns: bool = False  # --compress-pin-turns (with keep_prompt)

    def engine(self, path) -> Engine:
        comp = {} if self.algo is None else dict(
            compress_algorithm=self.algo, compress_max_prompt=B, compress_divide_length=N,
            compress_max_window=W, compress_keep_prompt=self.keep_prompt,
            compress_pin_turns=self.pin_turns)
        return Engine(model_path=str(path), device="cpu", dtype="float32", max_total_tokens=POOL,
                      max_running_requests=6, disable_radix_cache=not self.prefix_cache,
                      disable_overlap_schedule=self.seed % 2 == 1, random_seed=self.seed, **comp)


class Driver:
    """Random rounds against one engine; remembers every turn for the references."""

    def __init__(self, eng: Engine, cfg: Config):
        self.eng, self.cfg, self.rng = eng, cfg, random.Random(cfg.seed)
        self.turns: list[Turn] = []
        self.open: set[str] = set()
        self.prompts = [self.tokens(self.rng.randint(8, 24)) for _ in range(3)]
        self.adopted, self.preempted, self.drops = set(), set(), 0
        self._ids = itertools.count()
        self._watch()

    def _watch(self) -> None:
        """Note which continuations adopted parked KV and which requests were preempted (the
        replay needs to know where a chain was recomputed densely)."""
        sessions, sch = self.eng.sessions, self.eng.scheduler
        adopt, preempt, reclaim = sessions.adopt, sch.preempt, sch.reclaim

        def adopting(seq):
            adopt(seq)
            if seq.adopted_kv:
                self.adopted.add(seq.rid)

        def preempting(seq):
            self.preempted.add(seq.rid)
            preempt(seq)

        def reclaiming():
            dropped = reclaim()
            self.drops += dropped
            return dropped

        sessions.adopt, sch.preempt, sch.reclaim = adopting, preempting, reclaiming

    def tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(3, 200) for _ in range(n)]

    # ------------------------------------------------------------ one round

    def round(self) -> None:
        if self.open and self.rng.random() < 0.15:
            sid = self.rng.choice(sorted(self.open))
            self.eng.close_session(sid)
            self.open.discard(sid)
            return
        batch = [self._make() for _ in range(self.rng.randint(1, 5))]
        futures = [self.eng.submit_generate(body)[0] for _, body in batch]
        if self.rng.random() < 0.3:
            victim = self.rng.choice(batch)[0]
            self.eng.abort_request(victim.rid)
        if self.rng.random() < 0.3:  # whatever runs then is preempted, recomputed when readmitted
            self.eng.pause_generation("retract")
            self.eng.continue_generation()
        for (turn, _), fut in zip(batch, futures):
            turn.out = fut.result()
            reason = turn.out["meta_info"]["finish_reason"]
            assert reason["type"] != "error", reason  # a broken invariant ends the engine
            turn.aborted = reason["type"] == "abort"
            self.turns.append(turn)

    def _make(self) -> tuple[Turn, dict]:
        rid = f"r{next(self._ids)}"
        body = {"rid": rid, "return_logprob": True, "sampling_params": {
            "temperature": T, "max_new_tokens": self.rng.randint(3, 16), "ignore_eos": True,
            "sampling_seed": self.rng.randrange(1 << 30)}}
        pick = self.rng.random()
        parents = [t for t in self.turns if t.session in self.open and not t.aborted
                   and len(t.context) <= MAX_CONTEXT]
        if parents and pick < 0.5:  # continue a turn: any one, continued before or not
            parent = self.rng.choice(parents)
            new = self.tokens(self.rng.randint(3, 8))
            turn = Turn(rid, parent.context + new, parent.session, parent)
            body.update(input_ids=new, session_params={"id": parent.session, "rid": parent.rid})
        elif pick < 0.8:  # a new session from one of a few prompts (the cache shares them)
            sid = self.eng.open_session()
            self.open.add(sid)
            ids = list(self.rng.choice(self.prompts))
            turn = Turn(rid, ids, sid, None)
            body.update(input_ids=ids, session_params={"id": sid})
        else:  # a plain dense request reading a shared prompt, then its own tokens
            ids = self.rng.choice(self.prompts) + self.tokens(self.rng.randint(1, 6))
            turn = Turn(rid, ids, None, None)
            body.update(input_ids=ids, compress=False)
        if self.compressed(turn):
            body["return_eviction_record"] = True
        return turn, body

    def compressed(self, turn: Turn) -> bool:
        return self.cfg.algo is not None and turn.session is not None

    # ------------------------------------------------------------ checks

    def check_counts(self) -> None:
        """`used` = parked requests' own slots + the cache's locked slots (nothing runs now)."""
        assert self.eng.is_alive(), "the engine thread died (see its log)"
        info = self.eng.get_server_info()
        cache = info.get("prefix_cache")
        locked = cache["cached_tokens"] - cache["evictable_tokens"] if cache else 0
        assert info["kv_pool"]["used"] == info["sessions"]["parked_slots"] + locked >= 0

    def dense_from(self, turn: Turn):
        """Where the turn's chain was last recomputed densely (None: never; "?": a compressed
        request preempted mid-turn, whose resume point the driver does not know)."""
        if turn.rid in self.preempted:
            return "?"
        if turn.parent is None:
            return None
        if turn.rid not in self.adopted:
            return len(turn.ids) - 1  # its context prefilled again: dense up to its first draw
        return self.dense_from(turn.parent)


def hf_logprobs(model, ids: list[int], ctx: int, record=None) -> torch.Tensor:
    """Log-probs (temperature T) of ids[ctx:] from an HF forward: dense, or with every layer and
    KV head seeing the keys `record` says."""
    if record is not None:
        return masked_logprobs(model, ids, record)[ctx - 1:]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, ctx - 1:-1].float()
    return torch.log_softmax(logits / T, -1).gather(1, torch.tensor(ids[ctx:])[:, None])[:, 0]


def check_turn(drv: Driver, model, turn: Turn) -> bool:
    """The turn's log-probs against its reference; False when it has none (see dense_from)."""
    ids, ctx = turn.context, len(turn.ids)
    got = torch.tensor([x[0] for x in turn.out["meta_info"]["output_token_logprobs"]])
    record = None
    if drv.compressed(turn):
        record = turn.out["meta_info"]["eviction_record"]
        if drv.cfg.pin_turns:
            check_pinned(turn, record)
        d = drv.dense_from(turn)
        if d == "?":
            return False
        if d is not None:  # keys evicted before the recompute were computed again, densely
            record = torch.where(record <= d, record.shape[-1], record.long())
    want = hf_logprobs(model, ids, ctx, record)
    err = (got - want).abs().max().item()
    assert err < 2e-4, f"{turn.rid} ({'recomputed' if turn.rid not in drv.adopted else 'adopted'}" \
                       f" continuation of {turn.parent and turn.parent.rid}): log-prob error {err}"
    return True


def check_pinned(turn: Turn, record: torch.Tensor) -> None:
    """--compress-pin-turns: no key of any turn's new tokens in the chain (the first prompt,
    each observation) was ever evicted, whether the turn adopted, recomputed or was preempted."""
    total, t = record.shape[-1], turn
    while t is not None:
        start = len(t.parent.context) if t.parent is not None else 0
        assert (record[..., start:len(t.ids)] == total).all(), f"{turn.rid}: {t.rid}'s tokens evicted"
        t = t.parent


@pytest.fixture(scope="module")
def eager_model(tiny_models):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_models["qwen2.5"], dtype=torch.float32,
                                                attn_implementation="eager").eval()


def drive(cfg: Config, tiny_models, model, rounds: int) -> Driver:
    with cfg.engine(tiny_models["qwen2.5"]) as eng:
        drv = Driver(eng, cfg)
        for _ in range(rounds):
            drv.round()
            drv.check_counts()
        for sid in sorted(drv.open):
            eng.close_session(sid)
        assert eng.get_server_info()["kv_pool"]["used"] == 0
        drv.stats = {"turns": len(drv.turns), "aborted": sum(t.aborted for t in drv.turns),
                     "recomputed": sum(t.parent is not None and t.rid not in drv.adopted
                                       for t in drv.turns),
                     "preempted": len(drv.preempted), "dropped": drv.drops}
    finished = [t for t in drv.turns if not t.aborted]
    checked = sum(check_turn(drv, model, t) for t in finished)
    assert checked >= len(finished) // 2, (checked, len(finished))
    print(cfg, drv.stats, "checked", checked)
    return drv


DEFAULT = [Config(0, "rkv", True, True), Config(1, "snapkv", True, True),
           Config(2, None, False, True), Config(3, "rkv", True, True, pin_turns=True)]
SLOW = [Config(seed, algo, keep, cache) for seed in (10, 11)
        for algo, keep in [(None, False), ("rkv", False), ("rkv", True), ("snapkv", False),
                           ("snapkv", True)]
        for cache in (True, False)] + [Config(seed, algo, True, cache, pin_turns=True)
                                       for seed in (12, 13) for algo in ("rkv", "snapkv")
                                       for cache in (True, False)]


@pytest.mark.parametrize("cfg", DEFAULT, ids=lambda c: f"{c.algo}-keep{c.keep_prompt}{'-pin' * c.pin_turns}-cache{c.prefix_cache}-s{c.seed}")
def test_random_sessions_keep_one_owner_per_slot(tiny_models, eager_model, cfg):
    drv = drive(cfg, tiny_models, eager_model, rounds=10)
    # the rounds reached what they are for: branches / dropped KV recomputed, and aborts
    assert any(t.parent is not None and t.rid not in drv.adopted for t in drv.turns)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", SLOW, ids=lambda c: f"{c.algo}-keep{c.keep_prompt}{'-pin' * c.pin_turns}-cache{c.prefix_cache}-s{c.seed}")
def test_random_sessions_more_seeds(tiny_models, eager_model, cfg):
    drive(cfg, tiny_models, eager_model, rounds=16)
