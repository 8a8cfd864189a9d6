"""A client that gives up on a long generation leaves one log line and no asyncio error: the
waiting gather is settled, so nothing reports `_GatheringFuture exception was never retrieved`
when it is collected (mutation: drop `_settle` in http_io.results_or_abort and this fails).
The engine is held once the samples run, so the client leaves mid-generation on any machine."""

from __future__ import annotations

import gc
import json
import logging

import pytest

from tests.sglang_kvc.hold import hold_when_running, num_requests, raw_post, wait_until


@pytest.fixture(scope="module")
def srv(serve):
    return serve("qwen2.5")


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2,
                              "ignore_eos": True}),
    ("/generate", {"text": "hi", "sampling_params": {"n": 2, "max_new_tokens": 100000,
                                                     "ignore_eos": True}}),
])
def test_client_leaving_leaves_no_asyncio_error(srv, caplog, path, body):
    caplog.set_level(logging.INFO)

    def left():
        return [r for r in caplog.records if "left" in r.getMessage() and path in r.getMessage()]

    with hold_when_running(srv.engine, n=2):
        s = raw_post(srv.url, path, json.dumps(body).encode())
        wait_until(lambda: srv.engine.get_server_info()["num_running_reqs"] == 2, what="running")
        s.close()
        wait_until(left, what="the 'left' log line")
        wait_until(lambda: num_requests(srv.engine) == 0, what="its samples aborted")
    gc.collect()  # the handler has returned: its gather is collected now, logging if unsettled
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert len(left()) == 1
