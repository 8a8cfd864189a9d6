"""python -m sglang_kvc.launch_server --model-path DIR [--host H --port P ...]

Bad flags and a model path that is not a local checkpoint fail in one line before anything is
loaded. SIGTERM / Ctrl-C abort every request first (handlers answer at once, new requests get
503), so the server exits within seconds even under load.
"""

from __future__ import annotations

import logging
import sys
import threading


def _parse(argv: list[str] | None):
    from .server_args import OneLineParser, ServerArgs, check_model_dir

    parser = OneLineParser(
        prog="python -m sglang_kvc.launch_server",
        description="SGLang-compatible rollout server on a paged KV engine.")
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    try:
        args = ServerArgs.from_cli_args(ns)
    except ValueError as e:
        parser.error(str(e))
    for path, flag in ((args.model_path, "--model-path"), (args.tokenizer_path, "--tokenizer-path")):
        problem = path and check_model_dir(path, flag)
        if problem and not (flag == "--tokenizer-path" and "config.json" in problem):
            parser.error(problem)
    if problem := check_device(args.device):
        parser.error(problem)
    return args


def check_device(device: str) -> str | None:
    """Why `--device` cannot be used here, or None."""
    if device in ("auto", "cpu"):
        return None
    if device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        return f"--device {device}: expected auto, cpu, cuda or cuda:N"
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device[5:]) if ":" in device else 0
    if index >= count:
        return f"--device {device}: this machine has {count} CUDA device(s); try --device cpu"
    return None


def _server(app, args, engine):
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):  # runs in the signal handler: must not block
            if not self.should_exit:
                threading.Thread(target=engine.begin_shutdown, daemon=True).start()
            super().handle_exit(sig, frame)

    # The grace period is a backstop: aborted requests answer at once.
    return Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                 timeout_graceful_shutdown=5))


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from .engine.engine import Engine
    from .server.app import create_app

    try:
        engine = Engine(server_args=args)
    except (OSError, ValueError) as e:  # a checkpoint that is not what it says: one line
        msg = str(e).strip().splitlines()[0]  # a flag's own problem names the flag first
        where = "" if msg.startswith("--") else f"cannot load --model-path {args.model_path}: "
        sys.exit(f"python -m sglang_kvc.launch_server: error: {where}{msg}")
    try:
        _server(create_app(engine), args, engine).run()
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
