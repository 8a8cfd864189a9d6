"""The host side of a graphed decode step, on the CPU: which captured size a batch runs in, the
packed static-buffer loads (one staged copy) against the per-field copies they replaced, slot 0
for padding entries whatever batch came before, the numpy parse of the outputs against the
torch one, and per-batch values that build no device tensors until an eager step asks."""

from __future__ import annotations

import pytest
import torch

from sglang_kvc.engine.cuda_graph import DecodeGraphs, GraphParts, graph_sizes, padded_size
from sglang_kvc.engine.sampling_params import SamplingParams
from sglang_kvc.engine.sequence import Sequence
from sglang_kvc.engine.step_io import BatchTensors, PinnedStage, parse_outputs, top_k_bound
from sglang_kvc.server_args import ServerArgs, parse_batch_sizes

V = 1000


class FakeKV:
    """What a step's load touches of the KV cache: one new slot per request, counted."""

    def __init__(self):
        self.next = 100

    def alloc_one(self, seqs):
        slots = torch.arange(self.next, self.next + len(seqs))
        self.next += len(seqs)
        for s in seqs:
            s.kv_len += 1
        return slots


def graphs(sizes=None, max_bs=32) -> DecodeGraphs:
    parts = GraphParts(torch.device("cpu"), V, FakeKV(), None, None, None, None)
    return DecodeGraphs(parts, max_bs, sizes)


def seqs(n: int, start: int = 0) -> list[Sequence]:
    out = []
    for i in range(start, start + n):
        params = SamplingParams(temperature=0.5 * (i % 3), top_k=(i % 4) * 5, top_p=0.9,
                                min_p=0.01 * (i % 2), max_new_tokens=64, min_new_tokens=i % 2)
        s = Sequence(f"r{i}", [1, 2, 3], params, seed=1000 + i, return_logprob=i % 2 == 0,
                     top_logprobs_num=i % 3)
        s.row, s.kv_len, s.num_computed, s.num_sampled = i + 1, 50 + i, 70 + i, 5 + i
        out.append(s)
    return out


def test_default_ladder_is_dense_at_small_batch():
    assert graph_sizes(256) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, *range(48, 257, 16)]
    assert graph_sizes(20) == [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20]  # the largest batch has one
    assert graph_sizes(32, [40, 3, 1, 3]) == [1, 3]  # --cuda-graph-bs, capped by the max
    with pytest.raises(ValueError, match="cuda-graph-bs"):
        graph_sizes(8, [16])


@pytest.mark.parametrize("sizes", [graph_sizes(256), graph_sizes(32, list(range(1, 33))), [1, 2, 4, 8, 16]])
def test_a_batch_runs_in_the_smallest_size_that_holds_it(sizes):
    for bs in range(1, sizes[-1] + 1):
        assert padded_size(sizes, bs) == min(s for s in sizes if s >= bs)
    if sizes == graph_sizes(256):
        assert max(padded_size(sizes, bs) / bs for bs in range(1, 33)) == 24 / 17
        assert all(padded_size(sizes, bs) == bs for bs in range(1, 9))


def test_cuda_graph_bs_flag():
    assert parse_batch_sizes("1-4, 8,6,3") == [1, 2, 3, 4, 6, 8]
    for bad in ("0", "4-2", "x", "1,,2"):
        with pytest.raises(ValueError, match="cuda-graph-bs"):
            parse_batch_sizes(bad)
    with pytest.raises(ValueError, match="cuda-graph-bs"):
        ServerArgs(model_path="m", cuda_graph_bs="1-x")


def _old_step_ints(batch, gbs):
    """The per-field layout the step used to copy: [4, gbs] int64 with padding (0, 1, 0, 0)."""
    pad = gbs - len(batch)
    return torch.tensor([[s.num_computed for s in batch] + [0] * pad,
                         [s.kv_len + 1 for s in batch] + [1] * pad,
                         [s.num_sampled for s in batch] + [0] * pad,
                         [s.row for s in batch] + [0] * pad], dtype=torch.int64)


def _old_params(batch, gbs):
    from sglang_kvc.engine.step_io import sampling_columns

    floats, ints = sampling_columns(batch, V)
    pad = gbs - len(batch)
    fl = [col + [v] * pad for col, v in zip(floats, (0.0, 1.0, 0.0, 1.0, 0.0))]
    it = [col + [v] * pad for col, v in zip(ints, (V, 0, 0))]
    return torch.tensor(fl, dtype=torch.float32), torch.tensor(it, dtype=torch.int64)


@pytest.mark.parametrize("bs", [1, 3, 5, 9, 16, 17, 32])
def test_staged_loads_equal_the_per_field_copies(bs):
    g, batch = graphs(), seqs(bs)
    gbs = g.padded(bs)
    want_ints = _old_step_ints(batch, gbs)  # before the load counts the new token
    want_f, want_i = _old_params(batch, gbs)
    bt = BatchTensors((0, False, bs), batch, torch.device("cpu"), V)
    g._load(batch, bt, gbs)
    ints, f, i = g._inputs(gbs)
    assert torch.equal(ints, want_ints) and torch.equal(f, want_f) and torch.equal(i, want_i)
    # the load takes the new slots; the runner counts the fed token once the step is launched
    assert [s.kv_len for s in batch] == [51 + k for k in range(bs)]
    assert [s.num_computed for s in batch] == [70 + k for k in range(bs)]


