"""A client that gives up on a long generation leaves one log line and no asyncio error: the
waiting gather is settled, so nothing reports `_GatheringFuture exception was never retrieved`
when it is collected (mutation: drop `_settle` in http_io.results_or_abort and this fails)."""

from __future__ import annotations

import gc
import logging
import time

import pytest
import requests


@pytest.fixture(scope="module")
def srv(serve):
    return serve("qwen2.5")


def _idle(engine, timeout=30.0):
    deadline = time.time() + timeout
    while engine.get_server_info()["num_running_reqs"] and time.time() < deadline:
        time.sleep(0.05)


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2,
                              "ignore_eos": True}),
    ("/generate", {"text": "hi", "sampling_params": {"n": 2, "max_new_tokens": 100000,
                                                     "ignore_eos": True}}),
])
def test_client_timeout_leaves_no_asyncio_error(srv, caplog, path, body):
    caplog.set_level(logging.INFO)
    with pytest.raises(requests.Timeout):
        requests.post(srv.url + path, json=body, timeout=1.5)
    _idle(srv.engine)
    time.sleep(0.3)  # the handler notices the disconnect and returns
    gc.collect()
    time.sleep(0.1)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert any("left" in r.getMessage() and path in r.getMessage() for r in caplog.records)
    assert srv.engine.get_server_info()["num_running_reqs"] == 0  # its samples were aborted
