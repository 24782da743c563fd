"""Sharded data parallelism (``train.parallel = "fsdp"``, FSDP2 per decoder layer) of an hf
backbone: two CPU processes (gloo) take the steps one process takes on the global batch, the
sharded checkpoint (torch distributed checkpoint) resumes exactly with another number of
processes, and the run exports to a plain Hugging Face directory."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_config
from test_distributed import _quiet, _records, _torchrun, _write

from targetlm import builders
from targetlm.registry import ConfigError
from targetlm.training import Trainer

transformers = pytest.importorskip("transformers")


def test_fsdp_refuses_a_model_without_an_hf_backbone(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="train.parallel = 'fsdp' shards hf backbones"):
        Trainer(tiny_config(**{"train.parallel": '"fsdp"'}), tmp_path / "run")
    assert not tmp_path.joinpath("run").exists()
    assert not torch.distributed.is_initialized()


@pytest.mark.slow  # torchrun processes: about 40 s; CI runs the slow set
def test_two_sharded_processes_take_the_steps_of_one_and_resume_in_one(tmp_path):
    from test_hf import write_config, write_model

    from targetlm.cli import main
    from targetlm.runs import load_run

    model_dir = write_model(tmp_path / "llama", "llama")
    config = builders.load_config(
        write_config(tmp_path / "c.toml", model_dir),
        ["train.parallel=fsdp", "train.schedule=constant", "train.eval_every=3"],
    )
    one = Trainer(config, tmp_path / "one", log=_quiet).train()

    # steps 1-3 sharded over two processes (a validation and best.pt at step 3) ...
    two = tmp_path / "two"
    stopped = _torchrun(_write(config, tmp_path / "config.toml"), two, "--set", "train.max_steps=3")
    assert stopped.returncode == 0, stopped.stderr
    assert sorted(p.name for p in two.glob("*.dcp")) == ["last-step3.dcp"]
    assert "model" not in torch.load(two / "last.pt", weights_only=True)
    # ... then steps 4-6 in one process, from the sharded checkpoint of two
    resumed = Trainer(config, two, resume=True, log=_quiet).train()

    single, double = _records(tmp_path / "one", "train"), _records(two, "train")
    assert [r["step"] for r in double] == [r["step"] for r in single] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in double] == pytest.approx([r["loss"] for r in single], abs=1e-5)
    valid = [r["ppl"] for r in _records(two, "valid")]
    assert valid == pytest.approx([r["ppl"] for r in _records(tmp_path / "one", "valid")], rel=1e-5)
    assert resumed["test"]["ppl"] == pytest.approx(one["test"]["ppl"], rel=1e-5)
    assert sorted(p.name for p in two.glob("*.dcp")) == ["last-step6.dcp"]

    # best.pt holds the whole model: the run exports to a plain Hugging Face directory
    exported = tmp_path / "exported"
    assert main(["export", str(two), "--output", str(exported)]) == 0
    _, _, model, _ = load_run(two)
    plain = transformers.AutoModelForCausalLM.from_pretrained(exported)
    ids = torch.tensor([[5, 17, 42, 9, 100, 3]])
    with torch.no_grad():
        ours = model.logits(model(ids, run_heads=False).main)
        assert torch.allclose(plain(ids).logits, ours, atol=1e-5)
    assert json.loads((two / "results.json").read_text())["steps"] == 6


@pytest.mark.slow  # torchrun processes: about 40 s; CI runs the slow set
def test_a_sharded_checkpoint_of_the_heads_only_warm_up_resumes(tmp_path):
    """During train.heads_only_steps only the heads have optimiser state: a checkpoint taken
    then resumes (it once failed: "Missing key in checkpoint state_dict: optimizer.state...")
    and the resumed run takes the steps of an uninterrupted one."""
    from test_hf import write_config, write_model

    model_dir = write_model(tmp_path / "llama", "llama")
    config = builders.load_config(
        write_config(tmp_path / "c.toml", model_dir),
        ["train.parallel=fsdp", "train.schedule=constant", "train.heads_only_steps=3"],
    )
    one = Trainer(config.replace(["train.max_steps=4"]), tmp_path / "one", log=_quiet).train()
    two = tmp_path / "two"
    path = _write(config, tmp_path / "config.toml")
    stopped = _torchrun(path, two, "--set", "train.max_steps=2")  # inside the warm-up
    assert stopped.returncode == 0, stopped.stderr
    resumed = _torchrun(path, two, "--resume", "--set", "train.max_steps=4")
    assert resumed.returncode == 0, resumed.stderr
    single, double = _records(tmp_path / "one", "train"), _records(two, "train")
    assert [r["step"] for r in double] == [r["step"] for r in single] == [1, 2, 3, 4]
    assert [r["loss"] for r in double] == pytest.approx([r["loss"] for r in single], abs=1e-5)
    assert json.loads((two / "results.json").read_text())["steps"] == one["steps"] == 4
