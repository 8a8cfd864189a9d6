"""Where the engines run and how weights reach them: ``EngineConfig`` and ``WeightSyncConfig``,
read from the flags here (``--rollout-server-urls``, ``--rollout-engine-process``,
``--rollout-num-gpus``, ``--weight-sync*``, every ``--sglang-*`` field of sglang-kvc's
``ServerArgs``). ``factory.py`` turns them into this rank's ``Engines``."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

# Read without torch (the flags): the transports (transports.py, torch) are keyed by these names.
WEIGHT_SYNC_MODES = ("inprocess", "tensor", "ipc", "disk", "distributed")
# seconds a weight-update group's broadcast may wait for a member (sglang_kvc.weights.transport
# GROUP_TIMEOUT_S, the servers' default: sent to them only when it differs, so a stock SGLang
# server gets no field it does not know)
GROUP_TIMEOUT_S = 120.0
ENGINE_PREFIX = "sglang_"  # dest of ``--sglang-<field>``: one ServerArgs field
# Engine flags whose trainer default depends on the run: --env-path (multi-turn) runs batch the
# turns that arrive a few at a time into one prefill (each eager prefill step costs tens of ms of
# host: docs/engine.md); single-turn runs keep the engine's default.
MULTITURN_ENGINE_DEFAULTS = {"schedule_prefill_delay_steps": 16}
# Server flags that make no sense for an engine the trainer starts itself.
_SERVER_FLAGS_NOT_FORWARDED = {"model_path", "tokenizer_path", "host", "port", "log_level",
                               "served_model_name", "weight_version",
                               "api_key"}  # the trainer's own engines serve only it


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
    engine_process: bool = False  # --rollout-engine-process: each colocated engine a child process
    log_dir: Path = Path(".")  # engine processes log under engines/ here (--log-dir, else --save)

    @property
    def remote(self) -> bool:
        return bool(self.server_urls)

    def offloads(self) -> bool:
        import torch

        return self.offload if self.offload is not None else torch.cuda.is_available()

    def generates_beside_training(self) -> bool:
        """Whether these engines may generate while the trainer trains (``--max-staleness``)
        without taking memory the trainer sized itself by: servers, engine processes and
        ``--rollout-num-gpus`` keep their own; a colocated in-process engine does only if it keeps
        its KV pool through training (no offload)."""
        return self.remote or self.engine_process or bool(self.num_gpus) or not self.offloads()

    def weights_door(self, backend):
        """Where weight updates go: this rank's engines (``backend``: in-process, servers, or
        None), or the engines behind a router (``engine_urls``), since a router forwards
        generation only."""
        if not (self.remote and self.engine_urls) or backend is None:
            return backend
        from .servers import HTTPRollout

        return HTTPRollout(self.engine_urls)

    def server_args(self, device: str | None = None):
        """The colocated engine's ServerArgs; ``device`` (this rank's GPU) replaces ``auto``."""
        from sglang_kvc import ServerArgs

        values = dict(self.engine_flags)
        if device is not None and values.get("device", "auto") == "auto":
            values["device"] = device
        return ServerArgs(model_path=self.model_path, **values)


@dataclasses.dataclass
class WeightSyncConfig:
    mode: str  # a weight_sync.MODES transport (the flag's "auto" is resolved by then)
    bucket_bytes: int = 512 << 20
    master_address: str | None = None  # distributed: None means $MASTER_ADDR when the sync starts
    timeout_s: float = GROUP_TIMEOUT_S  # distributed: how long a broadcast may wait for a member
    # ``auto`` only: the modes tried in turn when the first push of ``mode`` fails (an explicit
    # --weight-sync fails instead)
    fallback: tuple[str, ...] = ()


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    flags = {k[len(ENGINE_PREFIX):]: v for k, v in vars(args).items()
             if k.startswith(ENGINE_PREFIX)}
    for name, multiturn in MULTITURN_ENGINE_DEFAULTS.items():
        if flags.get(name) is None:  # not given: the run's default
            flags[name] = multiturn if getattr(args, "env_path", None) else _engine_default(name)
    return EngineConfig(model_path=args.hf_checkpoint, engine_flags=flags,
                        server_urls=args.rollout_server_urls,
                        engine_urls=args.rollout_engine_urls, offload=args.offload_rollout,
                        per_gpu=args.rollout_engine_placement == "per-gpu",
                        num_gpus=args.rollout_num_gpus,
                        engine_process=args.rollout_engine_process,
                        log_dir=Path(args.log_dir or args.save or "."))


def weight_sync_config_from_args(args: argparse.Namespace) -> WeightSyncConfig:
    mode = weight_sync_mode(args)
    return WeightSyncConfig(mode=mode, bucket_bytes=args.weight_sync_bucket_mb << 20,
                            master_address=args.weight_sync_master_address,
                            timeout_s=args.weight_sync_timeout,
                            fallback=server_fallback(args) if mode == "distributed"
                            and args.weight_sync == "auto" and args.rollout_server_urls else ())


def weight_sync_mode(args: argparse.Namespace) -> str:
    """``--weight-sync``, with ``auto`` resolved by where the engines run: NCCL (GPU) or tensors
    for ``--rollout-num-gpus``, CUDA IPC (GPU) or tensors for ``--rollout-engine-process``,
    NCCL (GPU) for servers this trainer can reach a group with (``servers_can_join``), else
    tensors over HTTP; else the in-process engine's own path."""
    if args.weight_sync != "auto":
        return args.weight_sync
    if args.rollout_num_gpus:
        import torch

        return "distributed" if torch.cuda.is_available() else "tensor"
    if args.rollout_engine_process:
        from .processes import weight_transport

        return weight_transport()
    if not args.rollout_server_urls:
        return "inprocess"
    import torch

    return "distributed" if torch.cuda.is_available() and servers_can_join(args) else "tensor"


_LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url if "://" in url else "http://" + url).hostname or ""


def servers_local(args: argparse.Namespace) -> bool:
    """Every engine the weights go to is on this host (by its URL)."""
    import socket

    here = {*_LOOPBACK, socket.gethostname(), socket.getfqdn()}
    return all(_host(u) in here for u in args.rollout_engine_urls or args.rollout_server_urls)


def servers_can_join(args: argparse.Namespace) -> bool:
    """A weight-update group needs the servers to reach this rank's store: on this host, or at a
    master address that is not a loopback one (--weight-sync-master-address, else $MASTER_ADDR)."""
    import os

    address = args.weight_sync_master_address or os.environ.get("MASTER_ADDR", "127.0.0.1")
    return servers_local(args) or address not in _LOOPBACK


def server_fallback(args: argparse.Namespace) -> tuple[str, ...]:
    """``auto``'s ways after NCCL for servers, in turn: same host, CUDA IPC (a server on the
    trainer's own GPU, where NCCL cannot pair the two) then the disk; else tensors over HTTP."""
    return ("ipc", "disk") if servers_local(args) else ("tensor",)


def server_args_from(args: argparse.Namespace, device: str | None = None):
    """The colocated engine's ServerArgs from the flags (``--sglang-*``, ``--hf-checkpoint``)."""
    return engine_config_from_args(args).server_args(device)


def _engine_default(name: str):
    from sglang_kvc import ServerArgs

    return getattr(ServerArgs, name)  # a dataclass field's default is its class attribute


