"""Command-line flags of ``python -m trainer.train``, slime's names where slime has them: each
package defines its flags beside the config that reads them (``learner/flags.py``,
``launch.py``, ``rollout/config.py``, ``algorithms/argparse_flags.py``, ``tracking/logger.py``); this
module builds the parser from them and checks the combinations (:func:`check_args`).
None of them imports torch, Megatron or transformers: ``--help`` and a flag error take a second
or two, not the 10-25 s those imports take (``tests/trainer/test_entry_messages.py``).

A YAML file (``--config run.yaml``) may hold the same keys (dashes or underscores); flags given
on the command line win. Rollout-server flags take the ``--sglang-`` prefix
(``--sglang-compress-algorithm rkv``) and are validated by the server's own rules. Unknown or
inconsistent flags stop the run at once with a message naming them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .algorithms.argparse_flags import add_algorithm_args
from .startup.flag_checks import check_trainer_values
from .launch import add_launch_args
from .learner.flags import add_learner_args
from .rollout.config import add_rollout_args
from .rollout.engines.config import check_engine_args
from .tracking import add_logging_args


def build_parser(prog: str = "python -m trainer.train") -> argparse.ArgumentParser:
    from sglang_kvc import OneLineParser  # one-line errors, no abbreviations

    p = OneLineParser(prog=prog,
                      description="GRPO with sparse (KV-compressed) rollouts.")
    p.add_argument("--config", default=None, help="YAML file with any of these flags as keys")
    # each package's flags beside the config that reads them; --help shows them by package
    # (the learner's first: --hf-checkpoint is the first required flag, as it always was)
    for add in (add_learner_args, add_launch_args, add_rollout_args, add_algorithm_args,
                add_logging_args):
        add(p)
    return p


def _yaml_defaults(parser: argparse.ArgumentParser, path: str) -> None:
    import yaml

    file = Path(path)
    if not file.is_file():
        parser.error(f"--config {path}: file not found")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as e:
        parser.error(f"--config {path}: not valid YAML ({e})")
    if not isinstance(data, dict):
        parser.error(f"--config {path}: expected a mapping of flag names to values")
    known = {a.dest for a in parser._actions}
    values = {}
    for key, value in data.items():
        dest = str(key).lstrip("-").replace("-", "_")
        if dest not in known:
            parser.error(f"--config {path}: unknown key {key!r}")
        values[dest] = value
    parser.set_defaults(**values)
    for action in parser._actions:  # a key in the file satisfies a required flag
        if action.dest in values:
            action.required = False


def _check_data_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A missing data file fails now, not after the model and the engine are up."""
    from .rollout.samples.data import parse_data_spec

    specs = [("--prompt-data", args.prompt_data)]
    specs += [("--eval-prompt-data", s) for s in (args.eval_prompt_data or [])[1::2]]
    for flag, spec in specs:
        path, _ = parse_data_spec(spec)
        if not path.is_file():
            parser.error(f"{flag} {path}: file not found")


def _warn_replay_without_compression(args: argparse.Namespace) -> None:
    """Eviction replay with a dense engine replays nothing: it is the dense recompute."""
    if not (args.sparse_recompute or args.train_sparse_policy) or args.rollout_server_urls:
        return
    algo = (getattr(args, "sglang_compress_algorithm", None) or "none").strip().lower()
    if algo == "none":
        flag = "--train-sparse-policy" if args.train_sparse_policy else "--sparse-recompute"
        _warn(f"{flag} without --sglang-compress-algorithm: the engine evicts nothing, so the "
              f"replay is the dense recompute")


def _warn(message: str) -> None:
    """A flag that has no effect in its combination: one line at start-up, the run goes on."""
    print(f"python -m trainer.train: warning: {message}", file=sys.stderr)


