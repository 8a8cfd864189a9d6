"""Packed (``thd``) micro-batches: several sequences in one row, each attending only to itself.

A sample is ``prompt_ids + response_ids``. The logit at position i predicts token i + 1 of the
same sequence, so the log-prob of response token j (absolute position P + j) is read at position
P + j - 1; the last position of each sequence predicts nothing.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .transfer import to_device


@dataclasses.dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    # the rollout engine's eviction record [layers, KV heads, length] (None: dense sampler)
    eviction_record: torch.Tensor | None = None
    # the engine recomputed this sample densely from this query on (a preemption after an
    # eviction): a sparse pack replays it as two sequences, masked before and dense after
    eviction_dense_from: int | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclasses.dataclass
class PackedBatch:
    tokens: torch.Tensor  # [1, T] long: the sequences back to back (plus padding)
    targets: torch.Tensor  # [T] long: next token of the same sequence (0 where none)
    response_positions: torch.Tensor  # [T] bool: position whose target is a response token
    cu_seqlens: torch.Tensor  # [n + 1] int32, always on the CPU (host-side bounds)
    max_seqlen: int
    response_lengths: list[int]
    sample_indices: list[int]  # which samples of the global batch, in pack order
    response_index: torch.Tensor  # [sum(response_lengths)] long: positions of response_positions
    cu_seqlens_device: torch.Tensor | None = None  # cu_seqlens on the compute device (``to``)
    bounds_on_device: bool = False  # Megatron's kernels (Transformer Engine's) read the device copy
    eviction: object | None = None  # sparse_attention.EvictionMasks: attend as the sampler did

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    def packed_seq_params(self):
        """Megatron's ``thd`` parameters, with the host-side facts attention needs (bounds,
        longest sequence, token count) so no layer has to read them back from the GPU."""
        from .attention import PackedAttentionParams

        device_cu = self.cu_seqlens_device if self.cu_seqlens_device is not None else self.cu_seqlens
        cu = device_cu if self.bounds_on_device else self.cu_seqlens
        return PackedAttentionParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                     max_seqlen_q=self.max_seqlen, max_seqlen_kv=self.max_seqlen,
                                     cu_seqlens_host=self.cu_seqlens, cu_seqlens_device=device_cu,
                                     num_tokens=self.num_tokens, eviction=self.eviction)

    def to(self, device) -> "PackedBatch":
        # Megatron gets the CPU cu_seqlens: our RoPE builds its tables from it once per
        # micro-batch, and a GPU copy would cost a host sync there (measured: ~20% of a train
        # step idle). Attention takes the device copy made here, once, before the micro-batch
        # loop. Transformer Engine's kernels want cu_seqlens on the GPU.
        from .model_provider import transformer_engine_available

        move = functools.partial(to_device, device=torch.device(device))
        return dataclasses.replace(self, tokens=move(self.tokens), targets=move(self.targets),
                                   response_positions=move(self.response_positions),
                                   response_index=move(self.response_index),
                                   cu_seqlens_device=move(self.cu_seqlens),
                                   eviction=None if self.eviction is None else self.eviction.to(device),
                                   bounds_on_device=transformer_engine_available())

    def split_per_sample(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-position values ``[T]`` -> one ``[response_len]`` tensor per sample (pack order)."""
        # precomputed positions: indexing with the boolean mask would sync with the GPU
        picked = values.index_select(0, self.response_index.to(values.device))
        return list(torch.split(picked, self.response_lengths))


def pack(samples: list[Sample], indices: list[int] | None = None, pad_to_multiple: int = 1,
         sparse: bool = False, device=None) -> PackedBatch:
    """``sparse``: attend under the samples' eviction records (samples without one: dense),
    built on ``device`` (default: the CPU; ``to`` moves the rest)."""
    indices = list(range(len(samples))) if indices is None else indices
    tokens, targets, is_response, lengths, records = [], [], [], [], []
    for i in indices:
        s = samples[i]
        if not s.response_ids:
            raise ValueError(f"sample {i} has an empty response")
        seq = list(s.prompt_ids) + list(s.response_ids)
        for lo, hi, record in _copies(s, sparse):  # one, or two for a dense recompute
            tokens += seq
            targets += seq[1:] + [0]
            is_response += [lo <= j < hi for j in range(len(seq))]
            lengths.append(len(seq))
            records.append(record)
    total = len(tokens)
    padded = -(-total // pad_to_multiple) * pad_to_multiple
    pad = padded - total
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return PackedBatch(
        tokens=torch.tensor(tokens + [0] * pad).unsqueeze(0),
        targets=torch.tensor(targets + [0] * pad),
        response_positions=torch.tensor(is_response + [False] * pad),
        cu_seqlens=cu,
        max_seqlen=max(lengths),
        response_lengths=[len(samples[i].response_ids) for i in indices],
        sample_indices=indices,
        response_index=torch.tensor([j for j, r in enumerate(is_response) if r], dtype=torch.long),
        eviction=_eviction_masks([samples[i] for i in indices], records, lengths, padded,
                                 device) if sparse else None,
    )


def _copies(s: Sample, sparse: bool) -> list[tuple[int, int, torch.Tensor | None]]:
    """The sample's sequences in a pack: (first, end) of the positions whose log-probs it gives,
    and the record it attends under. A sample the engine recomputed densely from query d on
    (K/V of every earlier position recomputed with full attention) needs two forwards: masked
    for the queries before d, dense from d on; both copies are in the pack."""
    first, end = len(s.prompt_ids) - 1, s.length - 1
    record = s.eviction_record if sparse else None
    d = s.eviction_dense_from
    if record is None or d is None or not first < d < end:
        return [(first, end, record)]
    return [(first, d, record), (d, end, None)]


def packed_length(s: Sample, sparse: bool) -> int:
    """Rows the sample takes in a pack (twice its length when replayed in two forwards)."""
    return s.length * len(_copies(s, sparse))


def _eviction_masks(picked: list[Sample], records: list, lengths: list[int], total: int, device):
    """The pack's masks, or the ones already built for the same pack in this rollout
    (``replay_cache``): one pass of its own over them either way."""
    from .replay_cache import cached_masks
    from .sparse_attention import EvictionMasks

    shaped = next((r for r in records if r is not None), None)
    if shaped is None:  # a dense sampler: nothing to replay
        return None
    build = functools.partial(EvictionMasks.from_records, records, lengths, shaped.shape[0],
                              shaped.shape[1], total, device)
    return cached_masks(picked, (total, str(torch.device(device or "cpu"))), build).use()


def split_by_token_budget(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Greedy first-fit-decreasing of sequences into micro-batches of at most ``max_tokens``.

    A sequence longer than the budget gets a micro-batch of its own (never dropped).
    """
    if max_tokens <= 0:
        raise ValueError("max_tokens must be positive")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[tuple[int, list[int]]] = []
    for i in order:
        for b, (used, members) in enumerate(bins):
            if used + lengths[i] <= max_tokens:
                bins[b] = (used + lengths[i], members + [i])
                break
        else:
            bins.append((lengths[i], [i]))
    return [sorted(members) for _, members in bins]
