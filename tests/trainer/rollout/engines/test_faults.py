"""Engine failures during a rollout: requests of a killed server go to the others, the server is
restarted, and the rollout equals a fault-free one sample for sample (seeded sampling: a sample's
tokens depend only on its seed, whichever engine runs it)."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from trainer.rollout.engines.interface import RolloutConfig
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.samples.data import Prompt
from trainer.rollout.engines.failover import AllEnginesDown, EngineSet
from trainer.rollout.engines.config import EngineConfig
from trainer.rollout.engines.factory import engines_for
from trainer.rollout.engines.fleet import EngineFleet, FleetConfig
from trainer.rollout.manager import RolloutManager
from trainer.rollout.samples.rewards import RewardConfig
from trainer.rollout.engines.sharding import Placement

SERVER = ["--device", "cpu", "--max-total-tokens", "8192", "--log-level", "warning"]
PROMPTS = [[1 + i, 5, 7, 9] for i in range(8)]
N = 2
# 300 tokens: a few hundred ms per request, so a kill lands while requests are in flight; two
# samples per batched request, so each engine gets 4 requests (a failed one is re-issued whole)
CFG = RolloutConfig(max_response_len=300, temperature=1.0, seed=1234, concurrency=1,
                    samples_per_request=2)


@pytest.fixture(scope="module")
def fleet(tiny_model_factory, tmp_path_factory):
    cfg = FleetConfig(str(tiny_model_factory("qwen2.5")), 2, SERVER, start_timeout=120,
                      log_dir=str(tmp_path_factory.mktemp("fleet")))
    with EngineFleet(cfg) as f:
        yield f


@pytest.fixture(scope="module")
def reference(fleet):
    """The fault-free rollout, with every sample on the other engine than in the runs below."""
    return HTTPRollout(fleet.urls[::-1]).generate(PROMPTS, N, CFG)


def _kill_after(rollout: HTTPRollout, finished: int, pids) -> list:
    """Make ``rollout`` SIGKILL ``pids()`` once ``finished`` requests have come back."""
    done, send = [], rollout._send

    def counting_send(url, payload):
        out = send(url, payload)
        done.append(url)
        if len(done) == finished:
            for pid in pids():
                os.kill(pid, signal.SIGKILL)
        return out

    rollout._send = counting_send
    return done


def test_killed_engine_requests_reissued_and_engine_restarted(fleet, reference):
    # as the run builds them (assembly.py): the factory's engines for the servers
    place, cfg = Placement(1, 0), EngineConfig(fleet.cfg.model_path, {}, server_urls=fleet.urls)
    rollout = engines_for(cfg, place, "cpu")
    rollout.on_engine_failure = fleet.restart
    manager = RolloutManager(place, RewardConfig(rm_type="arithmetic"), rollout)
    victim = fleet.engines[0]
    old_pid = victim.proc.pid
    _kill_after(rollout, 3, lambda: [victim.proc.pid])
    result = manager.run([Prompt("p", ids, "1", {}) for ids in PROMPTS], N, CFG)
    manager.close()

    # every sample once, in its place, equal to the fault-free run (re-issued ones included)
    gens = result.gens
    assert len(gens) == len(PROMPTS) * N
    assert [g.response_ids for g in gens] == [g.response_ids for g in reference]
    for g, ref in zip(gens, reference):
        assert g.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
    stats = result.stats()
    assert stats["rollout/engine_failures"] == 1 and stats["rollout/requests_reissued"] >= 1
    assert rollout.wait_for_restarts(timeout=120)
    # the restart may finish after the rollout: then it counts in the next one
    assert stats["rollout/engine_restarts"] + rollout.fault_metrics()["rollout/engine_restarts"] == 1

    # a new process serves again, in the slot of the dead one
    assert victim.proc.pid != old_pid and victim.proc.poll() is None
    assert rollout.urls == fleet.urls
    again = HTTPRollout([victim.url]).generate(PROMPTS[:1], N, CFG)
    assert [g.response_ids for g in again] == [g.response_ids for g in reference[:N]]


def test_all_engines_dead_fails_with_clear_error(fleet, reference):
    rollout = HTTPRollout(fleet.urls, on_engine_failure=lambda url: None)  # restarts fail
    _kill_after(rollout, 2, lambda: [e.proc.pid for e in fleet.engines])
    with pytest.raises(AllEnginesDown, match="all 2 rollout engine.s. are down"):
        rollout.generate(PROMPTS, N, CFG)
    assert rollout.fault_metrics()["rollout/engine_failures"] == 2
    for e in fleet.engines:
        e.proc.wait()
    with ThreadPoolExecutor(2) as pool:  # leave the fleet serving
        assert list(pool.map(fleet.restart, fleet.urls)) == fleet.urls


# --- the failover bookkeeping and retries, without engines ---------------------------------

def test_engine_set_picks_next_up_and_replaces_on_restart():
    restarted = threading.Event()
    engines = EngineSet(["http://a", "http://b", "http://c"],
                        on_failure=lambda url: (restarted.wait(5), "http://a2")[1])
    engines.failed(0, "http://a", "refused")
    engines.failed(0, "http://a", "refused")  # once per engine
    assert engines.pick(0) == (1, "http://b") and engines.live() == ["http://b", "http://c"]
    restarted.set()
    assert engines.wait_for_restarts(timeout=5)
    assert engines.pick(0) == (0, "http://a2")
    counts = engines.take_counts()
    assert (counts.engine_failures, counts.engine_restarts) == (1, 1)


def test_engine_set_gives_up_when_restarts_fail():
    engines = EngineSet(["http://a"], on_failure=lambda url: None, restart_wait=30)
    engines.failed(0, "http://a", "connection refused")
    with pytest.raises(AllEnginesDown, match="http://a: connection refused"):
        engines.pick(0)  # returns as soon as the restart has given up, not after 30 s


class _Flaky(http.server.BaseHTTPRequestHandler):
    """/generate answers 503 to its first request, then a one-token sample; /health is up."""

    failures_left = 1

    def do_GET(self):  # /health
        self.send_response(200)
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        fail = type(self).failures_left > 0
        type(self).failures_left -= 1
        body = b"busy" if fail else json.dumps({"text": "x", "meta_info": {
            "output_token_logprobs": [[-0.5, 7, None]], "finish_reason": {"type": "length"}}}).encode()
        self.send_response(503 if fail else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_server_error_on_a_live_engine_is_retried_not_counted_as_failure():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rollout = HTTPRollout([url])
        gens = rollout.generate([[1, 2]], 1, RolloutConfig(concurrency=1))
        assert gens[0].response_ids == [7]
        faults = rollout.fault_metrics()
        assert faults["rollout/requests_reissued"] == 1 and faults["rollout/engine_failures"] == 0
        with pytest.raises(RuntimeError, match="failed after 3 attempts"):
            _Flaky.failures_left = 10
            HTTPRollout([url]).generate([[1, 2]], 1, RolloutConfig(concurrency=1, retries=1))
    finally:
        server.shutdown()


def test_bad_request_is_not_retried(fleet):
    with pytest.raises(RuntimeError, match="HTTP 400"):
        HTTPRollout(fleet.urls).generate([[10**6]], 1, RolloutConfig(max_response_len=4))
    assert requests.get(fleet.urls[0] + "/health", timeout=5).status_code == 200


# --- the fleet's own failures ----------------------------------------------------------------

def test_engine_that_cannot_start_is_reported_with_its_log(tmp_path):
    cfg = FleetConfig(str(tmp_path / "no-model"), 1, SERVER, start_timeout=120,
                      log_dir=str(tmp_path))
    fleet = EngineFleet(cfg)
    with pytest.raises(RuntimeError, match="exited with code") as err:
        fleet.start()
    assert "engine0.log" in str(err.value) and "no-model" in str(err.value)


def test_engine_not_healthy_in_time_is_stopped(tiny_model_factory, tmp_path):
    cfg = FleetConfig(str(tiny_model_factory("qwen2.5")), 1, SERVER, start_timeout=0.5,
                      log_dir=str(tmp_path))
    fleet = EngineFleet(cfg)
    with pytest.raises(TimeoutError, match="did not answer /health within 0.5 s"):
        fleet.start()
    assert fleet.engines[0].proc.poll() is not None  # no server left behind


ORPHAN_CHECK = """
import os, signal, sys
from trainer.rollout.engines.config import EngineConfig
from trainer.rollout.engines.factory import engines_for
from trainer.rollout.engines.fleet import EngineFleet, FleetConfig
fleet = EngineFleet(FleetConfig(sys.argv[1], 1, {server}, start_timeout=120))
fleet.start()
print(fleet.engines[0].proc.pid, flush=True)
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)  # no atexit, no finally: only PR_SET_PDEATHSIG is left
"""  # a normal exit without stop(): atexit stops the engines


@pytest.mark.parametrize("how", ["exits", "killed"])
def test_no_engine_outlives_the_trainer(tiny_model_factory, how):
    script = ORPHAN_CHECK.format(server=SERVER)
    proc = subprocess.run([sys.executable, "-c", script, str(tiny_model_factory("qwen2.5")), how],
                          capture_output=True, text=True, timeout=180)
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid), f"engine {pid} outlived its trainer ({how})"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited (its parent is gone, init reaps it)
