"""python -m sglang_kvc.launch_server --model-path DIR [--host H --port P --api-key KEY ...]

Bad flags, a model path that is not a local checkpoint and a port already taken fail in one line
before anything is loaded (the port is bound first and handed to uvicorn). SIGTERM / Ctrl-C abort
every request first (handlers answer at once, new requests get 503), so the server exits within
seconds even under load, with one line saying so and exit status 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading

PROG = "python -m sglang_kvc.launch_server"
log = logging.getLogger("sglang_kvc.server")


def _parse(argv: list[str] | None):
    from .server_args import OneLineParser, ServerArgs, check_model_dir

    parser = OneLineParser(
        prog=PROG,
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


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound as uvicorn would bind it; OSError names what is wrong."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart may reuse TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _bind_or_exit(args) -> socket.socket:
    try:
        return bind(args.host, args.port)
    except OSError as e:
        sys.exit(f"{PROG}: error: --host {args.host} --port {args.port}: cannot bind "
                 f"({e.strerror or e}); is another server running there? pick another --port")


def _warn_if_exposed(args) -> None:
    from .server.auth import is_loopback

    if not args.api_key and not is_loopback(args.host):
        log.warning("serving on %s without --api-key: anyone who can reach this address can "
                    "generate and replace the weights; pass --api-key KEY (clients send "
                    "'Authorization: Bearer KEY') or bind 127.0.0.1", args.host)


def _server(app, args, engine):
    import uvicorn

    class Server(uvicorn.Server):
        stop_signal: int | None = None

        def handle_exit(self, sig, frame):  # runs in the signal handler: must not block
            if not self.should_exit:
                self.stop_signal = sig
                for name in ("uvicorn.error", "uvicorn.access"):  # the one line is main's
                    logging.getLogger(name).setLevel(logging.WARNING)
                threading.Thread(target=engine.begin_shutdown, daemon=True).start()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's, without re-raising the signal afterwards (that printed a
            KeyboardInterrupt traceback): main exits with the signal's status itself."""
            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, handler in previous.items():
                    signal.signal(s, handler)

    # The grace period is a backstop: aborted requests answer at once.
    return Server(uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=5))


def _serve(args, engine, sock: socket.socket) -> int | None:
    """Serve until a signal; the signal's number, or None if uvicorn stopped by itself."""
    from .server.app import create_app

    server = _server(create_app(engine), args, engine)
    host = f"[{args.host}]" if ":" in args.host else args.host
    log.info("serving on http://%s:%d (Ctrl-C stops)", host, args.port)  # uvicorn's says no URL
    try:
        server.run(sockets=[sock])
    finally:
        engine.shutdown()
    return server.stop_signal


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sock = _bind_or_exit(args)
    _warn_if_exposed(args)

    from .engine.engine import Engine

    try:
        engine = Engine(server_args=args)
    except (OSError, ValueError) as e:  # a checkpoint that is not what it says: one line
        msg = str(e).strip().splitlines()[0]  # a flag's own problem names the flag first
        where = "" if msg.startswith("--") else f"cannot load --model-path {args.model_path}: "
        sys.exit(f"{PROG}: error: {where}{msg}")
    sig = _serve(args, engine, sock)
    if sig is not None:
        print(f"{PROG}: stopped by {signal.Signals(sig).name}: any request in flight was aborted "
              f"(its client got finish_reason abort); rerun the same command to serve again",
              file=sys.stderr, flush=True)
        sys.exit(128 + sig)


if __name__ == "__main__":
    main(sys.argv[1:])
