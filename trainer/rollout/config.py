"""The rollout side's flags, read here and nowhere else: the prompt data, what each rollout samples
and how it is scored, where the engines run, how weights reach them.

    setup = rollout_setup_from_args(args)
    setup.data.prompt_stream(tokenizer)          # training prompts, seeded epochs
    setup.plan.sampling_for(rollout_id)          # sampling params with that rollout's seeds
    setup.engines.server_args(device="cuda:0")   # a colocated engine's ServerArgs

The colocated engine's own flags are sglang-kvc's ``ServerArgs`` fields under the ``--sglang-``
prefix (:func:`add_engine_args`), validated by the server's own rules.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch

from ..algorithms.adaptive_budget import AdaptiveBudgetConfig
from ..algorithms.overlong import OverlongConfig
from .async_rollout import AsyncConfig
from .backends import HTTPRollout, RolloutConfig
from .data import PromptStream, load_prompts
from .dynamic_sampling import DynamicSamplingConfig
from .fidelity import adaptive_config_from_args
from .generate import load_generate_plugin, parse_options
from .rewards import RewardConfig, reward_config_from_args

ENGINE_PREFIX = "sglang_"  # dest of ``--sglang-<field>``: one ServerArgs field
# Server flags that make no sense for an engine the trainer starts itself.
_SERVER_FLAGS_NOT_FORWARDED = {"model_path", "tokenizer_path", "host", "port", "log_level",
                               "served_model_name", "weight_version"}


@dataclasses.dataclass
class DataConfig:
    """The prompts a run trains and evaluates on, and how they become token ids."""

    tokenizer_path: str  # --hf-checkpoint
    prompt_data: str  # 'file.jsonl', or 'file.jsonl@[0:1000]' for a slice
    input_key: str = "prompt"
    label_key: str = "label"
    apply_chat_template: bool = False
    max_prompt_len: int | None = None  # training prompts only: eval prompts are kept whole
    seed: int = 1234  # each epoch's order
    shuffle: bool = True
    eval_data: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (name, path)
    eval_input_key: str = "prompt"
    eval_label_key: str = "label"

    def prompt_stream(self, tokenizer) -> PromptStream:
        prompts = load_prompts(self.prompt_data, tokenizer, input_key=self.input_key,
                               label_key=self.label_key,
                               apply_chat_template=self.apply_chat_template,
                               max_prompt_len=self.max_prompt_len)
        return PromptStream(prompts, seed=self.seed, shuffle=self.shuffle)

    def eval_sets(self, tokenizer) -> dict:
        return {name: load_prompts(path, tokenizer, input_key=self.eval_input_key,
                                   label_key=self.eval_label_key,
                                   apply_chat_template=self.apply_chat_template)
                for name, path in self.eval_data}


@dataclasses.dataclass
class RolloutPlan:
    """What each rollout (and each evaluation) asks of the engines, and how it is scored."""

    batch_size: int  # prompts per rollout
    n_samples: int  # per prompt
    sampling: RolloutConfig  # its seed is set per rollout: sampling_for
    seed: int
    reward: RewardConfig
    reward_bias: float = 0.0  # training rewards are (reward + bias) x scaling
    reward_scaling: float = 1.0
    eval_samplings: tuple[RolloutConfig, ...] = (RolloutConfig(),)  # one per --eval-temperature
    n_eval_samples: int = 1  # per eval prompt at T > 0 (greedy passes draw one)
    eval_modes: tuple[str, ...] = ("train",)  # "train": the engines' compression; "dense": none
    generate_plugin: str | None = None  # 'pkg.module:func_or_class'
    generate_args: list[str] | None = None  # its options, key=value
    debug_path: str | None = None  # each rollout's samples as JSONL; '{rollout_id}' substituted
    overlong: OverlongConfig = dataclasses.field(default_factory=OverlongConfig)  # training only
    dynamic: DynamicSamplingConfig = dataclasses.field(default_factory=DynamicSamplingConfig)
    adaptive: AdaptiveBudgetConfig | None = None  # --adaptive-budget-*: None = the engines' B

    def sampling_for(self, rollout_id: int) -> RolloutConfig:
        # per-sample seeds derived from (seed, rollout id): a resumed run samples exactly what
        # an uninterrupted one would have, with any number of engines
        return dataclasses.replace(self.sampling,
                                   seed=(self.seed * 1_000_003 + rollout_id * 65_537) % 2**31)

    def eval_configs(self) -> list[tuple[str, RolloutConfig, int]]:
        """(metric suffix, sampling, samples per prompt) of each evaluation pass: one per
        temperature (the first unsuffixed, then '_t<T>') and compression mode ('' as trained,
        '_dense' dense). A greedy pass draws one sample: more would be copies."""
        return [(_temperature_suffix(i, s) + ("" if m == "train" else "_dense"),
                 s if m == "train" else dataclasses.replace(s, compress=False),
                 1 if s.temperature == 0 else self.n_eval_samples)
                for i, s in enumerate(self.eval_samplings) for m in self.eval_modes]

    def load_plugin(self):
        """The generate plug-in, or None when rollouts are plain samples."""
        if not self.generate_plugin:
            return None
        return load_generate_plugin(self.generate_plugin, parse_options(self.generate_args))


def _temperature_suffix(index: int, sampling: RolloutConfig) -> str:
    return "" if index == 0 else f"_t{sampling.temperature:g}"


@dataclasses.dataclass
class EngineConfig:
    """Where samples come from: in-process engines colocated with the trainer, or servers."""

    model_path: str  # what a colocated engine serves first (--hf-checkpoint)
    engine_flags: dict  # the --sglang-* values by ServerArgs field
    server_urls: list[str] | None = None  # SGLang-API servers instead of colocated engines
    engine_urls: list[str] | None = None  # the engines behind a router given as server_urls
    offload: bool | None = None  # release the KV pool while training; None: with a GPU
    per_gpu: bool = True  # colocated: an engine on every GPU (False: one per data-parallel replica)
    num_gpus: int = 0  # --rollout-num-gpus: engine processes on GPUs of their own (rank 0 starts them)

    @property
    def remote(self) -> bool:
        return bool(self.server_urls)

    def offloads(self) -> bool:
        return self.offload if self.offload is not None else torch.cuda.is_available()

    def control_backend(self, backend):
        """Where weight updates go: the servers (``backend``), or the engines behind a router
        (``engine_urls``), since a router forwards generation only; None for colocated engines."""
        if not self.remote or backend is None:
            return None
        return HTTPRollout(self.engine_urls) if self.engine_urls else backend

    def server_args(self, device: str | None = None):
        """The colocated engine's ServerArgs; ``device`` (this rank's GPU) replaces ``auto``."""
        from sglang_kvc.server_args import ServerArgs

        values = dict(self.engine_flags)
        if device is not None and values.get("device", "auto") == "auto":
            values["device"] = device
        return ServerArgs(model_path=self.model_path, **values)


@dataclasses.dataclass
class WeightSyncConfig:
    mode: str  # a weight_sync.MODES transport (the flag's "auto" is resolved by then)
    bucket_bytes: int = 512 << 20
    master_address: str | None = None  # distributed: None means $MASTER_ADDR when the sync starts
    timeout_s: float = 120.0  # distributed: how long a broadcast may wait for a member


@dataclasses.dataclass
class RolloutSetup:
    """Everything the rollout side of a run takes from the flags."""

    data: DataConfig
    plan: RolloutPlan
    engines: EngineConfig
    weight_sync: WeightSyncConfig
    asynchrony: AsyncConfig = dataclasses.field(default_factory=AsyncConfig)


def rollout_setup_from_args(args: argparse.Namespace) -> RolloutSetup:
    return RolloutSetup(data_config_from_args(args), rollout_plan_from_args(args),
                        engine_config_from_args(args), weight_sync_config_from_args(args),
                        AsyncConfig(args.max_staleness, args.partial_rollout))


def data_config_from_args(args: argparse.Namespace) -> DataConfig:
    pairs = args.eval_prompt_data or []
    return DataConfig(
        tokenizer_path=args.hf_checkpoint, prompt_data=args.prompt_data, input_key=args.input_key,
        label_key=args.label_key, apply_chat_template=args.apply_chat_template,
        max_prompt_len=args.max_prompt_len, seed=args.seed, shuffle=args.rollout_shuffle,
        eval_data=list(zip(pairs[::2], pairs[1::2])),
        eval_input_key=args.eval_input_key or args.input_key,
        eval_label_key=args.eval_label_key or args.label_key)


def rollout_plan_from_args(args: argparse.Namespace) -> RolloutPlan:
    return RolloutPlan(
        batch_size=args.rollout_batch_size, n_samples=args.n_samples_per_prompt,
        sampling=sampling_config_from_args(args), seed=args.seed,
        reward=reward_config_from_args(args), reward_bias=args.reward_bias,
        reward_scaling=args.reward_scaling, eval_samplings=eval_samplings_from_args(args),
        n_eval_samples=args.n_samples_per_eval_prompt,
        eval_modes={"train": ("train",), "dense": ("dense",),
                    "both": ("train", "dense")}[args.eval_compression],
        generate_plugin=args.custom_generate_function_path,
        generate_args=args.custom_generate_args, debug_path=args.save_debug_rollout_data,
        overlong=OverlongConfig(args.overlong_buffer_len, args.overlong_penalty_factor,
                                args.overlong_filtering),
        dynamic=DynamicSamplingConfig(args.dynamic_sampling_filter_path,
                                      args.over_sampling_batch_size),
        adaptive=adaptive_config_from_args(args))


def sampling_config_from_args(args: argparse.Namespace) -> RolloutConfig:
    return RolloutConfig(
        max_response_len=args.rollout_max_response_len, temperature=args.rollout_temperature,
        top_p=args.rollout_top_p, top_k=args.rollout_top_k,
        stop_token_ids=args.rollout_stop_token_ids, seed=None,
        concurrency=args.rollout_concurrency,
        samples_per_request=args.rollout_samples_per_request,
        dense_per_group=getattr(args, "n_dense_samples_per_prompt", 0),
        # the learner replays the sampler's evictions (learner/config.py's replay flags)
        eviction_record=getattr(args, "sparse_recompute", False)
        or getattr(args, "train_sparse_policy", False))


def eval_samplings_from_args(args: argparse.Namespace) -> tuple[RolloutConfig, ...]:
    return tuple(RolloutConfig(
        max_response_len=args.eval_max_response_len or args.rollout_max_response_len,
        temperature=t, top_p=args.eval_top_p,
        stop_token_ids=args.rollout_stop_token_ids, concurrency=args.rollout_concurrency,
        samples_per_request=args.rollout_samples_per_request)
        for t in args.eval_temperature)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    flags = {k[len(ENGINE_PREFIX):]: v for k, v in vars(args).items()
             if k.startswith(ENGINE_PREFIX)}
    return EngineConfig(model_path=args.hf_checkpoint, engine_flags=flags,
                        server_urls=args.rollout_server_urls,
                        engine_urls=args.rollout_engine_urls, offload=args.offload_rollout,
                        per_gpu=args.rollout_engine_placement == "per-gpu",
                        num_gpus=args.rollout_num_gpus)


def weight_sync_config_from_args(args: argparse.Namespace) -> WeightSyncConfig:
    return WeightSyncConfig(mode=args.weight_sync, bucket_bytes=args.weight_sync_bucket_mb << 20,
                            master_address=args.weight_sync_master_address,
                            timeout_s=args.weight_sync_timeout)


def server_args_from(args: argparse.Namespace, device: str | None = None):
    """The colocated engine's ServerArgs from the flags (``--sglang-*``, ``--hf-checkpoint``)."""
    return engine_config_from_args(args).server_args(device)


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register ``--sglang-<field>`` for every ServerArgs field a colocated engine takes."""
    from sglang_kvc.server_args import ServerArgs

    group = parser.add_argument_group("rollout engine (--sglang-*, as sglang-kvc's flags)")
    for f in dataclasses.fields(ServerArgs):
        if f.name not in _SERVER_FLAGS_NOT_FORWARDED:
            _add_engine_flag(group, f)
    return parser


def _add_engine_flag(group, f: dataclasses.Field) -> None:
    meta = dict(f.metadata)
    help_text = meta.pop("help")
    negatable = meta.pop("negatable", False)
    flag, dest = "--sglang-" + f.name.replace("_", "-"), ENGINE_PREFIX + f.name
    if f.type in ("bool", bool):
        action = argparse.BooleanOptionalAction if negatable else "store_true"
        group.add_argument(flag, dest=dest, action=action, default=f.default, help=help_text)
    else:
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        group.add_argument(flag, dest=dest, type=kind, default=f.default,
                           help=f"{help_text} (default: {f.default})", **meta)
