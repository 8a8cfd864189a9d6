"""``--weight-sync auto`` with ``--rollout-server-urls``, settled once the servers say their GPU
(``sync_choice.py``): CUDA IPC first for a server on the trainer's own GPU (NCCL cannot pair two
ranks on one device), NCCL first for servers on other GPUs, the flags' order otherwise; and a
real sglang-kvc server process reporting its GPU (None on a CPU) through ``HTTPRollout``."""

from __future__ import annotations

import http.server
import json
import threading
from argparse import Namespace

import pytest
import torch

import trainer.rollout.engines.config as config
from trainer.rollout.engines.inprocess import EngineRollout
from trainer.rollout.engines.interface import Engines, NoEngines
from trainer.rollout.engines.servers import HTTPRollout
from trainer.rollout.engines.sync_choice import describe, settle, settle_for_servers

HERE = "http://127.0.0.1:30000"


def from_flags(monkeypatch, urls, mode="auto", master=None):
    """The flags' resolution on a GPU host (``config.weight_sync_config_from_args``)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    return config.weight_sync_config_from_args(Namespace(
        weight_sync=mode, rollout_server_urls=urls, rollout_engine_urls=None, rollout_num_gpus=0,
        rollout_engine_process=False, weight_sync_master_address=master,
        weight_sync_bucket_mb=512, weight_sync_timeout=120.0))


def order(choice):
    return (choice.sync.mode, *choice.sync.fallback)


def test_one_gpu_holding_trainer_and_server_gets_ipc_first(monkeypatch):
    ws = from_flags(monkeypatch, [HERE])
    choice = settle(ws, ["GPU-aaa"], "GPU-aaa")
    assert order(choice) == ("ipc", "disk")
    assert describe(choice).startswith("[weight sync] ipc then disk: server(s) [0] run on the trainer's own GPU")
    # two servers, one of them on the trainer's GPU: NCCL could not pair that one either
    assert order(settle(ws, ["GPU-bbb", "GPU-aaa"], "GPU-aaa")) == ("ipc", "disk")


def test_servers_on_other_gpus_keep_nccl_first(monkeypatch):
    ws = from_flags(monkeypatch, [HERE])
    assert order(settle(ws, ["GPU-bbb"], "GPU-aaa")) == ("distributed", "ipc", "disk")
    # a stock SGLang server does not say: the flags' order, and the line says so
    unknown = settle(ws, [None], "GPU-aaa")
    assert order(unknown) == ("distributed", "ipc", "disk") and "does not say" in unknown.why


def test_what_auto_did_not_pick_here_is_left_alone(monkeypatch):
    # an explicit --weight-sync distributed on the shared GPU: the user's choice (it fails there)
    explicit = from_flags(monkeypatch, [HERE], mode="distributed")
    assert order(settle(explicit, ["GPU-aaa"], "GPU-aaa")) == ("distributed",)
    # servers on another host: no IPC to fall back to, nothing to settle
    remote = from_flags(monkeypatch, ["http://gpu-node-7:30000"], master="10.0.0.5")
    assert order(settle(remote, ["GPU-aaa"], "GPU-aaa")) == ("distributed", "tensor")
    # a trainer without a GPU never shares one
    assert order(settle(from_flags(monkeypatch, [HERE]), ["GPU-aaa"], None))[0] == "distributed"


def test_settle_for_servers_asks_the_door_once(monkeypatch, capsys):
    """On rank 0 (no process group here): the door's GPUs against this trainer's, one line."""
    import trainer.rollout.engines.sync_choice as sync_choice

    class Door(Engines):
        asked = 0

        def gpu_uuids(self):
            Door.asked += 1
            return ["GPU-aaa"]

    ws = from_flags(monkeypatch, [HERE])
    monkeypatch.setattr(sync_choice, "trainer_gpu_uuid", lambda: "GPU-aaa")
    got = settle_for_servers(ws, Door())
    assert (got.mode, got.fallback, Door.asked) == ("ipc", ("disk",), 1)
    assert "[weight sync] ipc then disk" in capsys.readouterr().out
    # an explicit mode: no question asked
    settle_for_servers(from_flags(monkeypatch, [HERE], mode="disk"), Door())
    assert Door.asked == 1


class _Info(http.server.BaseHTTPRequestHandler):
    """``/get_server_info`` of a server that says its GPU (``gpu`` set) or not (stock SGLang)."""

    gpu: str | None = None

    def do_GET(self):
        info = {"context_length": 64, **({"gpu_uuid": self.gpu} if self.gpu else {})}
        body = json.dumps(info).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def info_servers():
    """Two servers: one on GPU-aaa, one that does not say."""
    handlers = [type("OnAaa", (_Info,), {"gpu": "GPU-aaa"}), _Info]
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), h) for h in handlers]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_every_door_kind_answers_gpu_uuids(info_servers):
    """Servers say theirs; a door without servers (in-process engine, none) has none."""
    assert HTTPRollout(info_servers).gpu_uuids() == ["GPU-aaa", None]
    assert EngineRollout(engine=None).gpu_uuids() == []
    assert NoEngines().gpu_uuids() == []


def test_a_door_without_servers_keeps_the_flags_order(monkeypatch, capsys):
    import trainer.rollout.engines.sync_choice as sync_choice

    ws = from_flags(monkeypatch, [HERE])
    monkeypatch.setattr(sync_choice, "trainer_gpu_uuid", lambda: "GPU-aaa")
    for door in (NoEngines(), EngineRollout(engine=None), None):
        got = settle_for_servers(ws, door)
        assert (got.mode, *got.fallback) == ("distributed", "ipc", "disk")
    assert capsys.readouterr().out.count("the servers run on other GPUs") == 3


def test_gpu_uuid_names_the_device_not_its_index():
    from sglang_kvc.engine.info import gpu_uuid

    assert gpu_uuid("cpu") is None and gpu_uuid(torch.device("cpu")) is None
    if torch.cuda.is_available():  # the same string the IPC handles carry (weights/transport.py)
        assert gpu_uuid("cuda:0") == str(torch.cuda.get_device_properties(0).uuid)


@pytest.mark.slow  # a server process on a CPU
def test_a_server_reports_its_gpu(tiny_model_factory, tmp_path):
    from trainer.rollout.engines.fleet import EngineFleet, FleetConfig

    flags = ["--device", "cpu", "--max-total-tokens", "2048", "--log-level", "warning"]
    cfg = FleetConfig(str(tiny_model_factory("qwen2.5")), 1, flags, start_timeout=180,
                      log_dir=str(tmp_path / "logs"))
    with EngineFleet(cfg) as fleet:
        assert HTTPRollout(fleet.urls).gpu_uuids() == [None]  # on a CPU: no GPU to share
