"""The one restart owner (``SlotRestarts``), as the fleet and the Ray supervisor use it: which
report starts a replacement, the bound, the re-sync before the URL is handed back, and a closed
group. ``replace`` is a stub that records its calls (the process/actor part is tested with real
engines in test_faults.py, test_weight_sync*.py and test_ray_job.py)."""

from __future__ import annotations

import threading
import time

from trainer.rollout.engines.fleet import EngineFleet, FleetConfig
from trainer.rollout.engines.restarts import SlotRestarts


def _group(max_restarts=2, slow=0.0):
    calls, said = [], []

    def replace(slot):
        calls.append(slot)
        time.sleep(slow)
        return f"http://e{slot}-{calls.count(slot)}/"

    return SlotRestarts(["http://e0", "http://e1/"], replace, max_restarts, say=said.append), calls, said


def test_each_death_replaced_once_then_left_down():
    group, calls, said = _group(max_restarts=2)
    assert group.restart("http://e1") == "http://e1-1"           # trailing slashes do not matter
    assert group.restart("http://e1/") == "http://e1-1"          # the same death reported again
    assert group.restart("http://e1-1") == "http://e1-2"
    assert group.restart("http://e1-2") is None                  # a third death: left down
    assert calls == [1, 1] and group.counts == [0, 2]
    assert said == ["rollout engine 1 died 3 times: left down"]
    assert group.restart("http://nowhere") is None and "nothing to restart" in said[-1]


def test_resync_runs_on_the_replacement_before_its_url_is_returned():
    group, _, _ = _group()
    synced = []
    url = group.restart("http://e0", resync=lambda u: synced.append((u, list(group.urls))))
    assert synced == [(url, [url, "http://e1"])]


def test_concurrent_reports_of_one_death_start_one_replacement():
    group, calls, _ = _group(slow=0.2)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(group.restart("http://e0")))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [0] and answers == ["http://e0-1"] * 4


def test_a_closed_group_restarts_nothing():
    group, calls, _ = _group()
    group.close()
    assert group.restart("http://e0") is None and calls == []


def test_the_fleet_takes_its_policy_from_slot_restarts(tmp_path):
    """EngineFleet.restart goes through SlotRestarts with the fleet's bound and its resync (no
    process is spawned: its replacement is stubbed)."""
    fleet = EngineFleet(FleetConfig("model", 2, [], max_restarts=1, log_dir=str(tmp_path)))
    try:
        fleet.restarts.replace = lambda slot: f"http://replaced{slot}"
        synced = []
        fleet.resync = synced.append
        assert fleet.restart(fleet.urls[1]) == "http://replaced1" and synced == ["http://replaced1"]
        assert fleet.restart("http://replaced1") is None  # max_restarts=1
    finally:
        fleet.stop()
    assert fleet.restart(fleet.urls[0]) is None  # stopped: nothing restarts
