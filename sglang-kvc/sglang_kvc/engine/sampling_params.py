"""Per-request sampling parameters (SGLang's names and defaults) with strict validation.

Unknown keys and values this engine cannot honour are errors (HTTP 400), never silently ignored:
a trainer that asks for a penalty and does not get it would learn from the wrong distribution.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

_UNSET = object()


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    sampling_seed: int | None = None
    # Accepted only at their neutral value (validated below).
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None
    custom_params: Any = None
    stop_regex: Any = None
    # token id -> added to its logit before sampling (OpenAI's; keys may be strings, as in JSON)
    logit_bias: dict[int, float] | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_dict(cls, d: dict | None, defaults: dict | None = None) -> "SamplingParams":
        """Build from a request's `sampling_params`; `defaults` fill keys the request leaves out."""
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise ValueError("sampling_params must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        values = dict(defaults or {})
        values.update({k: v for k, v in d.items() if v is not None or k in ("sampling_seed",)})
        p = cls(**{k: v for k, v in values.items() if k in known})
        p.stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        p.stop_token_ids = list(p.stop_token_ids or [])
        p.validate()
        return p

    def validate(self) -> None:
        def is_int(x):
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x):
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        for name in ("max_new_tokens", "min_new_tokens", "n", "top_k"):
            if not is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                     "repetition_penalty"):
            if not is_num(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must be in [0, max_new_tokens]")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a non-empty string or a list of them")
        if not all(is_int(t) for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be a list of integers")
        if self.sampling_seed is not None and not is_int(self.sampling_seed):
            raise ValueError("sampling_seed must be an integer")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                     "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean")
        self.logit_bias = _token_bias(self.logit_bias)
        neutral = dict(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0,
                       json_schema=None, regex=None, ebnf=None, stop_regex=None)
        for name, value in neutral.items():
            if getattr(self, name) != value:
                raise ValueError(f"{name} is not supported by this server")


def _token_bias(bias) -> dict[int, float] | None:
    """`logit_bias` as {token id: finite number}, None when empty; ValueError otherwise."""
    import math

    if not bias:
        return None
    if not isinstance(bias, dict):
        raise ValueError("logit_bias must be an object mapping token ids to numbers")
    out = {}
    for token, value in bias.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (number and math.isfinite(value)) or not str(token).lstrip("-").isdigit():
            raise ValueError(f"logit_bias: {token!r}: {value!r} is not a token id and a number")
        out[int(token)] = float(value)
    return out
