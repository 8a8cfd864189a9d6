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

from ..algorithms.adaptive_budget import AdaptiveBudgetConfig
from ..algorithms.overlong import OverlongConfig
from .async_rollout import AsyncConfig
from .dynamic_sampling import DynamicSamplingConfig
from .engines.config import (EngineConfig, WeightSyncConfig, add_engine_args, add_server_args,
                             engine_config_from_args, weight_sync_config_from_args)
from .engines.interface import RolloutConfig
from .multiturn.flags import MultiTurnConfig, add_multiturn_args, multiturn_config_from_args
from .samples.data import PromptStream, load_prompts
from .samples.fidelity import adaptive_config_from_args
from .samples.generate import load_generate_plugin, parse_options
from .samples.single_turn import SingleTurn
from .samples.rewards import RewardConfig, reward_config_from_args


@dataclasses.dataclass
class DataConfig:
    """The prompts a run trains and evaluates on, and how they become token ids."""

    tokenizer_path: str  # --hf-checkpoint
    prompt_data: str  # 'file.jsonl', or 'file.jsonl@[0:1000]' for a slice
    seed: int  # --seed: each epoch's order
    input_key: str = "prompt"
    label_key: str = "label"
    apply_chat_template: bool = False
    max_prompt_len: int | None = None  # training prompts only: eval prompts are kept whole
    shuffle: bool = True
    eval_data: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (name, path)
    eval_input_key: str | None = None  # None: input_key's
    eval_label_key: str | None = None  # None: label_key's

    def __post_init__(self) -> None:  # the eval sets' keys are the training prompts' unless given
        self.eval_input_key = self.eval_input_key or self.input_key
        self.eval_label_key = self.eval_label_key or self.label_key

    def prompt_stream(self, tokenizer) -> PromptStream:
        prompts = load_prompts(self.prompt_data, tokenizer, input_key=self.input_key,
                               label_key=self.label_key,
                               apply_chat_template=self.apply_chat_template,
                               max_prompt_len=self.max_prompt_len)
        return PromptStream(prompts, seed=self.seed, shuffle=self.shuffle)

    def load(self):
        """The tokenizer, the training prompt stream and the eval sets, as a startup phase."""
        from transformers import AutoTokenizer

        from ..launch import phase

        with phase("tokenizer and prompt data") as info:
            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
            prompts, eval_sets = self.prompt_stream(tokenizer), self.eval_sets(tokenizer)
            info["detail"] = f"{len(prompts.prompts)} prompts, {len(eval_sets)} eval set(s)"
        return tokenizer, prompts, eval_sets

    def eval_sets(self, tokenizer) -> dict:
        return {name: load_prompts(path, tokenizer, input_key=self.eval_input_key,
                                   label_key=self.eval_label_key,
                                   apply_chat_template=self.apply_chat_template)
                for name, path in self.eval_data}


@dataclasses.dataclass(kw_only=True)  # keywords only: a default may stand before a required field
class RolloutPlan:
    """What each rollout (and each evaluation) asks of the engines, and how it is scored."""

    batch_size: int  # prompts per rollout
    n_samples: int = 8  # per prompt (--n-samples-per-prompt)
    sampling: RolloutConfig  # its seed is set per rollout: sampling_for
    seed: int
    reward: RewardConfig
    # training rewards are (reward + bias) x scaling; --reward-bias / --reward-scaling's defaults
    reward_bias: float
    reward_scaling: float
    eval_samplings: tuple[RolloutConfig, ...] = (RolloutConfig(),)  # one per --eval-temperature
    n_eval_samples: int = 1  # per eval prompt at T > 0 (greedy passes draw one)
    eval_modes: tuple[str, ...] = ("train",)  # "train": the engines' compression; "dense": none
    generate_plugin: str | None = None  # 'pkg.module:func_or_class'
    generate_args: list[str] | None = None  # its options, key=value
    debug_path: str | None = None  # each rollout's samples as JSONL; '{rollout_id}' substituted
    overlong: OverlongConfig = dataclasses.field(default_factory=OverlongConfig)  # training only
    dynamic: DynamicSamplingConfig = dataclasses.field(default_factory=DynamicSamplingConfig)
    adaptive: AdaptiveBudgetConfig | None = None  # --adaptive-budget-*: None = the engines' B
    multiturn: MultiTurnConfig | None = None  # --env-path: multi-turn episodes

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
        """The generate plug-in: the multi-turn episodes, a user's, or the single-turn default."""
        if self.multiturn is not None:
            return self.multiturn.plugin()
        if not self.generate_plugin:
            return SingleTurn()
        return load_generate_plugin(self.generate_plugin, parse_options(self.generate_args))


def _temperature_suffix(index: int, sampling: RolloutConfig) -> str:
    return "" if index == 0 else f"_t{sampling.temperature:g}"


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
        eval_input_key=args.eval_input_key, eval_label_key=args.eval_label_key)


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
        adaptive=adaptive_config_from_args(args), multiturn=multiturn_config_from_args(args))


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


def add_rollout_args(parser: argparse.ArgumentParser) -> None:
    """The rollout side's flags: data, sampling and engines, evaluation, rewards, fidelity."""
    from .samples.fidelity import add_fidelity_args
    from .samples.rewards import add_reward_args

    for add in (_add_data_args, _add_rollout_args, add_engine_args, _add_eval_args,
                add_reward_args, add_fidelity_args, add_multiturn_args):
        add(parser)