def test_parameters_reload_when_the_batch_object_changes():
    g, batch = graphs(), seqs(3)
    bt = BatchTensors((-1, False, 3), batch, torch.device("cpu"), V)
    g._load(batch, bt, 4)
    other = seqs(3, start=7)  # same key (version -1, length 3), other requests
    g._load(other, BatchTensors((-1, False, 3), other, torch.device("cpu"), V), 4)
    assert torch.equal(g._inputs(4)[1], _old_params(other, 4)[0])


def test_padding_entries_get_slot_zero_whatever_batch_came_before():
    """3 rows in the 4-graph, 5 in the 8-graph, 3 again: the padding entry of the last step
    must not keep the 4th slot of the 5-row step (that slot may belong to another request by
    then, and a padding entry writes its K/V there)."""
    g = graphs(sizes=[1, 2, 4, 8])
    for bs in (3, 5, 3, 8, 1, 2, 8, 7):
        batch = seqs(bs)
        gbs = g.padded(bs)
        g._load_slots(batch, gbs)
        assert (g.out_slots[:bs] > 0).all() and (g.out_slots[bs:gbs] == 0).all(), (bs, g.out_slots)


def test_pinned_stage_alternates_buffers_and_keeps_earlier_values():
    dst = torch.zeros(8, dtype=torch.int64)
    stage = PinnedStage(dst)
    stage.send([1, 2, 3])
    stage.send([4, 5])
    assert dst.tolist() == [4, 5, 3, 0, 0, 0, 0, 0] and stage.next == 0
    assert stage.arrays[0][:3].tolist() == [1, 2, 3]  # the other buffer: not rewritten


def _old_parse(host: torch.Tensor, has_lp: bool, top_k: int):
    cols = host.t()
    ids, hits = cols[0].long().tolist(), cols[1].bool().tolist()
    lps = cols[2].tolist() if has_lp else None
    tops = None
    if top_k:
        c = 2 + has_lp
        tv, ti = host[:, c:c + top_k].tolist(), host[:, c + top_k:].long().tolist()
        tops = [list(zip(v, i)) for v, i in zip(tv, ti)]
    return ids, lps, tops, hits


@pytest.mark.parametrize("has_lp,top_k", [(False, 0), (True, 0), (True, 3)])
def test_numpy_parse_equals_the_torch_parse(has_lp, top_k):
    g = torch.Generator().manual_seed(0)
    B = 7
    cols = [torch.randint(0, 151936, (B,), generator=g).double(), (torch.arange(B) % 2).double()]
    if has_lp:
        cols.append(-torch.rand(B, generator=g, dtype=torch.float64) * 20)
    packed = torch.stack(cols, dim=1)
    if top_k:
        tops = [-torch.rand(B, top_k, generator=g, dtype=torch.float64),
                torch.randint(0, 151936, (B, top_k), generator=g).double()]
        packed = torch.cat([packed, *tops], dim=1)
    out = parse_outputs(packed.numpy(), has_lp, top_k, {})
    assert (out.token_ids, out.logprobs, out.top_logprobs, out.stop_hits) == _old_parse(packed, has_lp, top_k)
    assert all(type(t) is int for t in out.token_ids) and all(type(h) is bool for h in out.stop_hits)


def test_batch_values_build_device_tensors_only_when_asked():
    batch = seqs(5)
    bt = BatchTensors((0, False, 5), batch, torch.device("cpu"), V)
    assert bt.mode == (False, True, True, 2, None)  # all_greedy, need_filter, logprobs, top n,
    # k_max: None, as a filtered row has no top_k
    assert [i for i, _ in bt.min_new] == [1, 3]
    assert "rows" not in bt.__dict__ and "sampling" not in bt.__dict__  # graphed steps: never
    sb = bt.sampling
    want_f, want_i = _old_params(batch, 5)
    assert torch.equal(bt.rows, torch.tensor([1, 2, 3, 4, 5]))
    assert torch.equal(sb.temperatures, want_f[0]) and torch.equal(sb.top_k, want_i[0])
    assert torch.equal(sb.filtered, want_i[2] > 0) and torch.equal(sb.sampled, want_f[4] > 0)
    assert (sb.all_greedy, sb.need_filter, sb.need_logprobs, sb.top_logprobs_num, sb.k_max) == bt.mode


def test_top_k_bound_covers_every_filtered_row():
    """ints = (top_k or the vocabulary, seed, filtered): the bound is the filtered rows' largest
    top_k rounded up to a power of two; unfiltered rows (greedy, no filter) do not count."""
    assert top_k_bound([[20, 5, 1000], [0, 0, 0], [1, 1, 0]], 1000) == 32
    assert top_k_bound([[64, 3], [0, 0], [1, 1]], 1000) == 64
    assert top_k_bound([[1, 1000], [0, 0], [1, 1]], 1000) is None  # a top-p-only row
    assert top_k_bound([[600], [0], [1]], 1000) is None  # rounded up past the vocabulary
    assert top_k_bound([[5], [0], [0]], 1000) is None  # nothing filtered
