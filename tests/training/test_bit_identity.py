"""Recorded runs of every task, reproduced bit for bit on the CPU.

Each case trains a tiny run (one thread, fixed seeds) and compares, as exact float bits
(``float.hex``), every back-propagated loss, every logged training and validation figure, the
final results and a digest of the trained weights with the numbers recorded in
``tests/training/bit_identity.json``. A change to the trainer, the tasks, the objectives or the
evaluation that moves any number by one ulp fails here.

The bits depend on the CPU's kernels as well as on the code: torch and MKL choose their code
paths by what the CPU offers, and those paths' float results differ in the last bits. So the
numbers are recorded per kernel set (:func:`kernel_set`: torch's CPU capability, plus ``AMD``
on AMD's CPUs or ``AMX`` where the CPU has Intel's matrix extensions, on both of which MKL takes
other paths), each from the same code: the commit before the one-trainer redesign (70fce30).
``AVX512`` was recorded on the AVX-512 Xeon of the earlier sessions (without AMX, we infer: an AMX machine running the same
code does not reproduce its numbers); ``AVX512-AMX`` on an AVX-512 + AMX Xeon; ``AVX512-AMD``
on an AVX-512 AMD EPYC (which does not reproduce the Xeon's ``AVX512`` numbers), each by
running this file's ``--record`` with that commit's ``src`` on the path (the code of the
redesign reproduces all three). On a CPU of another kernel set the test is skipped and says so.
Record again (only for an intended change of the numbers, or to add this CPU's kernel set
from the commit before a change) with ``python tests/training/test_bit_identity.py --record``.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from targetlm import builders
from targetlm import config as config_lib
from targetlm.checkpoint import load as load_checkpoint
from targetlm.training import train

RECORD = Path(__file__).parent / "bit_identity.json"
# results.json keys that measure the machine, not the model
TIMINGS = {"wall_time_s", "sentences_per_s", "tok_s"}

WORDS = [
    "a",
    "dog",
    "cat",
    "man",
    "woman",
    "runs",
    "sits",
    "plays",
    "in",
    "the",
    "park",
    "on",
    "grass",
    "with",
    "ball",
    "red",
]


def write_pairs(directory: Path, pairs: int = 48) -> None:
    """A toy language pair (the target is the source reversed, in capitals)."""
    rng = random.Random(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", pairs), ("val", 6), ("test", 6)):
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))) for _ in range(n)]
        tgt = [" ".join(reversed(line.upper().split())) for line in src]
        (directory / f"{split}.src").write_text("\n".join(src) + "\n", encoding="utf-8")
        (directory / f"{split}.tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")


COMMON_TRAIN = {"progress": False, "log_every": 1, "threads": 1, "seed": 3}


def lm_config(objective: dict[str, Any], loss_impl: str) -> dict[str, Any]:
    return {
        "data": {
            "name": "synthetic",
            "batch_size": 4,
            "bptt": 8,
            "synthetic": {"train_sentences": 60, "valid_sentences": 10, "test_sentences": 10},
        },
        "model": {
            "embedding": {"kind": "lookup", "size": 16},
            "encoder": {"kind": "lstm", "hidden_size": 16, "num_layers": 1},
            "output": {"kind": "lookup"},
            "heads": {"kind": "wdr", "n": 3},
        },
        "objective": objective,
        "train": {
            **COMMON_TRAIN,
            "optimizer": "adam",
            "lr": 0.01,
            "epochs": 1,
            "max_steps": 24,
            "eval_every": 12,
            "clip": 1.0,
            "loss_impl": loss_impl,
        },
        "eval": {"batch_size": 2},
    }


def pairs_config(data_dir: Path, task: dict[str, Any], encoder: dict[str, Any]) -> dict[str, Any]:
    return {
        "data": {
            "name": "text",
            "dir": str(data_dir),
            "train": "train",
            "valid": "val",
            "test": "test",
            "source_lang": "src",
            "target_lang": "tgt",
            "tokenizer": "whitespace",
            "max_tokens": 40,
            "bptt": 8,
            "shuffle": True,
        },
        "model": {
            "embedding": {"kind": "lookup", "size": 16, "init_std": 0.25},
            "encoder": {
                "encoder_layers": 1,
                "decoder_layers": 1,
                "num_heads": 2,
                "ff_size": 16,
                "dropout": 0.1,
                "max_context": 16,
                **encoder,
            },
            "output": {"kind": "tied", "bias": False},
            "heads": {"kind": "wdr", "n": 2},
        },
        "objective": {"kind": "cross_entropy", "label_smoothing": 0.1, "ngram_alpha": 0.5},
        "task": task,
        "train": {
            **COMMON_TRAIN,
            "optimizer": "adam",
            "lr": 0.02,
            "epochs": 3,
            "clip": 1.0,
        },
        "eval": {"batch_size": 8, "beam": 2},
    }


def case_config(name: str, data_dir: Path) -> dict[str, Any]:
    if name == "lm_wdr_al":
        return lm_config({"kind": "augmented", "tau": 2.0, "ngram_alpha": 0.5}, "full")
    if name == "lm_wdr_real_chunked":
        objective = {
            "kind": "augmented",
            "tau": 2.0,
            "beta": 0.5,
            "target_source": "output",
            "ngram_alpha": 1.0,
            "ngram_heads_label_smoothing": 0.0,
            "label_smoothing": 0.1,
        }
        return lm_config(objective, "chunked")
    if name == "translation":
        return pairs_config(data_dir, {"kind": "translation"}, {"kind": "transformer_seq2seq"})
    if name == "diffusion":
        task = {
            "kind": "diffusion",
            "schedule": "dinoiser",
            "embedding_norm": True,
            "clip_every": 3,
            "decode_steps": 2,
            "length_beam": 2,
            "samples": 1,
        }
        return pairs_config(
            data_dir, task, {"kind": "diffusion_denoiser", "max_length_difference": 4}
        )
    raise KeyError(name)


CASES = ("lm_wdr_al", "lm_wdr_real_chunked", "translation", "diffusion")


def _hex(value: Any) -> Any:
    """Floats as their exact bits; containers element-wise; the rest as it is."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {k: _hex(v) for k, v in value.items() if k not in TIMINGS}
    if isinstance(value, list):
        return [_hex(v) for v in value]
    return value


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def run_case(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Train case ``name`` in ``tmp_path``; its numbers as exact bits."""
    data_dir = tmp_path / "pairs"
    write_pairs(data_dir)
    config = builders.config_from_dict(case_config(name, data_dir))
    losses: list[str] = []
    backward = torch.Tensor.backward

    def recording_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.dim() == 0:
            losses.append(float(self.detach()).hex())
        return backward(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "backward", recording_backward)
    run = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        results = train(config, run, log=lambda message: None)
    finally:
        torch.set_num_threads(threads)
    monkeypatch.undo()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {
        "backward_losses": losses,
        "metrics": [_hex(r) for r in records],
        "results": _hex({k: v for k, v in results.items() if k not in TIMINGS}),
        "weights": weights_digest(load_checkpoint(run / "last.pt")["model"]),
        "config": config_lib.dumps(config).count("\n"),  # (a cheap check the config is read)
    }


def kernel_set() -> str:
    """The CPU code paths torch and MKL take (e.g. ``AVX2``, ``AVX512``, ``AVX512-AMX``,
    ``AVX512-AMD``): the key of a record."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:  # not Linux: the capability alone
        return capability
    if "AuthenticAMD" in flags:  # MKL takes other paths on AMD's CPUs at the same capability
        return f"{capability}-AMD"
    return f"{capability}-AMX" if "amx_tile" in flags else capability


@pytest.mark.parametrize("name", CASES)
def test_training_and_evaluation_reproduce_the_recorded_bits(name, tmp_path, monkeypatch):
    records = json.loads(RECORD.read_text())
    if kernel_set() not in records:
        pytest.skip(
            f"bits recorded for {', '.join(sorted(records))} kernels; this CPU runs "
            f"{kernel_set()} ones, whose float results differ in the last bits"
        )
    recorded = records[kernel_set()][name]
    measured = run_case(name, tmp_path, monkeypatch)
    assert measured["backward_losses"] == recorded["backward_losses"]
    assert measured["metrics"] == recorded["metrics"]
    assert measured["results"] == recorded["results"]
    assert measured["weights"] == recorded["weights"]


def _record() -> None:  # pragma: no cover (run by hand)
    import tempfile

    out = {}
    for name in CASES:
        with tempfile.TemporaryDirectory() as directory:
            patch = pytest.MonkeyPatch()
            out[name] = run_case(name, Path(directory), patch)
            patch.undo()
    records = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    records[kernel_set()] = out
    RECORD.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/training/test_bit_identity.py --record")
    _record()