def _add_data_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollout: data")
    g.add_argument("--prompt-data", required=True,
                   help="JSONL/parquet of prompts; 'file.jsonl@[0:1000]' takes a slice")
    g.add_argument("--input-key", default=DataConfig.input_key)  # the config declares it
    g.add_argument("--label-key", default=DataConfig.label_key)
    g.add_argument("--apply-chat-template", action="store_true",
                   help="wrap string prompts in the tokenizer's chat template (message lists "
                        "always are)")
    g.add_argument("--rollout-shuffle", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--max-prompt-len", type=int, default=None,
                   help="keep only the last N prompt tokens")


def _add_rollout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollout")
    _add_sampling_args(g)
    add_server_args(g)
    _add_rollout_extras(g)


def _add_sampling_args(g) -> None:
    g.add_argument("--rollout-batch-size", type=int, default=32, help="prompts per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, default=RolloutPlan.n_samples)
    g.add_argument("--rollout-max-response-len", type=int, default=1024)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="*", default=None)
    g.add_argument("--overlong-buffer-len", type=int, default=0,
                   help="DAPO soft over-long penalty (verl's overlong_buffer.len): responses longer "
                        "than --rollout-max-response-len minus this lose up to "
                        "--overlong-penalty-factor of training reward, linearly (default: 0, off)")
    g.add_argument("--overlong-penalty-factor", type=float, default=1.0,
                   help="the over-long penalty at the maximum length (default: 1.0)")
    g.add_argument("--overlong-filtering", action="store_true",
                   help="DAPO over-long filtering: truncated samples are masked from the loss")
    g.add_argument("--dynamic-sampling-filter-path", default=None,
                   help="DAPO dynamic sampling (slime's flag): keep only the prompt groups this "
                        "filter passes, generating rounds until the batch is full; "
                        "'reward_nonzero_std' (built in: rewards not all equal) or "
                        "'pkg.module:fn', fn(group: list[Trace]) -> bool")
    g.add_argument("--over-sampling-batch-size", type=int, default=None,
                   help="prompts per dynamic-sampling round (slime's flag; default: "
                        "--rollout-batch-size)")


def _add_rollout_extras(g) -> None:
    """Debug dumps, generate plug-ins, the colocated engine's memory."""
    g.add_argument("--save-debug-rollout-data", default=None,
                   help="write each rollout's samples (ids, log-probs, reward, engine) as JSONL to "
                        "this path; '{rollout_id}' in it is replaced (slime's flag)")
    g.add_argument("--custom-generate-function-path", default=None,
                   help="generate plug-in 'pkg.module:func_or_class' (slime's flag): decides the "
                        "requests of a rollout and returns traces (trainer/rollout/samples/generate.py; "
                        "recipes: recipes.rc:ReasoningCache, recipes.apr:APRSubcalls)")
    g.add_argument("--custom-generate-args", nargs="*", default=None, metavar="KEY=VALUE",
                   help="options of a plug-in class (values parsed as JSON when they parse)")
    g.add_argument("--max-staleness", type=int, default=None,
                   help="asynchronous rollouts (AReaL's max_head_offpolicyness): the next rollouts "
                        "are generated while the current one trains, each sample at most N weight "
                        "versions behind the weights it trains; 0 equals the synchronous run "
                        "(default: synchronous)")
    g.add_argument("--partial-rollout", action="store_true",
                   help="slime's partial rollouts (with --max-staleness): a weight push interrupts "
                        "the requests in flight, which keep their tokens and continue under the "
                        "new weights (each token keeps its behaviour log-prob and version)")
    g.add_argument("--offload-rollout", action=argparse.BooleanOptionalAction, default=None,
                   help="release the colocated engine's KV memory while training (default: on "
                        "with a GPU)")


def _add_eval_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollout: evaluation")
    g.add_argument("--eval-prompt-data", nargs="*", default=None,
                   help="name path pairs: 'aime24 data/aime24.jsonl math500 data/math500.jsonl'")
    g.add_argument("--eval-interval", type=int, default=None, help="evaluate every N rollouts")
    g.add_argument("--eval-before-train", action="store_true",
                   help="also evaluate the starting policy (logged as step 0), as verl's val_before_train")
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-max-response-len", type=int, default=None)
    g.add_argument("--eval-temperature", type=float, nargs="+", default=[0.0],
                   help="one evaluation pass per value, e.g. '0 1': greedy (one sample per prompt) "
                        "and T = 1 with --n-samples-per-eval-prompt samples (pass@n); passes after "
                        "the first are logged as eval/<name>_t<T>/*")
    g.add_argument("--eval-top-p", type=float, default=1.0)
    g.add_argument("--eval-compression", choices=["train", "dense", "both"], default="train",
                   help="KV of the evaluation samples: as the rollouts (the engines' --sglang-compress-*), "
                        "dense (sglang-kvc's per-request compress: false on the same engines), or both "
                        "(dense scores logged as eval/<name>_dense/*)")
    g.add_argument("--eval-input-key", default=DataConfig.eval_input_key)  # None: --input-key
    g.add_argument("--eval-label-key", default=DataConfig.eval_label_key)
