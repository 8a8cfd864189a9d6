"""The captured prefill path (prefill_graph.PrefillGraphs) on the CPU, capture and replay emulated
by calling the captured body: static buffers, padded token counts (padding tokens into slot 0),
padded work lists and the paged extend kernel (under the Triton interpreter) must give the eager
engine's tokens and log-probs, over batched session continuations and over fresh requests whose
prompts are all cached. The GPU test (test_engine_gpu) replays real graphs.

Needs TRITON_INTERPRET=1 with triton importable (the kernel runs in the interpreter); skipped
otherwise."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import pytest
import torch

from sglang_kvc.engine.engine import Engine
from sglang_kvc.engine.prefill_graph import PrefillGraphs, prefill_graph_sizes
from sglang_kvc.layers.attention import TorchAttention, TritonAttention

from .test_graph_step_logic import _Replay

INTERPRET = importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1"
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 5}


def test_prefill_graph_sizes_pad_at_most_half():
    sizes = prefill_graph_sizes(8192)
    assert sizes[:6] == [64, 96, 128, 192, 256, 384] and sizes[-1] == 8192
    assert all(b <= a * 3 // 2 for a, b in zip(sizes, sizes[1:]))
    assert prefill_graph_sizes(100) == [64, 96, 100] and prefill_graph_sizes(64) == [64]


class EmulatedPrefillGraphs(PrefillGraphs):
    def _capture(self, size):
        warm = self._body(size)  # as the real warm-up: computes the step once
        g = _Replay(lambda: self._body(size), torch.zeros_like(warm))
        self.graphs[size] = (g, g.out)
        self.num_captures += 1


class KernelForHeldKV(TritonAttention):
    """The Triton backend's prefill with held KV (the paged kernel), the torch backend's RoPE and
    decode: the CPU runs the kernel under the interpreter and nothing else Triton."""
    forward_rotary = TorchAttention.forward_rotary
    decode = TorchAttention.decode


def _workload(eng: Engine) -> list:
    """12 sessions: a first turn, then two batched continuations (every row holds KV: graphed),
    then the first prompts again as fresh requests (all cached: graphed too, a smaller padded
    size whose padding covers the larger step's slots, which the sessions still hold), then one
    more continuation that reads those slots."""
    g = torch.Generator().manual_seed(0)
    ids = lambda lo, hi: torch.randint(3, 200, (int(torch.randint(lo, hi, (1,), generator=g)),),
                                      generator=g).tolist()
    prompts = [ids(6, 30) for _ in range(12)]
    sids = eng.open_sessions(12)
    outs = [eng.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True,
                         session_params=[{"id": s} for s in sids])]
    for lo, hi in ((3, 12), (10, 25)):
        prev = outs[-1]
        outs.append(eng.generate(input_ids=[ids(lo, hi) for _ in sids], sampling_params=GREEDY,
                                 return_logprob=True,
                                 session_params=[{"id": s, "rid": o["meta_info"]["id"]} for s, o in zip(sids, prev)]))
    outs.append(eng.generate(input_ids=prompts, sampling_params=GREEDY, return_logprob=True))
    outs.append(eng.generate(input_ids=[ids(2, 6) for _ in sids], sampling_params=GREEDY, return_logprob=True,
                             session_params=[{"id": s, "rid": o["meta_info"]["id"]} for s, o in zip(sids, outs[2])]))
    return [(o["output_ids"], [x[0] for x in o["meta_info"]["output_token_logprobs"]])
            for batch in outs for o in batch]


@dataclass
class Runs:
    want: list  # the plain engine's (tokens, log-probs) of the workload
    got: list  # the same with the kernel for held KV and the emulated graphs
    stats: dict  # the graphs' get_server_info entry
    graphs: PrefillGraphs
    attn: KernelForHeldKV
    compressions: int  # the plain engine's


def _runs(tiny_models, graphs_cls=None, head_dim=None, **extra) -> Runs:
    """The workload on the plain CPU engine, then on one whose held-KV prefills take the paged
    kernel and `graphs_cls` (EmulatedPrefillGraphs by default); `head_dim` fakes another head
    size on the attention."""
    make = lambda: Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", dtype="float32", **extra)
    with make() as eng:
        want = _workload(eng)
        compressions = eng.get_server_info().get("compression", {}).get("num_compressions", 0)
    with make() as eng:
        r = eng.runner
        ring, r.attn = r.attn.ring, KernelForHeldKV(eng.kv, r.cfg.num_heads, r.cfg.head_dim)
        r.attn.ring = ring
        r.attn.head_dim = head_dim or r.attn.head_dim
        cls = graphs_cls or EmulatedPrefillGraphs
        graphs = r.prefill_graphs = cls(r.graph_parts(), 256, eng.kv.req_to_token.table.shape[0])
        got = _workload(eng)
        stats = eng.get_server_info()["prefill_graphs"]
    return Runs(want, got, stats, graphs, r.attn, compressions)


def _assert_same(runs: Runs) -> None:
    assert [ids for ids, _ in runs.got] == [ids for ids, _ in runs.want]
    for (_, lp_got), (_, lp_want) in zip(runs.got, runs.want):
        assert lp_got == pytest.approx(lp_want, abs=1e-5)


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 and triton")
@pytest.mark.parametrize("extra", [{}, {"compress_algorithm": "rkv", "compress_max_prompt": 12,
                                        "compress_divide_length": 4, "compress_max_window": 3}],
                         ids=["dense", "rkv"])
def test_graphed_prefill_logic_matches_eager(tiny_models, extra):
    """R-KV: the captured step also fills the query ring (padded records into row 0), which the
    compressions after it score with."""
    runs = _runs(tiny_models, **extra)
    _assert_same(runs)
    # four graphed steps (three continuations, the cached prompts) at more than one padded size
    stats, graphs = runs.stats, runs.graphs
    assert stats["replays"] >= 4 and len(graphs.graphs) >= 2 and stats["deferred"] == 0
    assert (graphs.records is not None) == bool(extra) and (runs.compressions > 0 or not extra)


def test_a_negative_prefill_graph_limit_names_the_flag():
    from sglang_kvc.server_args import ServerArgs

    with pytest.raises(ValueError, match="--prefill-graph-max-tokens must be >= 0"):
        ServerArgs(model_path="x", prefill_graph_max_tokens=-1)
    assert ServerArgs(model_path="x", prefill_graph_max_tokens=0).prefill_graph_max_tokens == 0


class OutOfMemoryAtCapture(EmulatedPrefillGraphs):
    def _capture(self, size):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 and triton")
def test_a_capture_out_of_memory_turns_the_graphs_off_and_the_step_runs_eagerly(tiny_models):
    """The graph pool keeps a capture's activations, so a large size may not fit beside a pool
    sized to the card: the engine keeps serving, eagerly, with the same outputs."""
    runs = _runs(tiny_models, OutOfMemoryAtCapture)
    assert [ids for ids, _ in runs.got] == [ids for ids, _ in runs.want]
    assert runs.stats["replays"] == 0 and "ran out of memory" in runs.stats["off"]


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 and triton")
def test_a_head_size_the_kernel_does_not_take_runs_prefills_eagerly(tiny_models):
    """The kernel takes power-of-two head sizes: for another (24 here, as a model with such heads
    would have) held-KV prefills take the torch path and are never captured, since a captured
    step carries only the kernel's layout. Same outputs as the plain engine."""
    runs = _runs(tiny_models, head_dim=24)
    assert not runs.attn.paged_extend() and runs.graphs.replays == 0 and not runs.graphs.graphs
    _assert_same(runs)
