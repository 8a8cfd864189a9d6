"""python -m sglang_kvc.launch_server --model-path DIR [--host H --port P ...]"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> None:
    from .server_args import ServerArgs

    parser = argparse.ArgumentParser(
        prog="python -m sglang_kvc.launch_server",
        description="SGLang-compatible rollout server on a paged KV engine.")
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(argv)
    try:
        args = ServerArgs.from_cli_args(ns)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    import uvicorn

    from .engine.engine import Engine
    from .server.app import create_app

    engine = Engine(server_args=args)
    try:
        uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
