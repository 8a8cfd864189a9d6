"""Eviction replay: packed attention under the rollout engine's KV-compression masks.

The engine's eviction record (``sglang_kvc.compression.eviction_record``) gives, per sample,
layer, KV head and key position, the first query position that no longer saw the key. In a
pack of samples that becomes one ``[L, Hkv, T]`` tensor in pack coordinates, and

    query i sees key j (layer l, KV head h)  iff  same sample, j <= i, i < evict[l, h, j]

which is exactly the attention the sampler computed at every decode step: the trainer then
recomputes π_sparse itself (``--sparse-recompute``) or trains it (``--train-sparse-policy``).
``evict`` never points past the key's own sample (a key never evicted: its sample's end), so
``j <= i < evict`` alone implies the same sample: the kernel's mask needs no sample ids.

Two paths: ``mask`` (one SDPA per sample with a dense boolean mask, the CPU / fp32 reference)
and ``flex`` (FlexAttention on CUDA, one ``BlockMask`` per layer, reused by the backward:
rebuilding it per call cost 12-19 ms per layer at 16k tokens on an H100, against 1.1 ms for the
dense varlen kernel). The block tiles of all layers are classified and ordered in one vectorised
pass on the device, once per pack; within a rollout (``replay_cache``) the π_old recompute, the
reference's forward and the update share them when they pack the same micro-batches. (A third
path over the keys each block of 128 queries sees, gathered, was deleted on 2026-11-29: on an
H200 ``flex`` was faster on both the recompute and the update; docs/benchmarks.md.)
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from .block_tiles import BLOCK, aligned_layers, block_mask_tensors, ordered
from .flags import SPARSE_IMPLS
from .transfer import to_device


@dataclasses.dataclass(eq=False)
class EvictionMasks:
    """One pack's eviction positions and what FlexAttention builds from them.

    One object per pack (``pack``; shared by every pass over the same pack within
    ``replay_cache.shared_replay_masks``), viewed per pass (``use``): ``shared`` holds what is
    built once per pack (the block tiles of all layers, compact: KV heads, int16), ``passes`` what
    one forward (and its backward) builds from them (the per-layer ``BlockMask``s, expanded to
    query heads), dropped with the pass's ``PackedBatch``."""

    # Rows are the pack's, rounded up to a FlexAttention tile (BLOCK); rows past the samples
    # (the pack's padding and this rounding) form one more sequence, never attended by samples.
    evict: torch.Tensor  # [L, Hkv, rows] int32: pack index of the first query that misses each key
    # (a key never evicted: its sample's end, so no value reaches past its own sample)
    seq_id: torch.Tensor  # [rows] int32: the sample of each row (padding: the number of samples)
    head_start: int = 0  # the first of these KV heads among the record's (a TP rank's share)
    shared: dict = dataclasses.field(default_factory=dict, repr=False)
    passes: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def real(self) -> torch.Tensor:
        """[rows] bool: the row belongs to a sample (asked by every layer: computed once)."""
        if "real" not in self.shared:
            self.shared["real"] = self.seq_id < self.seq_id[-1]
        return self.shared["real"]

    @classmethod
    def from_records(cls, records: list[torch.Tensor | None], lengths: list[int], num_layers: int,
                     num_kv_heads: int, total: int, device=None) -> "EvictionMasks":
        """Per-sample records ``[L, Hkv, n]`` (None: dense, every query sees every earlier key)
        shifted to pack coordinates; ``total`` = the pack's row count (padding included).

        Built where it is used: the records travel as one concatenated copy (their own dtype,
        int16 for most) and are shifted there, instead of an int32 pack built row range by row
        range on the host and copied whole."""
        for i, (rec, n) in enumerate(zip(records, lengths)):
            if rec is not None:
                check_record(rec, num_layers, num_kv_heads, n, i)
        device = torch.device("cpu") if device is None else torch.device(device)
        rows = -(-(total + 1) // BLOCK) * BLOCK  # at least one padding row: the last seq_id
        local = _concat_records(records, lengths, (num_layers, num_kv_heads), rows, device)
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        seq_id, start, end = _row_samples(to_device(cu, device), rows)
        # -1: never evicted (a dense sample, padding): seen until its sample's end. Every key's
        # value is then <= its sample's end, so "j <= i < evict[j]" alone keeps each query in
        # its own sample (no sample-id lookups per element in the attention kernel)
        return cls(torch.where(local >= 0, local.to(torch.int32) + start, end), seq_id)

    def to(self, device) -> "EvictionMasks":
        if _on(self.evict, torch.device(device)):
            return self
        device = torch.device(device)
        return EvictionMasks(to_device(self.evict, device), to_device(self.seq_id, device))

    def use(self) -> "EvictionMasks":
        """A view for one pass over the pack: the pack's shared state, its own block masks."""
        return dataclasses.replace(self, passes={})

    def heads(self, start: int, count: int) -> "EvictionMasks":
        """The masks of KV heads [start, start + count) (a tensor-parallel rank's): a view with
        the same shared and per-pass state (their keys name the heads)."""
        if start == 0 and count == self.evict.shape[1]:
            return self
        return dataclasses.replace(self, evict=self.evict[:, start:start + count],
                                   head_start=self.head_start + start)

    def layer_mask(self, layer: int, a: int, b: int, q_heads: int) -> torch.Tensor:
        """``[Hq, n, n]`` bool for the sample at pack rows [a, b) in ``layer``."""
        ev = self.evict[layer, :, a:b]  # [Hkv, n]
        i = torch.arange(a, b, device=ev.device)
        mask = (i[None, :] <= i[:, None])[None] & (i[None, :, None] < ev[:, None, :])
        return mask.repeat_interleave(q_heads // ev.shape[0], dim=0)

    def tiles(self) -> "LayerTiles":
        """Every layer's block tiles of these KV heads: built once per pack, kept with it."""
        key = ("tiles", self.head_start, self.evict.shape[1])
        if key not in self.shared:
            self.shared[key] = LayerTiles.build(self.evict, self.seq_id)
        return self.shared[key]

    def block_masks(self, q_heads: int) -> list:
        """This pass's ``BlockMask`` per layer, all built at the first layer's call. Without
        autograd (the π_old recompute) the backward's transposed tiles are left out."""
        backward = torch.is_grad_enabled()
        key = (self.head_start, self.evict.shape[1], q_heads, backward)
        if key not in self.passes:
            self.passes[key] = self.tiles().block_masks(self.evict, self.seq_id, q_heads, backward)
        return self.passes[key]


def _on(t: torch.Tensor, device: torch.device) -> bool:
    """Whether ``t`` is on ``device`` ("cuda" without an index: the current one)."""
    if t.device.type != device.type:
        return False
    return device.index is None or device.index == t.device.index


def _concat_records(records: list, lengths: list[int], heads: tuple[int, int], rows: int,
                    device: torch.device) -> torch.Tensor:
    """``[L, Hkv, rows]`` the records side by side in the records' dtype (int16 unless a sample
    is longer than it holds), -1 for dense samples and padding, on ``device``; for a GPU,
    concatenated straight into pinned memory so that the one copy does not block the host."""
    dtype = torch.int16 if all(r is None or r.dtype == torch.int16 for r in records) else torch.int32
    never = torch.tensor(-1, dtype=dtype)
    parts = [never.expand(*heads, n) if r is None else r.to(dtype) for r, n in zip(records, lengths)]
    parts.append(never.expand(*heads, rows - sum(lengths)))
    out = torch.empty(*heads, rows, dtype=dtype, pin_memory=device.type == "cuda")
    return to_device(torch.cat(parts, dim=-1, out=out), device)


def _row_samples(cu: torch.Tensor, rows: int) -> tuple[torch.Tensor, ...]:
    """([rows] the sample of each row, the row where that sample starts, the row after it ends),
    int32, where the bounds ``cu`` are (rows past the samples: sample ``len(cu) - 1``, the
    padding, which ends at ``rows``)."""
    pos = torch.arange(rows, dtype=torch.int32, device=cu.device)
    seq_id = torch.searchsorted(cu[1:].contiguous(), pos, right=True, out_int32=True)
    ends = torch.cat([cu[1:], cu.new_full((1,), rows)])
    return seq_id, cu[seq_id], ends[seq_id]


def kv_head_offset(total: int, local: int) -> int:
    """The first of this tensor-parallel rank's ``local`` KV heads among the record's ``total``."""
    if local == total:
        return 0
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    if local * tp != total:
        raise ValueError(f"eviction record has {total} KV heads; this rank holds {local} of them "
                         f"at tensor parallel size {tp}")
    return ps.get_tensor_model_parallel_rank() * local


def check_record(rec: torch.Tensor, num_layers: int, num_kv_heads: int, n: int, i: int) -> None:
    if tuple(rec.shape) != (num_layers, num_kv_heads, n):
        raise ValueError(f"sample {i}: eviction record of shape {tuple(rec.shape)}, expected "
                         f"{(num_layers, num_kv_heads, n)} (layers, KV heads, prompt + response)")


def _masked_loop(q, k, v, masks: EvictionMasks, layer: int, cu: list[int], scale: float
                 ) -> torch.Tensor:
    out = q.new_zeros(q.shape)
    for a, b in zip(cu[:-1], cu[1:]):
        if b <= a:
            continue
        qs, ks, vs = (x[a:b].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        mask = masks.layer_mask(layer, a, b, q.shape[1])[None]
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale,
                                           enable_gqa=q.shape[1] != k.shape[1])
        out[a:b] = o[0].transpose(0, 1)
    return out



def _block_extrema(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 128-block (min, max) of the last dimension of ``x`` (a multiple of BLOCK long)."""
    blocks = x.unflatten(-1, (-1, BLOCK))
    return blocks.amin(-1), blocks.amax(-1)


def block_classes(evict: torch.Tensor, seq_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(partial, full) ``[..., Hkv, QB, KB]`` bool tiles from the record alone, for ``evict``
    ``[..., Hkv, T]`` (one layer or all of them at once) and ``seq_id`` ``[T]``, T a multiple of
    BLOCK, padding a sequence of its own: no T x T mask is ever evaluated (``create_block_mask``
    would, for every query head). Conservative where it must be: a tile is empty only if no pair
    in it attends, full only if every pair does; the rest are partial (mask_mod decides per
    element)."""
    t = torch.arange(seq_id.shape[0], device=seq_id.device)
    s_min, s_max = _block_extrema(seq_id)
    t_min, t_max = _block_extrema(t)
    e_min, e_max = _block_extrema(evict)  # [..., Hkv, KB]
    q = (slice(None), None)  # query blocks along dim -2, key blocks along dim -1
    k = (None, slice(None))
    same_seq = (s_min[q] <= s_max[k]) & (s_min[k] <= s_max[q])
    some = same_seq & (t_min[k] <= t_max[q]) & (e_max[..., None, :] > t_min[q])
    one_seq = (s_min == s_max)
    every = one_seq[q] & one_seq[k] & (s_min[q] == s_min[k]) & (t_max[k] <= t_min[q])
    every = every & (e_min[..., None, :] > t_max[q])
    return some & ~every, every


@dataclasses.dataclass(eq=False)
class LayerTiles:
    """Every layer's FlexAttention tiles of one pack, per KV head, in BlockMask's ordered form:
    the forward's (by query block) and the backward's (by key block), partial and full."""

    kv: tuple[torch.Tensor, torch.Tensor]  # ([L, Hkv, QB], [L, Hkv, QB, KB])
    full_kv: tuple[torch.Tensor, torch.Tensor]
    q: tuple[torch.Tensor, torch.Tensor]  # ([L, Hkv, KB], [L, Hkv, KB, QB])
    full_q: tuple[torch.Tensor, torch.Tensor]

    @classmethod
    def build(cls, evict: torch.Tensor, seq_id: torch.Tensor) -> "LayerTiles":
        """One vectorised pass over all layers (a few dozen kernels, not a few dozen a layer)."""
        partial, full = block_classes(evict, seq_id)
        return cls(ordered(partial), ordered(full), ordered(partial.mT), ordered(full.mT))

    def block_masks(self, evict: torch.Tensor, seq_id: torch.Tensor, q_heads: int,
                    backward: bool) -> list:
        """One ``BlockMask`` per layer, its tensors expanded to query heads."""
        from torch.nn.attention.flex_attention import BlockMask

        group = q_heads // evict.shape[1]
        parts = (*self.kv, *self.full_kv, *(self.q + self.full_q if backward else ()))
        per_layer = list(zip(*(_per_layer(x, group) for x in parts)))
        n = seq_id.shape[0]
        return [BlockMask(**block_mask_tensors(t), seq_lengths=(n, n), BLOCK_SIZE=(BLOCK, BLOCK),
                          mask_mod=_eviction_mask_mod(evict[layer], group))
                for layer, t in enumerate(per_layer)]


def _per_layer(x: torch.Tensor, group: int) -> list[torch.Tensor]:
    """``[L, Hkv, ...]`` -> L int32 ``[1, Hkv * group, ...]`` views. The kernels index a block
    mask's heads by query head (``h % H``), so GQA groups are repeated (views aligned:
    ``aligned_layers``)."""
    return [v[None] for v in aligned_layers(x.repeat_interleave(group, dim=1))]


def _eviction_mask_mod(ev: torch.Tensor, group: int):
    """The element mask of one layer. Every layer and pack gets a closure of this one code
    object: dynamo guards a closure by its code, and the tensors it captures (lifted to graph
    inputs) by dtype, shape and strides, not identity, so every layer's view of ``evict`` reuses
    one compiled kernel (a layer index baked in as a Python int would compile one per layer)."""
    def mask_mod(b, h, qi, kj):  # ev[., kj] <= the end of kj's sample (from_records)
        return (kj <= qi) & (qi < ev[h // group, kj])

    return mask_mod


def block_mask(masks: EvictionMasks, layer: int, q_heads: int):
    """The layer's FlexAttention ``BlockMask`` in this pass (all layers' built at the first)."""
    return masks.block_masks(q_heads)[layer]


_compiled_flex = None


def _flex_attention(cuda: bool):
    """FlexAttention, compiled on CUDA (unfused it materialises the scores). One compile serves
    every pack: pack lengths vary, and dynamo's automatic dynamic shapes turn the row counts
    into symbols at the first pack of another length (one recompile, then none; a static compile
    per length would hit ``recompile_limit`` and fall back to the unfused eager path). Grad
    mode is guarded: the recompute (no_grad) and the update compile once each."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if not cuda:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex


def _flex(q, k, v, masks: EvictionMasks, layer: int, scale: float) -> torch.Tensor:
    rows = q.shape[0]
    padded = masks.seq_id.shape[0]  # the pack's rows rounded up to BLOCK
    qs, ks, vs = (F.pad(x, (0, 0, 0, 0, 0, padded - rows)).transpose(0, 1).unsqueeze(0)
                  for x in (q, k, v))
    bm = block_mask(masks, layer, q.shape[1])
    o = _flex_attention(q.is_cuda)(qs, ks, vs, block_mask=bm, scale=scale,
                                   enable_gqa=q.shape[1] != k.shape[1])
    out = o[0].transpose(0, 1)[:rows]
    return torch.where(masks.real[:rows, None, None], out, 0.0)  # padding rows: zeros


def choose_sparse_impl(q: torch.Tensor, requested: str = "auto") -> str:
    if requested not in SPARSE_IMPLS:
        raise ValueError(f"unknown sparse attention {requested!r} ({', '.join(SPARSE_IMPLS)})")
    if requested != "auto":
        return requested
    return "flex" if q.is_cuda else "mask"


def sparse_packed_attention(q, k, v, masks: EvictionMasks, layer: int, cu_host: torch.Tensor,
                            *, scale: float, impl: str = "auto") -> torch.Tensor:
    """``thd`` q ``[t, hq, d]``, k/v ``[t, hkv, d]`` -> ``[t, hq * d]`` under the layer's
    eviction mask (padding rows after the last sample are zeros)."""
    impl = choose_sparse_impl(q, impl)
    if impl == "flex":
        out = _flex(q, k, v, masks, layer, scale)
    else:
        out = _masked_loop(q, k, v, masks, layer, cu_host.tolist(), scale)
    return out.reshape(q.shape[0], -1)