def _check_dynamic_sampling(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from .rollout.dynamic_sampling import DynamicSamplingConfig

    if args.over_sampling_batch_size is not None and args.over_sampling_batch_size < 1:
        parser.error("--over-sampling-batch-size must be >= 1")
    if args.over_sampling_batch_size and not args.dynamic_sampling_filter_path:
        parser.error("--over-sampling-batch-size needs --dynamic-sampling-filter-path")
    if args.dynamic_sampling_filter_path:
        try:  # a bad path fails now, naming the flag
            DynamicSamplingConfig(args.dynamic_sampling_filter_path).load_filter()
        except ValueError as e:
            parser.error(str(e))


def parse_args(argv=None, prog: str = "python -m trainer.train") -> argparse.Namespace:
    """The flags, checked; errors name ``prog`` (the command the user typed)."""
    parser = build_parser(prog)
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            parser.error("--config needs a path")
        _yaml_defaults(parser, argv[i + 1])
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Inconsistent combinations fail now, not after the first rollout."""
    from .learner.checkpoint_policy import check_checkpoint_args
    from .learner.flags import check_sparse_replay_args, global_batch_size
    from .rollout.samples.fidelity import check_fidelity_args
    from .rollout.multiturn.flags import check_multiturn_args

    check_sparse_replay_args(parser, args)
    check_checkpoint_args(parser, args)
    check_fidelity_args(parser, args)
    check_multiturn_args(parser, args)
    if args.save_debug_rollout_data:
        try:
            args.save_debug_rollout_data.format(rollout_id=0)
        except (KeyError, IndexError, ValueError) as e:
            parser.error(f"--save-debug-rollout-data {args.save_debug_rollout_data!r}: only "
                         f"'{{rollout_id}}' may be substituted ({type(e).__name__}: {e})")
    if args.rendezvous_timeout <= 0 or args.distributed_timeout_minutes <= 0:
        parser.error("--rendezvous-timeout and --distributed-timeout-minutes must be > 0")
    check_trainer_values(parser, args)  # every numeric flag's range (trainer/startup/flag_checks.py)
    samples = args.rollout_batch_size * args.n_samples_per_prompt
    step = global_batch_size(args)
    if step < 1 or samples % step:
        parser.error(f"--global-batch-size {step} must divide "
                     f"--rollout-batch-size x --n-samples-per-prompt = {samples}")
    if not Path(args.hf_checkpoint, "config.json").is_file():
        parser.error(f"--hf-checkpoint {args.hf_checkpoint}: no config.json there")
    _check_data_paths(parser, args)
    # The engine reports log_softmax(logits / T) over the whole vocabulary, before truncation,
    # and the trainer replays only T: truncated sampling would make every importance ratio wrong.
    if args.rollout_top_p < 1.0 or args.rollout_top_k > 0:
        parser.error(f"--rollout-top-p {args.rollout_top_p} / --rollout-top-k {args.rollout_top_k}: "
                     "truncated sampling is not supported for training rollouts (the behaviour "
                     "log-probs and the trainer's recompute are over the full vocabulary); use "
                     "--rollout-top-p 1.0 --rollout-top-k -1 (eval may truncate: --eval-top-p)")
    if not 0 <= args.overlong_buffer_len < args.rollout_max_response_len:
        parser.error(f"--overlong-buffer-len {args.overlong_buffer_len} must be in "
                     f"[0, --rollout-max-response-len {args.rollout_max_response_len})")
    _check_dynamic_sampling(parser, args)
    if args.max_staleness is not None and args.max_staleness < 0:
        parser.error("--max-staleness must be >= 0")
    if args.partial_rollout and args.max_staleness is None:
        parser.error("--partial-rollout needs --max-staleness (asynchronous rollouts)")
    if args.partial_rollout and args.max_staleness == 0:
        _warn("--partial-rollout with --max-staleness 0 interrupts nothing: no rollout is in "
              "flight at a weight push (use --max-staleness >= 1 for partial rollouts)")
    _warn_replay_without_compression(args)
    if args.partial_rollout and (args.sparse_recompute or args.train_sparse_policy):
        parser.error("--partial-rollout with --sparse-recompute / --train-sparse-policy is not "
                     "supported: a resumed request starts a new eviction record, so no record "
                     "describes the whole sample")
    if args.overlong_penalty_factor < 0:
        parser.error("--overlong-penalty-factor must be >= 0")
    if args.rollout_temperature <= 0:
        parser.error("--rollout-temperature must be > 0 (the trainer divides logits by it)")
    if args.custom_generate_args and not args.custom_generate_function_path:
        parser.error("--custom-generate-args needs --custom-generate-function-path")
    if args.eval_prompt_data and len(args.eval_prompt_data) % 2:
        parser.error("--eval-prompt-data takes name path pairs")
    check_engine_args(parser, args)
