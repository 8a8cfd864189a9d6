"""The fused sampling kernels (layers/sampling_kernels.py) behind Sampler, against Sampler's torch
path, against float64 math, and against the distribution they should sample.

Tiers:
- CPU (always): the kernels' torch oracle equals Sampler's torch path bit for bit.
- Triton interpreter (CPU; triton importable and TRITON_INTERPRET=1, where the Sampler's gate
  routes CPU tensors to the kernels): small vocabularies, chunks shrunk so rows span several.
- GPU (`gpu` marker, skipped without CUDA): the Qwen vocabulary, bf16, CUDA-graph replay.

Ids are compared where they are determined: the torch path and the kernels sum the CDF in
different orders, so a draw may differ where u sits within float rounding of a CDF boundary.
A float64 CDF tells those draws apart (margin below MARGIN of the total); every other draw must
match the torch path and the float64 draw exactly, and all but 1% must match overall.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from sglang_kvc.engine import sampler as sampler_mod
from sglang_kvc.engine.sampler import Sampler, SamplingBatch, uniform_from_counter
from sglang_kvc.layers import sampling_kernels as sk

MARGIN = 1e-5

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
interpreter = pytest.mark.skipif(
    not (sk.triton is not None and os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs triton and TRITON_INTERPRET=1")
DEVICES = [pytest.param("cpu", marks=interpreter),
           pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]

if sk.triton is not None:
    tl = sk.tl

    @sk.triton.jit
    def _scaled_probe(X, Out, n, d, BLOCK: tl.constexpr):
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Out + cols, sk._scaled(X, cols, n, d, sk._recip(d), True), mask=cols < n)


@pytest.fixture
def small_chunks(monkeypatch, request):
    """Interpreter runs use small vocabularies: shrink the chunk so rows still span several."""
    if request.node.callspec.params.get("device") == "cpu":
        monkeypatch.setattr(sk, "_CHUNK", 512)


# ---------------------------------------------------------------- helpers

def batch(temps, seeds, steps, device, **kw) -> SamplingBatch:
    t = torch.tensor(temps, dtype=torch.float32, device=device)
    B = len(temps)
    sampled = t > 0
    fields = dict(
        temperatures=t, top_p=torch.ones(B, device=device), top_k=torch.full((B,), 1 << 30, device=device),
        min_p=torch.zeros(B, device=device), seeds=torch.as_tensor(seeds, device=device),
        steps=torch.as_tensor(steps, device=device), all_greedy=not bool(sampled.any()),
        need_filter=False, need_logprobs=True, top_logprobs_num=0,
        divisors=torch.where(sampled, t, torch.ones_like(t)), sampled=sampled)
    fields.update(kw)
    return SamplingBatch(**fields)


def torch_path(logits, sb, monkeypatch):
    """Sampler with the fused gate off: the torch path the kernels replace."""
    with monkeypatch.context() as m:
        m.setattr(sampler_mod, "fused_sampling_enabled", lambda x: False)
        return Sampler()(logits.clone(), sb)


def fused_path(logits, sb, monkeypatch):
    """Sampler, asserting that it went through the kernels."""
    calls = []

    def spy(*args):
        calls.append(1)
        return sk.sample_full_vocab(*args)

    with monkeypatch.context() as m:
        m.setattr(sampler_mod, "sample_full_vocab", spy)
        out = Sampler()(logits.clone(), sb)
    assert calls, "Sampler did not take the fused path"
    return out


def float64_draws(logits, sb):
    """(ids, margin): the inverse-CDF draw in float64 from the fp32-rounded u, and the distance
    from u to the nearest boundary of the normalised CDF."""
    x = logits.double().cpu() / sb.divisors.double().cpu()[:, None]
    cdf = torch.softmax(x, dim=-1).cumsum(dim=-1)
    u = uniform_from_counter(sb.seeds.cpu(), sb.steps.cpu()).float().double()[:, None]
    ids = torch.searchsorted(cdf, u).clamp_(max=x.shape[1] - 1)[:, 0]
    return ids, (cdf - u).abs().min(dim=-1).values


def random_logits(B, V, device, dtype=torch.float32, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, V, generator=g) * scale).to(device, dtype)


# ---------------------------------------------------------------- CPU: the oracle is the torch path

@pytest.mark.parametrize("temps", [[0.5, 1.0, 0.0, 1.3], [0.0, 0.0]])
def test_oracle_is_sampler_torch_path(temps, monkeypatch):
    logits = random_logits(len(temps), 3000, "cpu", torch.bfloat16)
    sb = batch(temps, [3, 9, 27, 81][:len(temps)], [0, 5, 7, 2][:len(temps)], "cpu")
    want = torch_path(logits, sb, monkeypatch)
    u = uniform_from_counter(sb.seeds, sb.steps)
    rows = (None, None) if sb.all_greedy else (sb.divisors, sb.sampled)
    ids, lp = sk.sample_full_vocab_torch(logits, *rows, u, True)
    assert torch.equal(ids, want.ids) and torch.equal(lp, want.logprobs)


# ---------------------------------------------------------------- shared checks

def check_ids_match_torch(device, V, rows, steps_per_row, monkeypatch):
    """(a) mixed greedy / sampled rows at T in {0.5, 1, 1.3}: ids equal the torch path's and the
    float64 draw wherever the draw is determined; greedy rows always."""
    temps = [[0.5, 1.0, 1.3, 0.0][i % 4] for i in range(rows)]
    agree = determined = total = 0
    for rep in range(steps_per_row):
        logits = random_logits(rows, V, device, seed=rep)
        sb = batch(temps, [1000 + 17 * i for i in range(rows)], [rep * 3 + i for i in range(rows)],
                   device)
        got = fused_path(logits, sb, monkeypatch).ids.cpu()
        want = torch_path(logits, sb, monkeypatch).ids.cpu()
        exact, margin = float64_draws(logits, sb)
        greedy = ~sb.sampled.cpu()
        assert torch.equal(got[greedy], logits.cpu().argmax(dim=-1)[greedy])
        clear = (margin > MARGIN) & ~greedy  # greedy rows: no draw
        assert torch.equal(got[clear], want[clear]) and torch.equal(got[clear], exact[clear])
        agree += int((got == want).sum())
        determined += int(clear.sum())
        total += rows
    assert agree >= 0.99 * total, (agree, total)
    # the exact check covered most sampled draws (3 rows in 4 are sampled)
    assert determined >= 0.8 * 0.75 * total, (determined, total)


def check_logprobs(device, dtype, V, monkeypatch):
    """(b) log-probs of the drawn ids within 1e-5 of fp32 log_softmax(logits / T)."""
    temps = [0.5, 1.0, 1.3, 0.0, 0.7, 0.0]
    logits = random_logits(len(temps), V, device, dtype, seed=11, scale=4.0)
    sb = batch(temps, list(range(len(temps))), [9] * len(temps), device)
    out = fused_path(logits, sb, monkeypatch)
    ref = torch.log_softmax(logits.float() / sb.divisors[:, None], dim=-1)
    torch.testing.assert_close(out.logprobs, ref.gather(1, out.ids[:, None])[:, 0],
                               rtol=0, atol=1e-5)
    assert out.top_values is None and out.top_ids is None
    # all rows greedy: argmax ids and the T = 1 log-probs; without log-probs none
    sb = batch([0.0] * len(temps), [0] * len(temps), [0] * len(temps), device)
    out = fused_path(logits, sb, monkeypatch)
    assert torch.equal(out.ids, logits.argmax(dim=-1))
    ref = torch.log_softmax(logits.float(), dim=-1).gather(1, out.ids[:, None])[:, 0]
    torch.testing.assert_close(out.logprobs, ref, rtol=0, atol=1e-5)
    sb = batch(temps, list(range(len(temps))), [9] * len(temps), device, need_logprobs=False)
    out = fused_path(logits, sb, monkeypatch)
    assert out.logprobs is None and out.ids.dtype == torch.int64


def chi2_bound(df: int, z: float = 4.75) -> float:
    """Wilson-Hilferty: the chi-square quantile at standard-normal z (4.75: p ~ 1e-6)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def check_distribution(device, n, monkeypatch):
    """(c) n draws of one row (steps 0..n-1) against softmax(x / T) in float64: chi-square below
    the p ~ 1e-6 bound; against the wrong temperature it must be far above (the test can fail)."""
    T = 2.0  # at n = 600, far enough from T = 1 for the wrong-temperature check
    x = torch.tensor([2.0, -1.0, 0.5, 3.0, float("-inf"), 1.0, 0.0, 2.5, -0.5, 1.5, -2.0, 0.7])
    V = x.numel()
    logits = x.to(device).expand(n, V)  # one row, n draws: a stride-0 batch
    sb = batch([T] * n, [12345] * n, list(range(n)), device)
    ids = fused_path(logits, sb, monkeypatch).ids.cpu()
    counts = torch.bincount(ids, minlength=V).double()
    assert counts[4] == 0  # -inf: probability 0

    def chi2(temp):
        p = torch.softmax(x.double() / temp, dim=0)
        keep = p > 0
        expected = n * p[keep]
        return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1

    stat, df = chi2(T)
    assert stat < chi2_bound(df), (stat, chi2_bound(df))
    wrong, _ = chi2(1.0)
    assert wrong > 2 * chi2_bound(df), wrong


