"""Packed (``thd``) micro-batches: several sequences in one row, each attending only to itself.

A sample is ``prompt_ids + response_ids``. The logit at position i predicts token i + 1 of the
same sequence, so the log-prob of response token j (absolute position P + j) is read at position
P + j - 1; the last position of each sequence predicts nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterator

import torch

from .transfer import single_threaded, to_device_together


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

        # one pinned buffer, one copy (five copies were five pinned allocations and copies)
        tokens, targets, positions, index, cu = to_device_together(
            [self.tokens, self.targets, self.response_positions, self.response_index,
             self.cu_seqlens], torch.device(device))
        return dataclasses.replace(self, tokens=tokens, targets=targets,
                                   response_positions=positions, response_index=index,
                                   cu_seqlens_device=cu,
                                   eviction=None if self.eviction is None else self.eviction.to(device),
                                   bounds_on_device=transformer_engine_available())

    def split_per_sample(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-position values ``[T]`` -> one ``[response_len]`` tensor per sample (pack order)."""
        # precomputed positions: indexing with the boolean mask would sync with the GPU
        picked = values.index_select(0, self.response_index.to(values.device))
        return list(torch.split(picked, self.response_lengths))


@dataclasses.dataclass
class MicroBatches:
    """A pass's micro-batches, each packed (and copied to the device) when the schedule asks
    for it: the host builds micro-batch k + 1 while the device still runs k's queued kernels,
    instead of all of them up front with the device idle."""

    groups: list[list[int]]  # sample ids of each micro-batch
    tokens: list[int]  # rows each takes (padding excluded)
    build: Callable[[list[int]], "PackedBatch"]

    def __len__(self) -> int:
        return len(self.groups)

    def __iter__(self) -> Iterator["PackedBatch"]:
        return (self.build(g) for g in self.groups)

    @property
    def longest(self) -> int:
        return max(self.tokens)


def pack(samples: list[Sample], indices: list[int] | None = None, pad_to_multiple: int = 1,
         sparse: bool = False, device=None) -> PackedBatch:
    """``sparse``: attend under the samples' eviction records (samples without one: dense),
    built on ``device`` (default: the CPU; ``to`` moves the rest).

    Tensor ops over the whole pack, no loop over tokens: the pack is built on the host while
    the device runs the previous micro-batch (``PolicyTrainer``), and a per-token Python loop
    was ~30 ms a micro-batch of 8k tokens (1.3 s for one pass over 256 x 1.2k-token samples)."""
    with single_threaded():  # small host ops: a thread pool's hand-offs cost more on a busy host
        return _pack(samples, indices, pad_to_multiple, sparse, device)


def _pack(samples: list[Sample], indices: list[int] | None, pad_to_multiple: int,
          sparse: bool, device) -> PackedBatch:
    indices = list(range(len(samples))) if indices is None else indices
    seqs, bounds, records = [], [], []
    for i in indices:
        s = samples[i]
        if not s.response_ids:
            raise ValueError(f"sample {i} has an empty response")
        ids = torch.tensor(list(s.prompt_ids) + list(s.response_ids), dtype=torch.long)
        for lo, hi, record in _copies(s, sparse):  # one, or two for a dense recompute
            seqs.append(ids)
            bounds.append((lo, hi))
            records.append(record)
    lengths = [len(x) for x in seqs]
    total = sum(lengths)
    padded = -(-total // pad_to_multiple) * pad_to_multiple
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    tokens = torch.cat(seqs + [torch.zeros(padded - total, dtype=torch.long)])
    is_response = _response_positions(cu, torch.tensor(bounds, dtype=torch.long), padded)
    return PackedBatch(
        tokens=tokens.unsqueeze(0),
        targets=_next_tokens(tokens, cu),
        response_positions=is_response,
        cu_seqlens=cu,
        max_seqlen=max(lengths),
        response_lengths=[len(samples[i].response_ids) for i in indices],
        sample_indices=indices,
        response_index=is_response.nonzero().flatten(),
        eviction=_eviction_masks([samples[i] for i in indices], records, lengths, padded,
                                 device) if sparse else None,
    )


def _next_tokens(tokens: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """``[T]`` the next token of the same sequence (0 at each sequence's last position and in
    the padding)."""
    targets = torch.zeros_like(tokens)
    targets[:-1] = tokens[1:]
    targets[cu[1:].long() - 1] = 0
    return targets


def _response_positions(cu: torch.Tensor, bounds: torch.Tensor, padded: int) -> torch.Tensor:
    """``[padded]`` bool: position j of a sequence gives a log-prob when ``lo <= j < hi`` (its
    row of ``bounds``); padding never."""
    pos = torch.arange(int(cu[-1]))
    seq = torch.searchsorted(cu[1:].long(), pos, right=True)  # the sequence of each position
    offset = pos - cu[:-1].long()[seq]
    out = torch.zeros(padded, dtype=torch.bool)
    out[:len(pos)] = (offset >= bounds[seq, 0]) & (offset < bounds[seq, 1])
    return out


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