def add_engine_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register ``--sglang-<field>`` for every ServerArgs field a colocated engine takes."""
    from sglang_kvc import ServerArgs

    group = parser.add_argument_group("rollout: engine (--sglang-*, as sglang-kvc's flags)")
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
        return
    kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
    default, shown = f.default, f.default
    if f.name in MULTITURN_ENGINE_DEFAULTS:  # resolved in engine_config_from_args
        default, shown = None, f"{MULTITURN_ENGINE_DEFAULTS[f.name]} with --env-path, else {f.default}"
    group.add_argument(flag, dest=dest, type=kind, default=default,
                       help=f"{help_text} (default: {shown})", **meta)


def add_server_args(g) -> None:
    """Where rollouts run and how weights reach them."""
    g.add_argument("--rollout-server-urls", nargs="*", default=None,
                   help="SGLang-API servers (sglang-kvc or stock SGLang); default: an in-process "
                        "engine on every data-parallel rank, colocated with the trainer")
    g.add_argument("--rollout-engine-urls", nargs="*", default=None,
                   help="the engines behind a router given as --rollout-server-urls: weight "
                        "updates go to each of them, since a router forwards only generation "
                        "(default: the --rollout-server-urls themselves). Behind a router the "
                        "trainer cannot fail over between engines; python -m trainer.ray_job "
                        "gives it the engines themselves as --rollout-server-urls")
    g.add_argument("--rollout-engine-process", action="store_true",
                   help="run each rank's colocated engine as a child process (python -m "
                        "sglang_kvc.launch_server with the --sglang-* flags, on the rank's device) "
                        "talked to over HTTP, instead of in the trainer's process: with "
                        "--max-staleness, generation and training then overlap without sharing "
                        "one Python interpreter; weights go by ipc on a GPU, tensor on a CPU")
    g.add_argument("--rollout-engine-placement", default="per-gpu", choices=["per-gpu", "per-replica"],
                   help="colocated engines: one on every GPU (default; at TP > 1 each holds the full "
                        "weights, and every GPU generates), or one per data-parallel replica on its "
                        "first tensor-parallel rank (less engine memory, fewer generating GPUs)")
    g.add_argument("--rollout-num-gpus", type=int, default=0,
                   help="disaggregated rollouts under torchrun (slime's flag): global rank 0 starts "
                        "this many engine processes (python -m sglang_kvc.launch_server, one GPU "
                        "each) on this node's GPUs after the trainer's (local GPU LOCAL_WORLD_SIZE "
                        "onwards); weights go over NCCL (--weight-sync distributed) on a GPU")
    g.add_argument("--rollout-concurrency", type=int, default=64,
                   help="in-flight HTTP requests per server")
    g.add_argument("--rollout-samples-per-request", type=int, default=256,
                   help="samples sent together as one batched HTTP /generate request (SGLang "
                        "takes lists of input_ids); 1 sends one request per sample. A request "
                        "that fails is re-issued whole, to another engine when it is down")
    g.add_argument("--weight-sync", default="auto",
                   choices=["auto", *WEIGHT_SYNC_MODES],
                   help="how weights reach the engine (auto: inprocess; for servers on a GPU "
                        "distributed (NCCL, as SGLang's update_weights_from_distributed) when they "
                        "can reach this trainer, then ipc and disk (same host) or tensor if the "
                        "first push fails; tensor over HTTP otherwise; ipc: handles to this "
                        "host's memory, for servers on the same machine)")
    g.add_argument("--weight-sync-bucket-mb", type=int, default=512)
    g.add_argument("--weight-sync-timeout", type=float, default=GROUP_TIMEOUT_S,
                   help="--weight-sync distributed: seconds a broadcast of the weight-update "
                        "group may wait for a member. An engine that dies in a push is found at "
                        "once (its request fails) and the push goes on without it; this bounds "
                        "what is left waiting (sglang-kvc servers get a value other than the "
                        "default in the group's request; default: 120)")
    g.add_argument("--weight-sync-master-address", default=None,
                   help="--weight-sync distributed: the address servers reach the trainer's rank 0 "
                        "at (default: $MASTER_ADDR, else 127.0.0.1); set it when servers run on "
                        "other nodes")


def check_engine_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The placements that really conflict (each engine is started one way; the in-process
    weight path needs the in-process engine), then the colocated engine's own flags by the
    server's rules."""
    for conflict, message in _conflicts(args):
        if conflict:
            parser.error(message)
    if not args.rollout_server_urls:
        try:
            server_args_from(args)
        except ValueError as e:  # the server's own validation names its flag without the prefix
            parser.error(re.sub(r"--(?!sglang-)", "--sglang-", str(e)))


def _conflicts(args: argparse.Namespace) -> list[tuple[bool, str]]:
    """(whether it applies, its message), in the order they are checked."""
    gpus, process, urls = args.rollout_num_gpus, args.rollout_engine_process, args.rollout_server_urls
    explicit = args.weight_sync
    # engine processes and servers resolve "auto" by asking torch for GPUs: no check below
    # depends on the answer (those that could are settled above for them), and a flag error
    # stays fast
    mode = explicit if gpus or process or urls else weight_sync_mode(args)
    return [
        (gpus < 0, "--rollout-num-gpus must be >= 0"),
        (gpus and (urls or args.rollout_engine_urls or process),
         "--rollout-num-gpus starts the engines itself; drop --rollout-server-urls / "
         "--rollout-engine-urls / --rollout-engine-process"),
        (gpus and explicit == "inprocess",
         "--weight-sync inprocess needs the in-process engine; with --rollout-num-gpus use "
         "distributed (GPU), tensor or disk"),
        (not gpus and process and (urls or args.rollout_engine_urls),
         "--rollout-engine-process starts the engines itself; drop --rollout-server-urls / "
         "--rollout-engine-urls"),
        (not gpus and process and explicit == "inprocess",
         "--weight-sync inprocess needs the in-process engine; with --rollout-engine-process use "
         "ipc (GPU), tensor or disk"),
        (mode == "inprocess" and urls,
         "--weight-sync inprocess needs the in-process engine; drop --rollout-server-urls or "
         "pick tensor/disk/distributed"),
        (args.rollout_engine_urls and not urls,
         "--rollout-engine-urls names the engines behind --rollout-server-urls; give "
         "--rollout-server-urls too"),
        (mode != "inprocess" and not (urls or gpus or process),
         f"--weight-sync {mode} needs --rollout-server-urls"),
    ]
