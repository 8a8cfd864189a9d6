"""The shared interface of compression policies, and their configuration.

A policy is pure tensor code: given the held keys of a batch of (request, layer) pairs and the
cached observation-window queries, it returns which token positions each layer and KV head
keeps. It never touches the pool, the slot table or a request; `compressor.py` does that.

Shapes (R requests, all holding the same n tokens; L layers; Hkv KV heads, Hq query heads;
w = window; D = head_dim):
    keys    [R, L, Hkv, n, D]   post-RoPE, in the order the request's slot table holds them
    queries [R, L, Hq,  w, D]   post-RoPE, the last w queries (order irrelevant)
    result  [R, L, Hkv, keep]   int64 positions in [0, n), ascending
Query head h belongs to KV head h // (Hq // Hkv) (the HF `repeat_kv` convention).
"""

from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CompressionConfig:
    algorithm: str  # rkv | snapkv | streamingllm
    budget: int = 512  # B: tokens kept after a compression (--compress-max-prompt)
    window: int = 8  # w: observation window, always kept
    divide_method: str = "step_length"  # step_length | newline
    divide_length: int = 128  # N: compress once B + N tokens are held
    mix_lambda: float = 0.1
    kernel_size: int = 7
    pooling: str = "max"  # max | avg
    sim_threshold: float = 0.5
    num_sink: int = 4
    compress_prompt: bool = False
    keep_prompt: bool = False  # the prompt's KV is never evicted; B budgets the response
    pin_turns: bool = False  # with keep_prompt: a session request pins its turn's prompt (trigger.py)
    stop_after_think: bool = True
    selection: str = "head"  # head | layer
    shared_selection: bool = False

    @property
    def capacity(self) -> int:
        """Most tokens a compressing request holds at the end of a step: B + N (plus its prompt
        with keep_prompt, see trigger.py)."""
        return self.budget + self.divide_length

    def check_budget(self, budget: int) -> None:
        """A request's own budget must leave room for the window (and StreamingLLM's sinks),
        as --compress-max-prompt must."""
        if budget <= self.window:
            raise ValueError(f"compress_budget ({budget}) must be larger than the window "
                             f"--compress-max-window ({self.window})")
        sinks = self.policy_config().num_sink
        if self.algorithm == "streamingllm" and sinks > budget - self.window:
            raise ValueError(f"compress_budget ({budget}) must be >= --compress-num-sink "
                             f"({sinks}) + --compress-max-window ({self.window})")

    def policy_config(self) -> "CompressionConfig":
        """What the policy scores with. With keep_prompt it only sees the response part, and
        the kept prompt holds the sequence's first tokens, StreamingLLM's sinks: no response
        token is pinned as a sink."""
        return dataclasses.replace(self, num_sink=0) if self.keep_prompt else self

    @property
    def mode(self) -> str:
        return "shared" if self.shared_selection else self.selection

    @classmethod
    def from_server_args(cls, args) -> "CompressionConfig | None":
        """None when compression is off. Values were validated by ServerArgs."""
        if args.compress_algorithm is None:
            return None
        return cls(
            algorithm=args.compress_algorithm, budget=args.compress_max_prompt,
            window=args.compress_max_window, divide_method=args.compress_divide_method,
            divide_length=args.compress_divide_length, mix_lambda=float(args.compress_mix_lambda),
            kernel_size=args.compress_kernel_size, pooling=args.compress_pooling,
            sim_threshold=float(args.compress_sim_threshold), num_sink=args.compress_num_sink,
            compress_prompt=args.compress_prompt, keep_prompt=args.compress_keep_prompt,
            pin_turns=args.compress_pin_turns,
            stop_after_think=args.compress_stop_after_think,
            selection=args.compress_selection, shared_selection=args.compress_shared_selection)


class CompressionPolicy(abc.ABC):
    """Scores the non-window tokens; `select` turns scores into kept positions."""

    needs_queries = True  # whether the engine must keep the query ring for this policy

    def __init__(self, cfg: CompressionConfig):
        self.cfg = cfg

    def scratch_elems(self, m: int, device, head_dim: int) -> int:
        """Extra elements scoring m tokens needs per (layer, KV head), beyond keys, queries and
        scores, on `device`: the compressor sizes its chunks of requests with it."""
        return 0

    @abc.abstractmethod
    def score(self, keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """[R, L, Hkv, n - w] float scores of the non-window tokens; higher is kept first."""

    def select(self, keys: torch.Tensor, queries: torch.Tensor, keep: int) -> torch.Tensor:
        """Kept positions [R, L, Hkv, keep]: the top (keep - w) scored tokens + the last w."""
        n, w = keys.shape[-2], self.cfg.window
        if not w < keep < n:
            raise ValueError(f"cannot keep {keep} of {n} tokens with window {w}")
        s = self.score(keys, queries)
        mode = self.cfg.mode
        if mode == "layer":  # one set per layer: every KV head votes
            s = s.sum(2, keepdim=True).expand_as(s)
        elif mode == "shared":  # the reference: layer 0 decides for every layer and head
            s = s[:, :1].sum(2, keepdim=True).expand_as(s)
        # A stable sort, not topk: max pooling makes exact ties common, and ties must go the
        # same way on every device (earlier position first) for reproducible rollouts.
        top = s.sort(dim=-1, descending=True, stable=True).indices[..., :keep - w]
        win = torch.arange(n - w, n, device=keys.device).expand(*top.shape[:-1], w)
        return torch.cat([top, win], dim=-1).sort(dim=-1).values