def check_bans(device, monkeypatch):
    """(d) ban_rows: the banned ids (each row's likeliest, masked in place before sampling) are
    never drawn, nor picked by greedy rows; log-probs are those of the masked logits."""
    V, B = 1500, 8
    temps = [1.0, 2.0, 0.0, 1.3] * 2
    base = random_logits(B, V, device, seed=5)
    banned = base.topk(3, dim=-1).indices  # [B, 3]
    rows = torch.arange(B, device=device).repeat_interleave(3)
    seen = torch.zeros(B, V, dtype=torch.bool)
    for step in range(4):
        sb = batch(temps, [7 * i for i in range(B)], [step] * B, device,
                   ban_rows=rows, ban_ids=banned.reshape(-1))
        logits = base.clone()
        out = fused_path(logits, sb, monkeypatch)
        seen[torch.arange(B), out.ids.cpu()] = True
        masked = base.clone()
        masked[rows, banned.reshape(-1)] = float("-inf")
        ref = torch.log_softmax(masked.float() / sb.divisors[:, None], dim=-1)
        torch.testing.assert_close(out.logprobs, ref.gather(1, out.ids[:, None])[:, 0],
                                   rtol=0, atol=1e-5)
        greedy = ~sb.sampled
        assert torch.equal(out.ids[greedy], masked.argmax(dim=-1)[greedy])
    assert not seen.gather(1, banned.cpu()).any()
    # T = 50 flattens the distribution: most draws land elsewhere than the argmax, still no ban
    logits = base.clone()
    sb = batch([50.0] * B, list(range(B)), [1] * B, device, ban_rows=rows, ban_ids=banned.reshape(-1))
    ids = fused_path(logits, sb, monkeypatch).ids
    assert not (ids[:, None] == banned).any()


