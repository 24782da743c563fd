"""``train.compile``: the compiled training step computes the eager step's function.

Each case trains a few steps twice from the same seed, eagerly and with ``train.compile =
"default"``, and compares every step's loss and the trained parameters: in the default run
with the "aot_eager" backend (torch.compile's capture of forward and backward, run with eager
kernels: what decides the function computed), in the slow run with inductor (its generated
C++ kernels on the CPU). Dropout is on in every case (the variational LSTM's masks, the
Transformer's): the compiled step draws its masks from torch's generator as the eager one
does, so the two agree to float rounding. SGD in every case (Adam turns a gradient that is 0
but for rounding, a key bias's, into a full step of either sign). Tolerance: 1e-4 relative on
the losses and 1e-4 absolute on the parameters after the steps (inductor fuses and reorders
float sums; the losses agree to about 1e-6).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_bit_identity import write_pairs

from targetlm import builders
from targetlm.registry import ConfigError
from targetlm.training import Trainer, train
from targetlm.training import compile as compiling

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="torch.compile on the CPU needs a C++ compiler (apt-get install g++)",
)

STEPS = 4
SYNTHETIC = {
    "name": "synthetic",
    "batch_size": 4,
    "bptt": 8,
    "synthetic": {"train_sentences": 60, "valid_sentences": 10, "test_sentences": 10},
}
TRAIN = {"progress": False, "threads": 1, "seed": 3, "max_steps": STEPS, "log_every": 1}


def case(name: str, tmp_path: Path) -> dict[str, Any]:
    if name == "lstm_variational_real":  # Inan et al.'s small model, in miniature
        return {
            "data": {**SYNTHETIC, "bptt": 5},  # (5 steps unrolled: seconds to capture)
            "model": {
                "embedding": {"kind": "lookup", "size": 16},
                "encoder": {
                    "kind": "lstm",
                    "hidden_size": 16,
                    "num_layers": 2,
                    "dropout_input": 0.3,
                    "dropout_hidden": 0.3,
                    "dropout_output": 0.3,
                    "dropout_recurrent": 0.3,
                    "tie_recurrent_mask": True,
                },
                "output": {"kind": "tied", "bias": False},
            },
            "objective": {"kind": "augmented", "tau": 2.0, "gamma": 0.5},
            "train": {
                **TRAIN,
                "optimizer": "sgd",
                "lr": 1.0,
                "clip": 5.0,
                "loss_reduction": "sum_over_time",
            },
        }
    if name == "transformer_wdr_al":
        return {
            "data": {**SYNTHETIC, "shuffle": True},
            "model": {
                "embedding": {"kind": "lookup", "size": 16},
                "encoder": {
                    "kind": "transformer",
                    "num_layers": 2,
                    "num_heads": 2,
                    "ff_size": 32,
                    "dropout": 0.3,
                    "max_context": 8,
                },
                "output": {"kind": "tied"},
                "heads": {"kind": "wdr", "n": 3},
            },
            "objective": {
                "kind": "augmented",
                "tau": 2.0,
                "ngram_alpha": 1.0,
                "label_smoothing": 0.1,
            },
            "train": {
                **TRAIN,
                "optimizer": "sgd",
                "lr": 0.5,
                "carry_state": False,
                "loss_impl": "full",
            },
        }
    if name == "translation":
        write_pairs(tmp_path / "pairs")
        return {
            "data": {
                "name": "text",
                "dir": str(tmp_path / "pairs"),
                "train": "train",
                "valid": "val",
                "test": "test",
                "source_lang": "src",
                "target_lang": "tgt",
                "tokenizer": "whitespace",
                "max_tokens": 40,
                "bptt": 8,
            },
            "model": {
                "embedding": {"kind": "lookup", "size": 16},
                "encoder": {
                    "kind": "transformer_seq2seq",
                    "encoder_layers": 1,
                    "decoder_layers": 1,
                    "num_heads": 2,
                    "ff_size": 16,
                    "dropout": 0.1,
                    "max_context": 16,
                },
                "output": {"kind": "tied", "bias": False},
                "heads": {"kind": "wdr", "n": 2},
            },
            "objective": {"kind": "cross_entropy", "label_smoothing": 0.1, "ngram_alpha": 0.5},
            "task": {"kind": "translation"},
            "train": {**TRAIN, "optimizer": "sgd", "lr": 0.5, "clip": 1.0},
            "eval": {"batch_size": 8, "beam": 1},
        }
    raise KeyError(name)


def run_steps(config_dict: dict[str, Any], mode: str, run_dir: Path):
    """The loss of each of the first STEPS training steps and the parameters after them."""
    data = {**config_dict, "train": {**config_dict["train"], "compile": mode}}
    trainer = Trainer(builders.config_from_dict(data), run_dir, log=lambda message: None)
    threads = torch.get_num_threads()
    try:
        trainer._setup()
        losses = []
        for index in range(STEPS):
            batch = trainer.batches[index % len(trainer.batches)]
            nll, count = trainer.train_step(batch, trainer._scheduled_lr())
            trainer.step += 1
            losses.append(float(nll) / int(count))
    finally:
        torch.set_num_threads(threads)
    parameters = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return losses, parameters, trainer


CASES = ["lstm_variational_real", "transformer_wdr_al", "translation"]


@pytest.mark.parametrize("name", CASES)
def test_captured_step_equals_the_eager_step(name, tmp_path, monkeypatch):
    """Forward and backward as torch.compile captures them (dynamo, AOTAutograd), run with
    eager kernels: seconds a case."""
    monkeypatch.setattr(compiling, "BACKEND", "aot_eager")
    check_compiled_equals_eager(name, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_compiled_step_equals_the_eager_step(name, tmp_path):
    """With inductor's generated kernels (a C++ compile: 15-45 s a case with a cold cache)."""
    check_compiled_equals_eager(name, tmp_path)


