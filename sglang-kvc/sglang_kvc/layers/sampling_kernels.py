"""The RL decode step's sampling in two Triton kernels: the draw and the full-vocabulary log-prob
of rows without top-k / top-p / min-p (sampler.py's `need_filter` off) or greedy rows.

Why: the torch path upcasts the [B, V] logits, divides by T, softmaxes, cumsums, searches, log-
softmaxes and gathers: ~6-8 passes over fp32 copies, against a ~2.2 ms decode step. Here the
logits are read once, plus one chunk per row. benchmarks/engine/sampler.py, H100, V = 151,936 bf16,
T = 1 with log-probs, graphed, cold L2: 498 -> 24 us at B = 64, 1054 -> 52 us at B = 256.

  pass 1, grid (row, chunk of CHUNK columns): v = x / d in fp32 (d = the row's temperature, 1 when
      greedy; correctly rounded, so torch's values; skipped when d = 1), then per lane an online
      max, a sum of exp(v - max) and the first column of the max; merged into the chunk's (max,
      sum, argmax).
  pass 2, grid (row): the chunks' partials give the row's max M, total = sum exp(v - M) and, as a
      cumulative sum over chunks, the chunk where u * total falls (u: sampler.uniform_from_counter
      of the row's seed and step, computed here); a running tl.cumsum over that chunk finds the
      first column whose cumulative weight reaches u * total. Greedy rows take the first chunk
      argmax of the largest chunk max instead: row_argmax's index (NaN counts as +inf there too).
      log-prob = v[id] - M - log(total).

Exactness against the torch path (Sampler with the gate off): log-probs agree to fp32 rounding
(~1e-6). The CDF is summed in another order (lanes, then chunks, then a tree scan) and the exps
are the GPU's fast ones, so a drawn id can differ from torch's only when u * total lies within
float rounding of a CDF boundary (a relative distance of ~1e-6 of the total); greedy ids are
exact. That is rare for a peaked distribution; with near-flat N(0, 9) logits over 152k tokens, 1
draw in 70-100 differed, and where they did, the float64 draw was the kernels' 40 times in 52 and
torch's 4 (its fp32 cumsum of 152k probabilities drifts more). Zero-weight columns (-inf logits,
as sampler's ban_rows sets) are never drawn.

Dispatch: the kernels serve CUDA tensors when triton imports, and every tensor under the Triton
interpreter (TRITON_INTERPRET=1), so the CPU tests run them. Grids depend on shapes only and
nothing is read back to the host: the pair runs inside captured CUDA graphs.
"""

from __future__ import annotations

import torch

from .fused_ops import _dense_last, _jit, _mix32, tl, triton

_CHUNK = 4096  # columns per pass-1 program: 38 chunks a row at V = 151,936
_BLOCK = 1024  # columns per load
_WARPS = 4


def fused_sampling_enabled(x: torch.Tensor) -> bool:
    return triton is not None and (x.is_cuda or triton.knobs.runtime.interpret)


def sample_full_vocab(logits: torch.Tensor, divisors: torch.Tensor | None,
                      sampled: torch.Tensor | None, seeds: torch.Tensor | None,
                      steps: torch.Tensor | None, need_logprobs: bool):
    """(ids int64 [B], logprobs fp32 [B] or None) of logits [B, V] (model dtype or fp32).
    divisors [B] fp32 (temperature, 1 for greedy rows) and sampled [B] bool; both None when every
    row is greedy (then seeds and steps are unused)."""
    x = _dense_last(logits)
    B, V = x.shape
    # _CHUNK is read at call time (tests shrink it to cross chunks at a small V); a vocabulary
    # smaller than a chunk gets one chunk of its own size, not a mostly masked one.
    chunk = min(_CHUNK, triton.next_power_of_2(V))
    block = min(_BLOCK, chunk)
    S = triton.cdiv(V, chunk)
    part_m = torch.empty(B, S, dtype=torch.float32, device=x.device)
    part_s = torch.empty(B, S, dtype=torch.float32, device=x.device)
    part_i = torch.empty(B, S, dtype=torch.int32, device=x.device)
    has_div, any_sampled = divisors is not None, sampled is not None
    div = divisors.contiguous() if has_div else part_m  # placeholders are never read
    _chunk_stats_kernel[(B, S)](x, div, part_m, part_s, part_i, x.stride(0), V, S,
                                HAS_DIV=has_div, CHUNK=chunk, BLOCK=block, num_warps=_WARPS)
    ids = torch.empty(B, dtype=torch.int64, device=x.device)
    lp = torch.empty(B, dtype=torch.float32, device=x.device) if need_logprobs else part_m
    rows = (sampled.contiguous(), seeds.contiguous(), steps.contiguous()) if any_sampled \
        else (ids, ids, ids)
    _draw_kernel[(B,)](x, div, *rows, part_m, part_s, part_i, ids, lp, x.stride(0), V, S,
                       HAS_DIV=has_div, ANY_SAMPLED=any_sampled, NEED_LP=need_logprobs,
                       CHUNK=chunk, BLOCK=block, BLOCK_S=triton.next_power_of_2(S),
                       num_warps=_WARPS)
    return ids, (lp if need_logprobs else None)


