"""Every SDPA call of the attention layer runs with cuDNN attention off (layers/attention.py:
cuDNN builds one execution graph per problem shape, and prefill shapes change every step, so a
multi-turn continuation prefill paid new builds each step on sm90). Checked on the mechanism,
not on timing: a recorder in place of F.scaled_dot_product_attention reads torch's cuDNN SDPA
flag at each call, through the prefill (plain and with held KV) and decode paths, and in an
engine's session continuation; outputs are compared with a per-request dense reference so the
wrapper is known to return the real attention.

Mutation check: calling F.scaled_dot_product_attention directly again (no `sdpa`) makes every
recorded flag True and fails the tests below."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_kvc.engine.step_io import extend_layout, prefill_layout
from sglang_kvc.kvcache.kv_cache import KVCache, KVPool
from sglang_kvc.layers import attention
from sglang_kvc.layers.attention import AttentionMetadata, TorchAttention

HQ, HKV, D = 4, 2, 8


@pytest.fixture
def recorder(monkeypatch):
    """(cuDNN SDPA flag, had a mask) of every SDPA call while active."""
    seen, real = [], F.scaled_dot_product_attention

    def record(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), kwargs.get("attn_mask") is not None))
        return real(*args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    return seen


def _dense_causal(q, k, v, held_k, held_v):
    """One request: new queries over [held | new] keys, causal over the new ones."""
    kk, vv = torch.cat([held_k, k]), torch.cat([held_v, v])
    p, n = held_k.shape[0], q.shape[0]
    mask = torch.arange(p + n)[None, :] <= (p + torch.arange(n))[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk.transpose(0, 1)[None],
                                         vv.transpose(0, 1)[None], attn_mask=mask,
                                         scale=D ** -0.5, enable_gqa=True)
    return out[0].transpose(0, 1)


def _prefill_with_held_kv(counts, held):
    """A prefill of len(counts) requests, request i holding held[i] slots already."""
    g = torch.Generator().manual_seed(0)
    pool = KVPool(256, 1, HKV, D, torch.float32, torch.device("cpu"))
    kv = KVCache(pool, max_requests=len(counts), max_len=64)
    rows = list(range(1, len(counts) + 1))
    hk, hv = [], []
    for r, p in zip(rows, held):
        slots = kv.allocator.alloc(p)
        kv.req_to_token.table[r, :p] = slots.int()
        k, v = torch.randn(p, HKV, D, generator=g), torch.randn(p, HKV, D, generator=g)
        pool.write(0, slots, k, v)
        hk.append(k)
        hv.append(v)
    T = sum(counts)
    q, k, v = (torch.randn(T, h, D, generator=g) for h in (HQ, HKV, HKV))
    out_slots = kv.allocator.alloc(T)
    starts = [sum(counts[:i]) for i in range(len(counts))]
    for r, p, st, n in zip(rows, held, starts, counts):
        kv.req_to_token.table[r, p:p + n] = out_slots[st:st + n].int()
    _, pad_index, pad_rows = prefill_layout(counts, held, "cpu")
    meta = AttentionMetadata(True, out_slots, pad_index=pad_index, pad_rows=pad_rows,
                             extend=extend_layout(counts, held, rows, "cpu"))
    return kv, meta, (q, k, v), (hk, hv), starts


def test_prefill_with_held_kv_runs_without_cudnn_and_matches_dense(recorder):
    counts, held = [5, 3, 7], [0, 6, 11]
    kv, meta, (q, k, v), (hk, hv), starts = _prefill_with_held_kv(counts, held)
    attn = TorchAttention(kv, HQ, D)
    attn.meta = meta
    out = attn.forward(0, q, k, v)
    assert recorder == [(False, False), (False, True)]  # the causal prefill, then the held-KV one
    assert torch.backends.cuda.cudnn_sdp_enabled()  # given back after each call
    for i, (st, n) in enumerate(zip(starts, counts)):
        want = _dense_causal(q[st:st + n], k[st:st + n], v[st:st + n], hk[i], hv[i])
        torch.testing.assert_close(out[st:st + n], want, rtol=1e-5, atol=1e-5)


def test_prefill_of_continuations_only_skips_the_causal_pass(recorder):
    """Every request holds KV (multi-turn continuations): the masked call alone gives every
    token's output, so the causal pass over the new tokens, overwritten whole, does not run."""
    counts, held = [5, 3, 7], [2, 6, 11]
    kv, meta, (q, k, v), (hk, hv), starts = _prefill_with_held_kv(counts, held)
    assert meta.extend.every
    attn = TorchAttention(kv, HQ, D)
    attn.meta = meta
    out = attn.forward(0, q, k, v)
    assert recorder == [(False, True)]
    for i, (st, n) in enumerate(zip(starts, counts)):
        want = _dense_causal(q[st:st + n], k[st:st + n], v[st:st + n], hk[i], hv[i])
        torch.testing.assert_close(out[st:st + n], want, rtol=1e-5, atol=1e-5)