def check_fallbacks(device, monkeypatch):
    """(e) filters or top log-probs keep the torch path: the kernels are not called."""
    logits = random_logits(4, 600, device, seed=3)

    def boom(*args):
        raise AssertionError("fused path taken")

    cases = [dict(need_filter=True),
             dict(need_filter=True, top_k=torch.full((4,), 5, device=device)),
             dict(top_logprobs_num=2),
             dict(need_filter=True, filtered=torch.tensor([True, False, True, False], device=device))]
    for kw in cases:
        sb = batch([1.0, 0.0, 0.7, 1.3], [1, 2, 3, 4], [0, 1, 2, 3], device, **kw)
        want = torch_path(logits, sb, monkeypatch)
        with monkeypatch.context() as m:
            m.setattr(sampler_mod, "sample_full_vocab", boom)
            got = Sampler()(logits.clone(), sb)
        assert torch.equal(got.ids, want.ids) and torch.equal(got.logprobs, want.logprobs)
        if kw.get("top_logprobs_num"):
            assert got.top_values.shape == (4, 2)
    # all greedy without log-probs stays the argmax kernel alone
    sb = batch([0.0] * 4, [0] * 4, [0] * 4, device, need_logprobs=False)
    with monkeypatch.context() as m:
        m.setattr(sampler_mod, "sample_full_vocab", boom)
        assert torch.equal(Sampler()(logits.clone(), sb).ids, logits.argmax(dim=-1))


def check_exact_division(device):
    """The kernels' x / T is torch's fp32 division (reciprocal + one FMA correction): every bf16
    value (NaN excepted: +inf by design) and random fp32 values, several T. Equal as values (a
    -0.0 may come out +0.0); where |x| < 1e-30 the correction underflows (Markstein's exactness
    assumes it does not), off by < 1e-36, which no softmax next to a real logit can see."""
    every_bf16 = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    scales = 10.0 ** torch.randint(-3, 4, (1 << 16,), generator=g)
    fp32 = torch.cat([torch.randn(1 << 16, generator=g) * scales,
                      torch.tensor([float("inf"), float("-inf"), 0.0, 3.4e38, -3.4e38])])
    temps = [0.3, 0.5, 0.6, 0.7, 0.9, 1.1, 1.3, 1.7, 2.0, 3.7]
    temps += (torch.rand(6, generator=g) * 3 + 0.05).tolist()
    for x in (every_bf16, fp32):
        x = x.to(device)
        normal = ~(x.float().abs() < 1e-30)  # NaN and infinities included
        out = torch.empty(x.shape, dtype=torch.float32, device=device)
        for t in temps:
            d = torch.tensor(t, dtype=torch.float32).item()  # exactly an fp32
            _scaled_probe[(sk.triton.cdiv(x.numel(), 4096),)](x, out, x.numel(), d, BLOCK=4096)
            # a tensor divisor, as Sampler's: torch's CUDA division by a Python scalar multiplies
            # by its reciprocal instead
            want = x.float() / torch.full(x.shape, d, device=device)
            want = torch.where(want.isnan(), float("inf"), want)
            assert torch.equal(out[normal], want[normal]), t
            assert (out[~normal] - want[~normal]).abs().max() < 1e-36, t


