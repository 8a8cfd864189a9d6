"""The multi-turn flags (``--env-path`` and its companions), read into ``MultiTurnConfig``.
Each default is declared once: the plug-in's (``loop.MultiTurn``) or the config's, and the
flags read them from there."""

from __future__ import annotations

import argparse
import dataclasses

from .loop import MultiTurn


@dataclasses.dataclass
class MultiTurnConfig:
    env_path: str  # 'pkg.module:ClassOrFunction'
    env_args: list[str] | None = None  # key=value options of an environment class
    max_turns: int = MultiTurn.max_turns
    tool_parser: str = "qwen25"
    max_tokens_per_turn: int | None = MultiTurn.turn_tokens
    observation_role: str = MultiTurn.observation_role
    sessions: bool = MultiTurn.use_sessions

    def plugin(self):
        """The generate plug-in that runs the episodes (``loop.MultiTurn``)."""
        from ..samples.generate import parse_options
        from .environment import load_environment
        from .parser import load_parser

        options = parse_options(self.env_args)
        step = load_environment(self.env_path, options, load_parser(self.tool_parser))
        return MultiTurn(step, self.max_turns, self.max_tokens_per_turn, self.observation_role,
                         self.sessions)


def multiturn_config_from_args(args: argparse.Namespace) -> MultiTurnConfig | None:
    if not getattr(args, "env_path", None):
        return None
    return MultiTurnConfig(args.env_path, args.env_args, args.max_turns, args.tool_parser,
                           args.max_tokens_per_turn, args.observation_role, args.engine_sessions)


def add_multiturn_args(p: argparse.ArgumentParser) -> None:
    d = MultiTurnConfig  # the defaults
    g = p.add_argument_group("rollout: multi-turn (tool use)")
    g.add_argument("--env-path", default=None,
                   help="multi-turn rollouts: the environment 'pkg.module:ClassOrFunction' that "
                        "answers each model turn with an observation or ends the episode with a "
                        "reward (docs/environments.md; example: recipes.tool_use:ArithToolEnv)")
    g.add_argument("--env-args", nargs="*", default=None, metavar="KEY=VALUE",
                   help="options of an environment class (values parsed as JSON when they parse)")
    g.add_argument("--max-turns", type=int, default=d.max_turns,
                   help=f"model turns per sample (default: {d.max_turns})")
    g.add_argument("--tool-parser", default=d.tool_parser,
                   help="how tool calls are read from a turn: qwen25 (<tool_call>{json}</tool_call>, "
                        "default) or 'pkg.module:func' (text -> list of ToolCall)")
    g.add_argument("--max-tokens-per-turn", type=int, default=d.max_tokens_per_turn,
                   help="new tokens per model turn (default: what --rollout-max-response-len, "
                        "which counts model and observation tokens together, has left)")
    g.add_argument("--observation-role", default=d.observation_role,
                   help="chat role of observations in the template (default: user, with the "
                        "environment's <tool_response> tags: Qwen2.5's rendering of tool output)")
    g.add_argument("--engine-sessions", action=argparse.BooleanOptionalAction, default=d.sessions,
                   help="continue each sample's KV across turns when the engines offer sessions "
                        "(default); --no-engine-sessions re-prefills the whole context every turn")


def check_multiturn_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not getattr(args, "env_path", None):
        return
    if args.custom_generate_function_path:
        parser.error("--env-path runs its own generate loop; drop --custom-generate-function-path")
    if args.max_turns < 1:
        parser.error("--max-turns must be >= 1")
    if args.max_tokens_per_turn is not None and args.max_tokens_per_turn < 1:
        parser.error("--max-tokens-per-turn must be >= 1")
    try:
        multiturn_config_from_args(args).plugin()
    except ValueError as e:
        parser.error(str(e))
