"""Attention over the KV pool, for one flat batch of tokens.

Every backend first writes the step's new K/V into their slots (`out_slots`), then:
- prefill: causal attention among the new tokens of each request; a request whose row starts
  with held slots (a cached prefix, a session's earlier turns) attends to its whole row in the
  pool (`ExtendLayout`: the torch backend gathers the row and runs SDPA with a mask; the Triton
  backend reads the row in place, one kernel a layer, triton_extend.py);
- decode: one query per request against the slots in its table row, row[:kv_len].

`TorchAttention` gathers each request's slots into a padded dense tensor (CPU, reference).
`TritonAttention` reads the pool through the table inside a Triton kernel (CUDA).

The model calls `forward_rotary` (RoPE, store, attend): the torch backend ropes with the model's
Rotary then runs `forward`; the Triton backend's decode kernel ropes q and k, stores K/V and
attends in one kernel (triton_decode.NewTokenKV); its prefill, and decode steps that record
queries for compression, rope and store in one fused kernel (fused_ops.rope_store_) first.

Every SDPA call here runs with cuDNN attention off (`sdpa`): on sm90/sm100 with cuDNN >= 9.15,
torch 2.13 tries cuDNN first (sdp_utils.cpp check_prefer_cudnn_attention), and cuDNN builds and
caches one execution graph per problem shape (batch, query and key lengths; tens of ms of host
each). Prefill shapes change from step to step (a multi-turn continuation prefill: a few session
turns, each some new tokens after its held KV), so each prefill step would build two new graphs
(the causal call and the masked one): the cause read for the ~134 ms continuation prefill steps
measured on an H200 (benchmarks/engine/prefill_sdpa.py times it). Flash, memory-efficient
(masks and GQA on CUDA) and math attention plan nothing per shape. `set_cudnn_sdp(True)` (or
SGLANG_KVC_CUDNN_SDP=1 at import) leaves torch's own choice, cuDNN included, so one process can
A/B both (benchmarks/engine/multiturn_throughput.py --cudnn-sdp off,on).

FP8 pools (kvcache/kv_quant.py): every store quantizes and decode reads dequantize (the Triton
kernels in-kernel), so decode attends to FP8 K/V, the step's own token included. Prefill
attends to the new tokens' K/V as computed, as SGLang's prefill does: only what later steps
read from the pool carries the FP8 rounding.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .fused_ops import rope_store_
from ..kvcache.kv_cache import KVCache


CUDNN_SDP_ENV = "SGLANG_KVC_CUDNN_SDP"
# 0/off: the Triton backend's prefill with held KV takes the torch path (gather + masked SDPA)
# instead of the paged kernel; an escape hatch and the A/B of benchmarks/engine/ runs
PAGED_EXTEND_ENV = "SGLANG_KVC_PAGED_EXTEND"


def env_flag(name: str, default: bool, environ=os.environ) -> bool:
    """A boolean environment switch: 1/on/true or 0/off/false; unset or empty: `default`."""
    value = environ.get(name, "").strip().lower()
    if value not in ("0", "1", "on", "off", "true", "false", ""):
        raise ValueError(f"{name}={value!r}: expected 0/1, on/off or true/false")
    return default if value == "" else value in ("1", "on", "true")


def cudnn_sdp_from_env(environ=os.environ) -> bool:
    """SGLANG_KVC_CUDNN_SDP: 1/on/true lets torch use cuDNN attention; unset, 0/off/false not."""
    return env_flag(CUDNN_SDP_ENV, False, environ)


# Module state, not a server argument: an A/B in one process flips it between runs; the engine
# thread reads it at every call.
_cudnn_sdp = cudnn_sdp_from_env()
_paged_extend = env_flag(PAGED_EXTEND_ENV, True)


def set_cudnn_sdp(enabled: bool) -> None:
    """Whether the engine's SDPA calls may use cuDNN attention (torch's own order) from now on."""
    global _cudnn_sdp
    _cudnn_sdp = bool(enabled)


def cudnn_sdp_allowed() -> bool:
    return _cudnn_sdp


def sdpa(*args, **kwargs) -> torch.Tensor:
    """F.scaled_dot_product_attention with cuDNN attention off for this call (module docstring:
    its per-shape graph builds) unless `set_cudnn_sdp(True)`. One flag flip each way; it is the
    process's flag, so another thread's SDPA in the window skips cuDNN too (harmless: it only
    picks another kernel)."""
    if _cudnn_sdp:
        return F.scaled_dot_product_attention(*args, **kwargs)
    was = torch.backends.cuda.cudnn_sdp_enabled()
    if was:
        torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        return F.scaled_dot_product_attention(*args, **kwargs)
    finally:
        if was:
            torch.backends.cuda.enable_cudnn_sdp(True)


def expand_kv_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, Hkv, L, D] -> [B, num_heads, L, D], each KV head repeated for its query group (the
    order enable_gqa uses: query head h reads KV head h // group)."""
    b, hkv, length, d = t.shape
    return t[:, :, None].expand(b, hkv, num_heads // hkv, length, d).reshape(b, num_heads, length, d)


@dataclass
class ExtendLayout:
    """The prefill's requests whose rows start with cached slots (E of them): their new tokens
    attend to row[:prefix + new] in the pool, query i of a request seeing key j iff j <= prefix +
    i. Requests without a prefix keep the plain causal path (unchanged numerics)."""
    # The torch path's layout (None in a captured step, which runs the paged kernel only):
    rows: torch.Tensor | None = None  # [E] table rows
    q_index: torch.Tensor | None = None  # [E, Lq] flat token index of each request's i-th new token (pad -> 0)
    tokens: torch.Tensor | None = None  # [Te] flat index of every new token of these requests
    pad_rows: torch.Tensor | None = None  # [Te] its row in the [E * Lq] layout
    new: torch.Tensor | None = None  # [E] new tokens
    held: torch.Tensor | None = None  # [E] slots held before them
    max_new: int = 0  # Lq
    max_len: int = 0  # Lk: the longest held + new
    # every request of the prefill has a prefix (tokens = all, in order): the plain causal pass
    # would be overwritten whole, so it is skipped (multi-turn continuation prefills)
    every: bool = False
    # The paged Triton kernel's layout (triton_extend.py): [4, E] int32, each request's table
    # row, first flat token, new tokens and held slots; [2, W] int32, its work list (request,
    # first new token of a block of EXTEND_BLOCK_M)
    requests: torch.Tensor | None = None
    work: torch.Tensor | None = None

    @functools.cached_property
    def mask(self) -> torch.Tensor:
        """[E, 1, Lq, Lk] bool: request e's query i (at position held[e] + i of its row) sees
        key j iff j <= held[e] + i and j < held[e] + new[e] (no padding query sees past its
        row). Built on the device from E lengths, on first use: the paged kernel needs none."""
        n, p = self.new, self.held
        key = torch.arange(self.max_len, device=n.device)[None, None, :]
        qpos = (p[:, None] + torch.arange(self.max_new, device=n.device)[None, :])[:, :, None]
        return ((key <= qpos) & (key < (p + n)[:, None, None]))[:, None]


EXTEND_BLOCK_M = 32  # new tokens per program of the paged extend kernel


@dataclass
class AttentionMetadata:
    is_prefill: bool
    out_slots: torch.Tensor  # [T] int64, where each new token's K/V goes
    # prefill: right-padded layout of the flat tokens, one row per request
    pad_index: torch.Tensor | None = None  # [B, Lmax] flat token index (padding -> 0)
    pad_rows: torch.Tensor | None = None  # [T] each flat token's row in the [B * Lmax] layout
    # decode
    rows: torch.Tensor | None = None  # [B] int64 table rows
    kv_lens: torch.Tensor | None = None  # [B] int32 slots held, including the new one
    max_kv_len: int = 0
    # Query ring (compression): record q of tokens `rec_index` (None = every token) for table
    # rows `rec_rows` at logical positions `rec_pos`.
    rec_index: torch.Tensor | None = None
    rec_rows: torch.Tensor | None = None
    rec_pos: torch.Tensor | None = None
    extend: ExtendLayout | None = None  # prefill with cached prefixes


class TorchAttention:
    def __init__(self, kv: KVCache, num_heads: int, head_dim: int):
        self.kv, self.num_heads, self.head_dim, self.scale = kv, num_heads, head_dim, head_dim ** -0.5
        self.meta: AttentionMetadata | None = None
        self.ring = None  # QueryRing when a compression policy scores with queries

    def store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.kv.pool.write(layer, self.meta.out_slots, k, v)

    def forward_rotary(self, layer: int, q, k, v, positions, rotary) -> torch.Tensor:
        """Apply RoPE (rotary: model.Rotary) to q and k at `positions`, then `forward`."""
        q, k = rotary(positions, q, k)
        return self.forward(layer, q, k, v)

    def forward(self, layer: int, q, k, v) -> torch.Tensor:
        self.store(layer, k, v)
        return self.attend(layer, q, k, v)

    def paged_extend(self) -> bool:
        """Whether a prefill with held KV attends through the paged kernel (triton_extend.py),
        which a captured prefill needs (engine/prefill_graph.py). Not on this backend."""
        return False

    def _records_queries(self) -> bool:
        # Steps with query-ring metadata record rotated q (the Triton decode then keeps the
        # separate RoPE kernel: the ring wants rotated q in memory).
        return self.ring is not None and self.meta.rec_rows is not None

    def attend(self, layer: int, q, k, v) -> torch.Tensor:
        """Attention for K/V already in the pool (q, k already rotated)."""
        m = self.meta
        if self._records_queries():
            self.ring.record(layer, q if m.rec_index is None else q[m.rec_index], m.rec_rows, m.rec_pos)
        if not m.is_prefill:
            return self.decode(layer, q)
        e = m.extend
        out = None if e is not None and e.every else self.prefill(q, k, v)
        return out if e is None else self.attend_held(layer, q, e, out)

    def attend_held(self, layer: int, q, e: ExtendLayout, out: torch.Tensor | None) -> torch.Tensor:
        """The outputs of the tokens of requests with held KV, written into `out` (the causal
        pass's, for the other requests' tokens), or alone when every request holds KV."""
        held = self.extend(layer, q, e)
        if out is None:
            return held
        out[e.tokens] = held
        return out

    def prefill(self, q, k, v) -> torch.Tensor:
        m = self.meta
        # [B, L, H, D] -> [B, H, L, D]; right padding keeps causal attention exact for real rows.
        qp, kp, vp = (t[m.pad_index].transpose(1, 2) for t in (q, k, v))
        out = sdpa(qp, kp, vp, is_causal=True, scale=self.scale, enable_gqa=True)
        return out.transpose(1, 2).flatten(0, 1)[m.pad_rows]  # integer index: no device sync

    def extend(self, layer: int, q, e: ExtendLayout) -> torch.Tensor:
        """[Te, H, D] attention of the new tokens of requests with a cached prefix."""
        slots = self.kv.req_to_token.table[e.rows, :e.max_len].long()  # [E, Lk]
        k, v = (t.transpose(1, 2) for t in self.kv.pool.read(layer, slots))  # dequantized
        qe = q[e.q_index].transpose(1, 2)
        gqa = qe.shape[1] != k.shape[1]
        if gqa and qe.is_cuda:
            # torch's memory-efficient kernel takes the mask but not grouped K/V heads, so with
            # enable_gqa a masked call runs the math path: 0.23 ms a call on an H200 against
            # 0.11 ms expanded, the copies included (benchmarks/engine/prefill_sdpa.py), once
            # per layer of every continuation prefill.
            k, v = (expand_kv_heads(t, qe.shape[1]) for t in (k, v))
            gqa = False
        out = sdpa(qe, k, v, attn_mask=e.mask, scale=self.scale, enable_gqa=gqa)
        return out.transpose(1, 2).flatten(0, 1)[e.pad_rows]

    def decode(self, layer: int, q) -> torch.Tensor:
        m = self.meta
        slots = self.kv.req_to_token.table[m.rows, :m.max_kv_len].long()  # [B, L]
        k, v = (t.transpose(1, 2) for t in self.kv.pool.read(layer, slots))  # dequantized
        mask = torch.arange(m.max_kv_len, device=q.device)[None, :] < m.kv_lens[:, None]
        out = sdpa(q[:, :, None, :], k, v, attn_mask=mask[:, None, None, :], scale=self.scale,
                   enable_gqa=True)
        return out[:, :, 0, :]


class TritonAttention(TorchAttention):
    """Same prefill; decode attends over the paged pool in place (no per-step gather)."""

    def forward_rotary(self, layer: int, q, k, v, positions, rotary) -> torch.Tensor:
        m = self.meta
        if not m.is_prefill and (not self._records_queries() or self._ring_in_kernel(q, positions)):
            return self.decode_rotary(layer, q, k, v, positions, rotary)
        # One kernel for RoPE and the store. Rotated q goes to a fresh dense buffer: it is what
        # the decode kernel wants (q from the qkv split is strided; no extra copy kernel).
        pool = self.kv.pool
        q = rope_store_(q, k, v, positions, rotary.cos, rotary.sin, *pool.layer_buffers(layer),
                        self.meta.out_slots, q_out=torch.empty(q.shape, dtype=q.dtype, device=q.device),
                        scales=pool.layer_scales(layer))
        return self.attend(layer, q, k, v)

    def paged_extend(self) -> bool:
        """SGLANG_KVC_PAGED_EXTEND on (the default) and a head size the kernel takes."""
        if not _paged_extend:  # (off, the kernel's module is not imported)
            return False
        from .triton_extend import extend_supported

        return extend_supported(self.head_dim)

    def attend_held(self, layer: int, q, e: ExtendLayout, out: torch.Tensor | None) -> torch.Tensor:
        """One paged kernel reads each request's row in place (triton_extend.py) where the torch
        path gathers, expands and masks (~10 kernels a layer)."""
        if e.requests is None or not self.paged_extend():
            return super().attend_held(layer, q, e, out)
        from .triton_extend import paged_extend_attention

        k_pool, v_pool = self.kv.pool.layer_buffers(layer)
        return paged_extend_attention(q, k_pool, v_pool, self.kv.req_to_token.table, e.requests,
                                      e.work, EXTEND_BLOCK_M, self.scale, out=out,
                                      scales=self.kv.pool.layer_scales(layer))

    def decode_rotary(self, layer: int, q, k, v, positions, rotary) -> torch.Tensor:
        """RoPE, the K/V store and attention in the decode kernel itself (triton_decode)."""
        from .triton_decode import NewTokenKV

        ring = self.ring.buf[layer] if self._records_queries() else None
        new = NewTokenKV(k, v, positions, rotary.cos, rotary.sin, self.meta.out_slots, ring=ring)
        return self.decode(layer, q, new)

    def _ring_in_kernel(self, q, positions) -> bool:
        """Whether the decode kernel can record this step's queries itself (saving the RoPE +
        store kernel and the ring's index_put, ~9 us a layer at batch 256 on an H200): every
        token's, for the rows it attends, at the RoPE positions, which is what decode steps
        record."""
        m = self.meta
        return (m.rec_index is None and m.rec_rows is m.rows and m.rec_pos is positions
                and self.ring.buf.dtype == q.dtype)

    def decode(self, layer: int, q, new=None) -> torch.Tensor:
        from .triton_decode import paged_decode_attention

        m = self.meta
        pool = self.kv.pool
        return paged_decode_attention(q, *pool.layer_buffers(layer), self.kv.req_to_token.table,
                                      m.rows, m.kv_lens, self.scale, new=new,
                                      scales=pool.layer_scales(layer))
