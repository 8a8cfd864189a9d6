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
    # per response token: 1 = the model's token (trained), 0 = context only (a multi-turn
    # sample's tool output / observation); None = all trained (a single-turn sample)
    loss_mask: list[int] | None = None

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
    positions: torch.Tensor  # [T] long: each token's position in its sequence (RoPE; 0 in padding)
    sample_rows: torch.Tensor  # [n] long: sample_indices as a tensor (a loss picks its rows)
    # [n, width] long: where response token j of sample i is in the pack; ``T`` (one past the
    # end: a zero) beyond its length. Only with ``pack(row_width=...)`` (``response_rows``).
    row_index: torch.Tensor | None = None
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

        # one pinned buffer, one copy of everything the micro-batch needs on the device (each
        # separate copy was a pinned allocation and a copy of its own)
        names = [name for name in _DEVICE_FIELDS if getattr(self, name) is not None]
        moved = dict(zip(names, to_device_together([getattr(self, name) for name in names],
                                                   torch.device(device))))
        cu = moved.pop("cu_seqlens")  # the host's bounds stay the host's
        return dataclasses.replace(self, **moved, cu_seqlens_device=cu,
                                   eviction=None if self.eviction is None else self.eviction.to(device),
                                   bounds_on_device=transformer_engine_available())

    def response_values(self, values: torch.Tensor) -> torch.Tensor:
        """Per-position values ``[T]`` -> the responses' ``[sum(response_lengths)]``, sample
        after sample (pack order)."""
        # precomputed positions: indexing with the boolean mask would sync with the GPU
        return values.index_select(0, self.response_index.to(values.device))

    def split_per_sample(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-position values ``[T]`` -> one ``[response_len]`` tensor per sample (pack order)."""
        return list(torch.split(self.response_values(values), self.response_lengths))

    def response_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Per-position values ``[T]`` -> ``[n, width]``: sample i's response in row i, zeros
        after it. One gather (differentiable) instead of a pad per sample and a stack."""
        if self.row_index is None:
            raise ValueError("response_rows needs a pack made with row_width")
        return torch.cat([values, values.new_zeros(1)])[self.row_index]


# what ``PackedBatch.to`` copies (``cu_seqlens`` stays on the host too: cu_seqlens_device)
_DEVICE_FIELDS = ("tokens", "targets", "response_positions", "response_index", "positions",
                  "sample_rows", "row_index", "cu_seqlens")


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
         sparse: bool = False, device=None, row_width: int | None = None) -> PackedBatch:
    """``sparse``: attend under the samples' eviction records (samples without one: dense),
    built on ``device`` (default: the CPU; ``to`` moves the rest). ``row_width``: the width of
    the loss's response rows (``PackedBatch.response_rows``).

    Tensor ops over the whole pack, no loop over tokens: the pack is built on the host while
    the device runs the previous micro-batch (``PolicyTrainer``), and a per-token Python loop
    was ~30 ms a micro-batch of 8k tokens (1.3 s for one pass over 256 x 1.2k-token samples)."""
    with single_threaded():  # small host ops: a thread pool's hand-offs cost more on a busy host
        return _pack(samples, indices, pad_to_multiple, sparse, device, row_width)


def _pack(samples: list[Sample], indices: list[int] | None, pad_to_multiple: int,
          sparse: bool, device, row_width: int | None) -> PackedBatch:
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
    seq = torch.searchsorted(cu[1:].long(), torch.arange(total), right=True)  # of each position
    positions = _positions(cu, seq, padded)
    is_response = _response_positions(seq, positions, torch.tensor(bounds, dtype=torch.long))
    response_lengths = [len(samples[i].response_ids) for i in indices]
    response_index = is_response.nonzero().flatten()
    return PackedBatch(
        tokens=tokens.unsqueeze(0),
        targets=_next_tokens(tokens, cu),
        response_positions=is_response,
        cu_seqlens=cu,
        max_seqlen=max(lengths),
        response_lengths=response_lengths,
        sample_indices=indices,
        response_index=response_index,
        positions=positions,
        sample_rows=torch.tensor(indices, dtype=torch.long),
        row_index=None if row_width is None else _row_index(response_index, response_lengths,
                                                             row_width, padded),
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


def _positions(cu: torch.Tensor, seq: torch.Tensor, padded: int) -> torch.Tensor:
    """``[padded]`` long: each position's offset in its own sequence (``seq``: the sequence
    of each position), 0 in the padding."""
    out = torch.zeros(padded, dtype=torch.long)
    out[:len(seq)] = torch.arange(len(seq)) - cu[:-1].long()[seq]
    return out


def _response_positions(seq: torch.Tensor, positions: torch.Tensor, bounds: torch.Tensor
                        ) -> torch.Tensor:
    """``[padded]`` bool: position j of a sequence gives a log-prob when ``lo <= j < hi`` (its
    row of ``bounds``); padding never."""
    offset = positions[:len(seq)]
    out = torch.zeros(len(positions), dtype=torch.bool)
    out[:len(seq)] = (offset >= bounds[seq, 0]) & (offset < bounds[seq, 1])
    return out


def _row_index(response_index: torch.Tensor, lengths: list[int], width: int, padded: int
               ) -> torch.Tensor:
    """``[n, width]``: the pack position of response token j of sample i (its tokens are
    ``response_index[start_i:start_i + length_i]``, consecutive over both copies of a sample
    replayed twice), ``padded`` beyond the response (``response_rows`` appends a zero there)."""
    if max(lengths) > width:
        raise ValueError(f"a response of {max(lengths)} tokens does not fit rows of {width}")
    sizes = torch.tensor(lengths, dtype=torch.long)
    starts = torch.cumsum(sizes, 0) - sizes
    column = torch.arange(width)
    flat = (starts[:, None] + column[None, :]).clamp(max=max(len(response_index) - 1, 0))
    return torch.where(column[None, :] < sizes[:, None], response_index[flat], padded)


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
