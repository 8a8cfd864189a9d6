"""Sessions over several servers stay on one server (``engines/routing.py``): a session is
opened on the next server in turn, every request that continues it goes to that server (its KV
is there: elsewhere the history would be prefilled again, or the session unknown), and it is
closed there. Requests outside sessions go round-robin."""

from __future__ import annotations

import http.server
import itertools
import json
import threading

import pytest

from trainer.rollout.engines.interface import RolloutConfig, SampleRequest
from trainer.rollout.engines.servers import HTTPRollout


class _Sessions(http.server.BaseHTTPRequestHandler):
    """/open_session (ids name the server), /close_session, and a /generate answering one token
    per sample; every request is recorded as (port, path, body)."""

    seen: list = []
    ids = itertools.count()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        port = self.server.server_address[1]
        type(self).seen.append((port, self.path, body))
        if self.path == "/open_session":
            out = f"s{port}-{next(self.ids)}"
        elif self.path == "/close_session":
            out = None
        else:
            out = [{"text": "t", "meta_info": {"id": "r", "output_token_logprobs": [[-1.0, 5, None]],
                                               "finish_reason": {"type": "stop"}}}
                   for _ in body["input_ids"]]
        data = json.dumps(out).encode() if out is not None else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def two_servers():
    _Sessions.seen = []
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sessions) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers], \
        [s.server_address[1] for s in servers]
    for s in servers:
        s.shutdown()


def _request(session: str | None) -> SampleRequest:
    r = SampleRequest.of([1, 2, 3], RolloutConfig(), None)
    r.session_params = None if session is None else {"id": session, "rid": None}
    return r


def test_a_session_is_served_by_the_server_that_opened_it(two_servers):
    urls, ports = two_servers
    http = HTTPRollout(urls)
    assert http.has_sessions
    sessions = [http.open_session() for _ in range(4)]
    assert [s.split("-")[0] for s in sessions] == [f"s{p}" for p in ports * 2]  # in turn
    cfg = RolloutConfig()
    for s in sessions * 2:  # two turns each
        http.submit(_request(s), cfg).result()
    for s in sessions:
        http.close_session(s)
    for port, path, body in _Sessions.seen:
        if path == "/generate":
            assert body["session_params"][0]["id"].startswith(f"s{port}-")
        if path == "/close_session":
            assert body["session_id"].startswith(f"s{port}-")
    with pytest.raises(ValueError, match="not open"):
        http.close_session(sessions[0])
    http.close()


def test_requests_outside_sessions_go_round_robin(two_servers):
    urls, ports = two_servers
    http = HTTPRollout(urls)
    gens = [http.submit(_request(None), RolloutConfig()).result() for _ in range(4)]
    assert [g.response_ids for g in gens] == [[5]] * 4
    assert [port for port, path, _ in _Sessions.seen] == ports * 2
    http.close()


def test_batched_sessions_spread_over_the_servers_and_close_where_they_are(two_servers):
    """``open_sessions(n)`` (a rollout's episodes, opened concurrently): every server gets its
    share; ``close_sessions`` closes each on its own server, once, and skips an id no server
    holds (a restarted server's)."""
    urls, ports = two_servers
    http = HTTPRollout(urls)
    sessions = http.open_sessions(6)
    assert len(set(sessions)) == 6
    assert sorted(s.split("-")[0] for s in sessions) == sorted(f"s{p}" for p in ports * 3)
    http.close_sessions(sessions + ["gone"])
    closed = [(port, body["session_id"]) for port, path, body in _Sessions.seen
              if path == "/close_session"]
    assert sorted(s for _, s in closed) == sorted(sessions)
    assert all(s.startswith(f"s{port}-") for port, s in closed)
    assert http.open_sessions(0) == []
    http.close()