def check_compiled_equals_eager(name: str, tmp_path: Path) -> None:
    config_dict = case(name, tmp_path)
    eager_losses, eager_parameters, _ = run_steps(config_dict, "off", tmp_path / "eager")
    losses, parameters, trainer = run_steps(config_dict, "default", tmp_path / "compiled")
    assert trainer.compiled is not None and trainer.compiled_shape is not None  # it compiled
    assert losses == pytest.approx(eager_losses, rel=1e-4)
    assert len(set(eager_losses)) > 1  # the steps trained (different batches, moving weights)
    for key, value in eager_parameters.items():
        torch.testing.assert_close(parameters[key], value, rtol=0, atol=1e-4, msg=key)


def test_a_compiled_run_resumes_eagerly_and_the_reverse(tmp_path, monkeypatch):
    """The mode is not part of what a run is: a run started compiled resumes eagerly (and the
    reverse), continuing the same losses as an uninterrupted run to float rounding."""
    monkeypatch.setattr(compiling, "BACKEND", "aot_eager")
    config_dict = case("lstm_variational_real", tmp_path)
    config_dict["train"] = {**config_dict["train"], "max_steps": 6, "eval_every": 3}

    def losses(run: Path) -> list[float]:
        import json

        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [r["loss"] for r in records if r["kind"] == "train"]

    whole = builders.config_from_dict(config_dict)
    train(whole, tmp_path / "whole", log=lambda message: None)
    for first, second in (("default", "off"), ("off", "default")):
        run = tmp_path / f"{first}-{second}"
        data = {**config_dict, "train": {**config_dict["train"], "compile": first}}
        train(
            builders.config_from_dict(data).replace(["train.max_steps=3"]),
            run,
            log=lambda message: None,
        )
        data["train"]["compile"] = second
        messages: list[str] = []
        train(builders.config_from_dict(data), run, resume=True, log=messages.append)
        assert any(f"train.compile was '{first}', now '{second}'" in m for m in messages)
        assert losses(run) == pytest.approx(losses(tmp_path / "whole"), rel=1e-4)


def test_graphs_on_the_cpu_is_one_error_before_anything_is_written(tmp_path):
    config_dict = case("lstm_variational_real", tmp_path)
    config_dict["train"] = {**config_dict["train"], "compile": "graphs"}
    with pytest.raises(ConfigError, match="CUDA graphs, which need a GPU"):
        train(builders.config_from_dict(config_dict), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_clipping_rescales_a_gradient_shared_by_two_parameters_once():
    """A compiled backward may hand two parameters one gradient tensor (an LSTM layer's two
    biases get equal gradients); clipping must rescale it once, as it does separate copies."""
    from targetlm.training.optim import clip_gradients

    a, b, c = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    shared = torch.tensor([3.0, 4.0, 0.0])
    a.grad, b.grad, c.grad = shared, shared, torch.tensor([0.0, 0.0, 5.0])
    twins = [torch.nn.Parameter(torch.zeros(3)) for _ in range(3)]
    for twin, grad in zip(twins, (a.grad, b.grad, c.grad)):
        twin.grad = grad.clone()
    assert float(clip_gradients([a, b, c], 1.0)) == float(clip_gradients(twins, 1.0))
    torch.testing.assert_close(a.grad, twins[0].grad)
    torch.testing.assert_close(c.grad, twins[2].grad)


@pytest.mark.slow  # (the layout it guards against is inductor's: aot_eager cannot show it)
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_compiled_step_compiles_once_per_state_kind(backend, tmp_path, monkeypatch):
    """Two epochs of a carried-state LSTM compile two graphs: the epoch's first step (no
    state) and the rest; the state's layout, whichever step made it, recompiles nothing
    (inductor's state outputs are views whose strides differ from the eager step's)."""
    import torch._dynamo

    monkeypatch.setattr(compiling, "BACKEND", backend)
    config_dict = case("lstm_variational_real", tmp_path)
    config_dict["train"] = {
        **config_dict["train"],
        "max_steps": 0,
        "epochs": 2,
        "compile": "default",
    }
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    messages: list[str] = []
    train(builders.config_from_dict(config_dict), tmp_path / "run", log=messages.append)
    assert not [m for m in messages if m.startswith("warning")]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