def sample_full_vocab_torch(logits, divisors, sampled, u, need_logprobs):
    """The kernels' oracle: what Sampler's torch path computes for unfiltered rows (u: the rows'
    uniforms, float64). divisors/sampled None: every row greedy."""
    greedy = logits.argmax(dim=-1)
    scaled = logits.float() if divisors is None else logits.float() / divisors[:, None]
    ids = greedy
    if sampled is not None:
        probs = torch.softmax(scaled, dim=-1)
        cdf = probs.cumsum(dim=-1)
        target = (u.to(probs.dtype) * cdf[:, -1])[:, None]
        drawn = torch.searchsorted(cdf, target).clamp_(max=probs.shape[1] - 1)[:, 0]
        ids = torch.where(sampled, drawn, greedy)
    if not need_logprobs:
        return ids, None
    return ids, torch.log_softmax(scaled, dim=-1).gather(1, ids[:, None])[:, 0]


# ---------------------------------------------------------------- kernels

@_jit
def _recip(d):
    return tl.math.div_rn(tl.full((), 1.0, tl.float32), d)


@_jit
def _scaled(Xrow, cols, V, d, r, DIV: tl.constexpr):
    """x / d in fp32, correctly rounded (torch's values) from r = 1/d: q = x * r is within an
    ulp and one FMA correction makes it exact (Markstein), at a fraction of an IEEE division's
    instructions. Padding columns -inf, NaN as +inf (row_argmax's rule)."""
    v = tl.load(Xrow + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    if DIV:
        q = v * r
        exact = tl.fma(tl.fma(-q, d, v), r, q)
        v = tl.where(exact == exact, exact, q)  # +-inf: the correction is NaN, q is right
    return tl.where(v != v, float("inf"), v)


@_jit
def _chunk_online(Xrow, start, V, d, r, DIV: tl.constexpr, CHUNK: tl.constexpr,
                  BLOCK: tl.constexpr):
    # Lane-wise online softmax with one exp per element: exp(-|v - m|) is the new element's
    # weight when v <= m and the old sum's rescale when v > m. Lanes keep their own state so
    # the loads are not serialised by reductions (as _argmax_chunk_kernel). m starts at
    # -FLT_MAX, not -inf, so that no -inf - -inf appears and -inf elements weigh exactly 0.
    m = tl.full((BLOCK,), -3.4028234663852886e38, tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    best_i = start + tl.arange(0, BLOCK)  # an all -inf chunk answers its first column
    for off in tl.static_range(0, CHUNK, BLOCK):
        cols = start + off + tl.arange(0, BLOCK)
        v = _scaled(Xrow, cols, V, d, r, DIV)
        take = v > m  # strictly larger: the first column of a tie stays
        e = tl.exp(-tl.abs(v - m))
        s = tl.where(take, s * e + 1.0, s + e)
        m = tl.where(take, v, m)
        best_i = tl.where(take, cols, best_i)
    return m, s, best_i


@_jit
def _chunk_stats_kernel(X, Div, PartM, PartS, PartI, sx, V, S, HAS_DIV: tl.constexpr,
                        CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # Grid (row, chunk): the chunk's max, sum of exp(v - max) and first column of the max.
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    Xrow = X + row * sx
    start = c * CHUNK
    if HAS_DIV:
        d = tl.load(Div + row)
        if d != 1.0:  # T = 1 (the RL default) and greedy rows skip the division
            m, s, best_i = _chunk_online(Xrow, start, V, d, _recip(d), True, CHUNK, BLOCK)
        else:
            m, s, best_i = _chunk_online(Xrow, start, V, d, d, False, CHUNK, BLOCK)
    else:
        m, s, best_i = _chunk_online(Xrow, start, V, 1.0, 1.0, False, CHUNK, BLOCK)
    cm = tl.max(m, axis=0)
    out = row * S + c
    tl.store(PartM + out, cm)
    tl.store(PartS + out, tl.sum(s * tl.exp(m - cm), axis=0))
    tl.store(PartI + out, tl.min(tl.where(m == cm, best_i, 2147483647), axis=0))


@_jit
def _uniform32(Seeds, Steps, row):
    # fused_ops._counter_uniform_kernel's steps, then the fp32 rounding the torch path applies.
    seed = tl.load(Seeds + row).to(tl.int64)
    step = tl.load(Steps + row).to(tl.int64)
    h = _mix32(_mix32(seed & 0xFFFFFFFF) ^ ((step * 0x9E3779B9) & 0xFFFFFFFF))
    return ((h.to(tl.float64) + 0.5) / 4294967296.0).to(tl.float32)


@_jit
def _search_chunk(Xrow, start, V, d, r, M, running, target, DIV: tl.constexpr,
                  CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """First column of [start, start + CHUNK) whose cumulative weight (from `running`) reaches
    target. Only positive weights can be hits, so a zero-weight (banned) column never is."""
    found = tl.full((), 2147483647, tl.int32)
    for off in tl.static_range(0, CHUNK, BLOCK):
        cols = start + off + tl.arange(0, BLOCK)
        w = tl.exp(_scaled(Xrow, cols, V, d, r, DIV) - M)
        cdf = tl.cumsum(w, axis=0) + running
        found = tl.minimum(found, tl.min(tl.where((cdf >= target) & (w > 0), cols, 2147483647),
                                         axis=0))
        running = tl.max(cdf, axis=0)
    if found == 2147483647:  # rounding left the chunk's sum short of target: its last column
        found = _last_positive(Xrow, start, V, d, r, M, DIV, CHUNK, BLOCK)  # of positive weight
    return found


@_jit
def _last_positive(Xrow, start, V, d, r, M, DIV: tl.constexpr, CHUNK: tl.constexpr,
                   BLOCK: tl.constexpr):
    last = tl.full((), -1, tl.int32)
    for off in tl.static_range(0, CHUNK, BLOCK):
        cols = start + off + tl.arange(0, BLOCK)
        w = tl.exp(_scaled(Xrow, cols, V, d, r, DIV) - M)
        last = tl.maximum(last, tl.max(tl.where(w > 0, cols, -1), axis=0))
    return tl.maximum(last, start)


@_jit
def _draw_kernel(X, Div, Sampled, Seeds, Steps, PartM, PartS, PartI, Ids, Lp, sx, V, S,
                 HAS_DIV: tl.constexpr, ANY_SAMPLED: tl.constexpr, NEED_LP: tl.constexpr,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    # One program per row: merge the chunks, then the draw (sampled rows) or the argmax.
    row = tl.program_id(0).to(tl.int64)
    Xrow = X + row * sx
    k = tl.arange(0, BLOCK_S)
    cm = tl.load(PartM + row * S + k, mask=k < S, other=float("-inf"))
    cs = tl.load(PartS + row * S + k, mask=k < S, other=0.0)
    M = tl.max(cm, axis=0)
    cdf = tl.cumsum(cs * tl.exp(cm - M), axis=0)
    total = tl.max(cdf, axis=0)  # the last entry: a cumsum of non-negative weights
    first = tl.min(tl.where(cm == M, k, BLOCK_S), axis=0)  # row_argmax's chunk merge
    idx = tl.sum(tl.where(k == first, tl.load(PartI + row * S + k, mask=k < S, other=0), 0))
    d = tl.load(Div + row) if HAS_DIV else 1.0
    r = _recip(d) if HAS_DIV else 1.0
    if ANY_SAMPLED:
        if tl.load(Sampled + row) != 0:
            target = _uniform32(Seeds, Steps, row) * total
            owner = tl.min(tl.where(cdf >= target, k, S - 1), axis=0)  # S - 1: NaN rows
            prefix = tl.sum(tl.where(k == owner - 1, cdf, 0.0), axis=0)
            idx = _search_chunk(Xrow, owner * CHUNK, V, d, r, M, prefix, target, HAS_DIV,
                                CHUNK, BLOCK)
    idx = tl.minimum(idx, V - 1)
    tl.store(Ids + row, idx.to(tl.int64))
    if NEED_LP:
        tl.store(Lp + row, _scaled(Xrow, idx, V, d, r, HAS_DIV) - M - tl.log(total))