def test_expanded_kv_heads_equal_grouped_attention():
    """expand_kv_heads (the masked call's K/V on CUDA, so the one-kernel path takes it) keeps
    enable_gqa's grouping: query head h reads KV head h // (HQ // HKV)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 5, D, generator=g)
    k, v = torch.randn(2, 2, 9, D, generator=g), torch.randn(2, 2, 9, D, generator=g)
    mask = torch.rand(2, 1, 5, 9, generator=g) > 0.3
    mask[..., 0] = True
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    got = F.scaled_dot_product_attention(q, attention.expand_kv_heads(k, 6),
                                         attention.expand_kv_heads(v, 6), attn_mask=mask)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_decode_runs_without_cudnn(recorder):
    counts, held = [1, 1], [4, 9]
    kv, _, (q, _, _), _, _ = _prefill_with_held_kv(counts, held)
    attn = TorchAttention(kv, HQ, D)
    attn.meta = AttentionMetadata(False, torch.tensor([0, 0]), rows=torch.tensor([1, 2]),
                                  kv_lens=torch.tensor([5, 10], dtype=torch.int32), max_kv_len=10)
    attn.decode(0, q)
    assert recorder == [(False, True)]


def test_a_flag_turned_off_by_the_caller_stays_off(recorder):
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        x = torch.randn(1, 2, 3, D)
        attention.sdpa(x, x, x)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)
    assert recorder == [(False, False)]


def test_the_flag_comes_back_when_sdpa_raises():
    with pytest.raises(RuntimeError):
        attention.sdpa(torch.randn(1, 2, 3, D), torch.randn(1, 2, 4, D + 1), torch.randn(1, 2, 4, D))
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_session_continuation_prefills_without_cudnn(recorder, tiny_models):
    from sglang_kvc.engine.engine import Engine

    greedy = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 3}
    with Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", dtype="float32") as eng:
        sid = eng.open_session()
        first = eng.generate(input_ids=list(range(3, 14)), sampling_params=greedy,
                             session_params={"id": sid})
        eng.generate(input_ids=list(range(20, 25)), sampling_params=greedy,
                     session_params={"id": sid, "rid": first["meta_info"]["id"]})
        eng.close_session(sid)
    assert any(masked for _, masked in recorder)  # the continuation attended to its held KV
    assert not any(flag for flag, _ in recorder)


@pytest.fixture
def cudnn_allowed():
    """set_cudnn_sdp(True) for one test, the default (off) given back after."""
    attention.set_cudnn_sdp(True)
    yield
    attention.set_cudnn_sdp(False)


def test_cudnn_on_leaves_torchs_flag_and_the_same_outputs(recorder, cudnn_allowed):
    counts, held = [5, 3, 7], [0, 6, 11]
    kv, meta, (q, k, v), (hk, hv), starts = _prefill_with_held_kv(counts, held)
    attn = TorchAttention(kv, HQ, D)
    attn.meta = meta
    out = attn.forward(0, q, k, v)
    assert recorder == [(True, False), (True, True)]  # torch's own choice, cuDNN allowed
    for i, (st, n) in enumerate(zip(starts, counts)):
        want = _dense_causal(q[st:st + n], k[st:st + n], v[st:st + n], hk[i], hv[i])
        torch.testing.assert_close(out[st:st + n], want, rtol=1e-5, atol=1e-5)


def test_the_toggle_reaches_the_engine_thread(recorder, tiny_models, cudnn_allowed):
    """set_cudnn_sdp from the caller's thread is what the engine thread's calls see."""
    from sglang_kvc.engine.engine import Engine

    greedy = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 2}
    with Engine(model_path=str(tiny_models["qwen2.5"]), device="cpu", dtype="float32") as eng:
        eng.generate(input_ids=list(range(3, 9)), sampling_params=greedy)
        attention.set_cudnn_sdp(False)
        count = len(recorder)
        eng.generate(input_ids=list(range(3, 9)), sampling_params=greedy)
    assert recorder[:count] and all(flag for flag, _ in recorder[:count])
    assert recorder[count:] and not any(flag for flag, _ in recorder[count:])


@pytest.mark.parametrize("value, allowed", [(None, False), ("0", False), ("off", False),
                                            ("1", True), ("On", True), ("true", True)])
def test_the_environment_sets_the_default(value, allowed):
    env = {} if value is None else {attention.CUDNN_SDP_ENV: value}
    assert attention.cudnn_sdp_from_env(env) is allowed


def test_a_bad_environment_value_names_the_variable():
    with pytest.raises(ValueError, match="SGLANG_KVC_CUDNN_SDP"):
        attention.cudnn_sdp_from_env({attention.CUDNN_SDP_ENV: "maybe"})


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("0", False), ("off", False), ("1", True)])
def test_the_paged_extend_switch_reads_the_environment(value, on):
    env = {} if value is None else {attention.PAGED_EXTEND_ENV: value}
    assert attention.env_flag(attention.PAGED_EXTEND_ENV, True, env) is on


def test_paged_extend_off_takes_the_torch_path_on_the_triton_backend(recorder, monkeypatch):
    """SGLANG_KVC_PAGED_EXTEND=0: the Triton backend's held-KV prefill is the torch backend's
    (its masked SDPA call runs, the paged kernel is never imported), with the same outputs."""
    from sglang_kvc.layers.attention import TritonAttention

    monkeypatch.setattr(attention, "_paged_extend", False)
    counts, held = [5, 3], [2, 6]
    outs = []
    for backend in (TorchAttention, TritonAttention):
        kv, meta, (q, k, v), _, _ = _prefill_with_held_kv(counts, held)
        attn = backend(kv, HQ, D)
        attn.meta = meta
        outs.append(attn.forward(0, q, k, v))  # store, then attend (no RoPE: not forward_rotary)
    assert recorder == [(False, True)] * 2
    assert torch.equal(outs[0], outs[1])