# ---------------------------------------------------------------- interpreter (CPU) and GPU

@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, on the infinite inputs
@pytest.mark.parametrize("device", DEVICES)
def test_division_is_torch_bit_for_bit(device):
    check_exact_division(device)


@pytest.mark.parametrize("device", DEVICES)
def test_ids_match_torch_path(device, small_chunks, monkeypatch):
    check_ids_match_torch(device, V=3000, rows=8, steps_per_row=32 if device == "cpu" else 64,
                          monkeypatch=monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("device", DEVICES)
def test_logprobs_full_vocab(device, dtype, small_chunks, monkeypatch):
    check_logprobs(device, dtype, 5000 if device == "cpu" else 151_936, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
def test_distribution_matches_softmax(device, monkeypatch):
    if device == "cpu":
        monkeypatch.setattr(sk, "_CHUNK", 4)  # 12 columns in 3 chunks
    check_distribution(device, 600 if device == "cpu" else 200_000, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
def test_banned_ids_never_drawn(device, small_chunks, monkeypatch):
    check_bans(device, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
def test_filters_and_top_logprobs_keep_torch_path(device, monkeypatch):
    check_fallbacks(device, monkeypatch)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_ties_take_first_index(device, small_chunks, monkeypatch):
    """Greedy rows: row_argmax's index, ties across chunks and blocks included."""
    x = random_logits(4, 2000, device, seed=2)
    x[0, [5, 900, 1700]] = 50.0  # across chunks
    x[1, [100, 101]] = 50.0  # inside one block
    x[2] = float("-inf")
    x[2, 1999] = -3.0
    x[3, 1999] = 60.0  # the very last column
    sb = batch([0.0, 1.0, 0.0, 0.0], [0, 1, 2, 3], [0] * 4, device)
    out = fused_path(x, sb, monkeypatch)
    assert out.ids.tolist()[:1] + out.ids.tolist()[2:] == [5, 1999, 1999]
    assert out.ids[1] in (100, 101)  # sampled at T = 1: the two 50s hold almost all the mass


# ---------------------------------------------------------------- GPU only

@pytest.mark.gpu
@needs_cuda
def test_gpu_qwen_vocab_matches_torch_path(monkeypatch):
    """B = 256 rows of the Qwen vocabulary in bf16, T = 1 and mixed rows."""
    V, B = 151_936, 256
    temps = [[1.0, 0.6, 1.3, 0.0][i % 4] for i in range(B)]
    agree = determined = 0
    for rep in range(4):
        logits = random_logits(B, V, "cuda", torch.bfloat16, seed=rep, scale=4.0)
        sb = batch(temps, list(range(B)), [rep] * B, "cuda")
        got = fused_path(logits, sb, monkeypatch)
        want = torch_path(logits, sb, monkeypatch)
        exact, margin = float64_draws(logits, sb)
        clear = (margin > MARGIN) & sb.sampled.cpu()
        assert torch.equal(got.ids.cpu()[clear], want.ids.cpu()[clear])
        assert torch.equal(got.ids.cpu()[clear], exact[clear])
        agree += int((got.ids == want.ids).sum())
        determined += int(clear.sum())
        same = got.ids == want.ids
        torch.testing.assert_close(got.logprobs[same], want.logprobs[same], rtol=0, atol=1e-5)
    assert agree >= 0.99 * 4 * B and determined >= 0.5 * 3 * B, (agree, determined)


@pytest.mark.gpu
@needs_cuda
def test_gpu_fused_sampler_replays_in_cuda_graph(monkeypatch):
    """Captured once, replayed on new logits and steps: the same ids and log-probs as eager."""
    V, B = 151_936, 64
    temps = [[1.0, 0.0][i % 2] for i in range(B)]
    logits = random_logits(B, V, "cuda", torch.bfloat16, seed=0)
    sb = batch(temps, list(range(B)), [0] * B, "cuda")
    sampler = Sampler()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sampler(logits, sb)  # compile outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampler(logits, sb)
    for rep in range(1, 4):
        logits.copy_(random_logits(B, V, "cuda", torch.bfloat16, seed=rep))
        sb.steps.fill_(rep)
        graph.replay()
        want = fused_path(logits, sb, monkeypatch)
        assert torch.equal(out.ids, want.ids) and torch.equal(out.logprobs, want.logprobs)
