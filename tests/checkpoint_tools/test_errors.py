"""Bad inputs fail with a message naming the file and the problem, never a traceback."""

import json
import shutil

import pytest

from checkpoint_tools import hf2megatron, megatron2hf
from checkpoint_tools.hf2megatron import convert_hf_to_torch_dist
from checkpoint_tools.megatron2hf import convert_torch_dist_to_hf
from checkpoint_tools.model_config import CheckpointError


@pytest.fixture
def hf_copy(tiny_model_factory, tmp_path):
    dst = tmp_path / "hf-model"
    shutil.copytree(tiny_model_factory("qwen2.5"), dst)
    return dst


def _edit_config(hf_dir, **changes):
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg.update(changes)
    (hf_dir / "config.json").write_text(json.dumps(cfg))


def test_missing_config_json(hf_copy, tmp_path, capsys):
    (hf_copy / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: missing"):
        convert_hf_to_torch_dist(hf_copy, tmp_path / "out")
    rc = hf2megatron.main(["--hf-checkpoint", str(hf_copy), "--save", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "config.json" in err and "Traceback" not in err


@pytest.mark.parametrize("model_type", ["gpt2", "mistral", None])
def test_unsupported_architecture(hf_copy, tmp_path, model_type):
    _edit_config(hf_copy, model_type=model_type)
    with pytest.raises(CheckpointError, match="unsupported architecture"):
        convert_hf_to_torch_dist(hf_copy, tmp_path / "out")


@pytest.mark.parametrize("change,tensor", [
    ({"intermediate_size": 96}, "gate_proj"),
    ({"num_key_value_heads": 4}, "k_proj"),
    ({"num_hidden_layers": 3}, "model.layers.2"),
])
def test_shapes_disagreeing_with_config(hf_copy, tmp_path, change, tensor):
    _edit_config(hf_copy, **change)
    with pytest.raises(CheckpointError, match=tensor):
        convert_hf_to_torch_dist(hf_copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_half_written_checkpoint_is_refused(hf_copy, tmp_path, capsys):
    ckpt = convert_hf_to_torch_dist(hf_copy, tmp_path / "mcore")
    (ckpt / "metadata.json").unlink()  # what an interrupted save leaves behind
    with pytest.raises(CheckpointError, match="no metadata.json.*incomplete"):
        convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf")
    rc = megatron2hf.main(["--load", str(ckpt), "--output-dir", str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert rc == 2 and "metadata.json" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists()  # refused before anything was written


def test_not_a_checkpoint_and_dangling_tracker(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="not a Megatron torch_dist checkpoint"):
        convert_torch_dist_to_hf(tmp_path / "empty", tmp_path / "hf")
    (tmp_path / "empty" / "latest_checkpointed_iteration.txt").write_text("12")
    with pytest.raises(CheckpointError, match="iter_0000012, which does not exist"):
        convert_torch_dist_to_hf(tmp_path / "empty", tmp_path / "hf")


def test_checkpoint_and_config_disagree(hf_copy, tiny_model_factory, tmp_path):
    convert_hf_to_torch_dist(hf_copy, tmp_path / "mcore")
    with pytest.raises(CheckpointError, match="wrong --origin-hf-dir|layers|missing"):
        convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf",
                                 origin_hf_dir=tiny_model_factory("qwen2-untied"))


def test_existing_outputs_are_not_overwritten_silently(hf_copy, tmp_path):
    convert_hf_to_torch_dist(hf_copy, tmp_path / "mcore")
    with pytest.raises(CheckpointError, match="--overwrite"):
        convert_hf_to_torch_dist(hf_copy, tmp_path / "mcore")
    convert_hf_to_torch_dist(hf_copy, tmp_path / "mcore", overwrite=True)
    convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf", progress=False)
    with pytest.raises(CheckpointError, match="--force"):
        convert_torch_dist_to_hf(tmp_path / "mcore", tmp_path / "hf")


def test_cli_flag_errors_name_the_flag(hf_copy, tmp_path, capsys):
    with pytest.raises(SystemExit):
        hf2megatron.main(["--hf-checkpoint", str(hf_copy), "--save", str(tmp_path),
                          "--iteration", "abc"])
    assert "--iteration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        megatron2hf.main(["--load", str(tmp_path), "--output-dir", str(tmp_path / "o"),
                          "--vocab-size", "0"])
    assert "--vocab-size" in capsys.readouterr().err
