from __future__ import annotations

import os

# one thread, here and in the CLI processes the tests start: the tests' models are tiny, and on a
# 2-core machine two threads spin against any other load (measured beside two training runs: the
# default run 710 s with two threads, 500 s with one; one AL training test 45 s against 5 s)
os.environ["OMP_NUM_THREADS"] = "1"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import targetlm.lexicon
from targetlm import builders, extras
from targetlm import config as config_lib
from targetlm.config import ComponentConfig, ModelConfig
from targetlm.lexicon import Lexicon

torch.set_num_threads(1)

# the tests live in one folder per package (tests/modules, tests/training, ...); a test module
# that reuses another's helpers imports it by its file name, wherever the two live
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.append(str(_folder))

# small options for every registered component, so contract tests cover each one;
# a newly registered kind without an entry here fails tests/project/test_contract_coverage.py
ENCODER_OPTIONS = {
    "lstm": {"hidden_size": 24, "num_layers": 2},
    "transformer": {
        "num_layers": 2,
        "num_heads": 2,
        "ff_size": 32,
        "max_context": 64,
        "dropout": 0.0,
    },
    "tensorized_transformer": {
        "num_layers": 2,
        "rank": 8,
        "num_blocks": 2,
        "ff_size": 32,
        "max_context": 64,
        "dropout": 0.0,
    },
    "reformer": {  # one layer (tests/modules/test_backbones.py trains two, shared): LSH costs per call
        "model_size": 16,
        "num_layers": 1,
        "num_heads": 2,
        "head_size": 8,
        "bucket_size": 4,
        "num_hashes": 2,
        "ff_multiplier": 2,
        "ff_chunks": 1,
        "share_layers": False,
        "lsh_dropout": 0.0,
        "max_context": 64,
    },
}


def extra_marks(config: config_lib.Config) -> list[pytest.MarkDecorator]:
    """The marks of a test of ``config``, from the optional packages its components need
    (:func:`targetlm.extras.needed`): one mark per package, named as the ``scripts/setup.sh``
    option that installs it (``-m reformer`` selects the Reformer's tests), and a skip that
    says what to install while one of them is missing."""
    marks = [getattr(pytest.mark, extra.name) for extra in extras.needed(config)]
    reasons = extras.missing(config)
    if reasons:
        marks.append(pytest.mark.skip(reason="; ".join(reasons)))
    return marks


def encoder_config(kind: str) -> config_lib.Config:
    """A config with the encoder ``kind`` (its options left out: for :func:`extra_marks`)."""
    return config_lib.Config(model=ModelConfig(encoder=ComponentConfig(kind)))


def needs_extras(config: config_lib.Config):
    """A test decorator: the :func:`extra_marks` of ``config``."""

    def decorate(test):
        for mark in extra_marks(config):
            test = mark(test)
        return test

    return decorate


def needs_encoder(kind: str):
    """A test decorator: the :func:`extra_marks` of the encoder ``kind``."""
    return needs_extras(encoder_config(kind))


def encoder_params(kinds) -> list:
    """``kinds`` as pytest params; a kind built from an optional package is marked with it, and
    skips with a reason where the package is absent."""
    return [pytest.param(kind, marks=extra_marks(encoder_config(kind))) for kind in kinds]


# encoders that read a source besides the stream (Encoder.conditional): the translation
# contract tests (tests/tasks/test_translation.py) run them; the LM contract tests cannot
CONDITIONAL_ENCODER_OPTIONS = {
    "transformer_seq2seq": {
        "encoder_layers": 2,
        "decoder_layers": 2,
        "num_heads": 2,
        "ff_size": 32,
        "max_context": 48,
        "dropout": 0.0,
    },
}
# diffusion denoisers (conditional encoders that read noised target embeddings, not a prefix):
# the diffusion contract tests (tests/tasks/test_diffusion.py) run them
DENOISER_ENCODER_OPTIONS = {
    "diffusion_denoiser": {
        "encoder_layers": 1,
        "decoder_layers": 2,
        "num_heads": 2,
        "ff_size": 32,
        "max_context": 48,
        "dropout": 0.0,
        "max_length_difference": 4,
    },
}
# bidirectional encoders (Encoder.causal = False, not conditional): the masked-LM and
# classification contract tests (tests/tasks/test_mlm.py) run them; the causal LM contracts cannot
BIDIRECTIONAL_ENCODER_OPTIONS = {
    "crammed_bert": {
        "num_layers": 2,
        "num_heads": 2,
        "ff_size": 32,
        "max_context": 64,
        "dropout": 0.0,
    },
}
CHAR_CNN = {"char_size": 8, "widths": [1, 2, 3], "channels_per_width": 8, "highway_layers": 1}
OUTPUT_OPTIONS = {
    "lookup": {},
    "tied": {},
    "bilinear": {},
    "deep_residual": {"depth": 2, "activation": "tanh"},
    "adaptive": {"cutoffs": [4, 12], "factor": 2.0},
    "char_cnn": CHAR_CNN,
    "groc": {"depth": 1, **CHAR_CNN},
}


def tiny_lexicon(words) -> Lexicon:
    """A hand-written stand-in for WordNet over any word list: most words get relatives and a
    gloss (some of it outside the list), some get only one of the two, some nothing."""
    words = list(words)
    n = len(words)
    relations = {w: [words[(i + 1) % n], words[(i + 7) % n]] for i, w in enumerate(words) if i % 3}
    definitions = {
        w: ["a", "kind", "of", words[(i + 3) % n], "thing"]
        for i, w in enumerate(words)
        if i % 4 != 1
    }
    return Lexicon(relations, definitions)


@pytest.fixture(autouse=True)
def no_learning_curve(request, monkeypatch):
    """A finished run's learning-curve figure is drawn only in the tests marked
    ``learning_curve``: matplotlib (its layout and log-scale tick labels) is about two thirds
    of a tiny run's time; elsewhere report.md goes without the figure, as when nothing was
    logged."""
    if request.node.get_closest_marker("learning_curve") is None:
        monkeypatch.setattr("targetlm.analysis.report.plot_learning_curve", lambda *args: False)


@pytest.fixture(autouse=True)
def fake_wordnet(monkeypatch):
    """Models built in tests ground GroC in :func:`tiny_lexicon`, never in the real WordNet
    (tests of the WordNet reader call ``targetlm.lexicon.wordnet`` directly)."""
    monkeypatch.setattr(
        targetlm.lexicon, "load_lexicon", lambda words, *a, **k: tiny_lexicon(words)
    )


def model_config(
    encoder: str = "lstm", output: str = "tied", embedding_size: int = 16, **encoder_options
) -> ModelConfig:
    return ModelConfig(
        embedding=ComponentConfig("lookup", {"size": embedding_size}),
        encoder=ComponentConfig(encoder, {**ENCODER_OPTIONS[encoder], **encoder_options}),
        output=ComponentConfig(output, dict(OUTPUT_OPTIONS[output])),
    )


def tiny_config(**overrides) -> config_lib.Config:
    """A seconds-long training config on a small synthetic corpus; ``overrides`` are ``--set`` pairs."""
    base = {
        "data": {
            "name": "synthetic",
            "batch_size": 4,
            "bptt": 10,
            "synthetic": {"train_sentences": 120, "valid_sentences": 20, "test_sentences": 20},
        },
        "model": {
            "embedding": {"kind": "lookup", "size": 16},
            "encoder": {"kind": "lstm", "hidden_size": 16, "num_layers": 2},
            "output": {"kind": "tied"},
        },
        "train": {
            "optimizer": "sgd",
            "lr": 1.0,
            "epochs": 2,
            "log_every": 1,
            "progress": False,
            "clip": 1.0,
        },
        "eval": {"batch_size": 2},
    }
    return builders.config_from_dict(  # checked as the CLI and the trainer check it
        config_lib.apply_overrides(base, [f"{k}={v}" for k, v in overrides.items()])
    )


@pytest.fixture(params=encoder_params(sorted(ENCODER_OPTIONS)))
def encoder_kind(request) -> str:
    return request.param


@pytest.fixture(params=sorted(OUTPUT_OPTIONS))
def output_kind(request) -> str:
    return request.param


def write_pretrained_tokenizer(directory, lines, size: int = 300, rows: int | None = None):
    """A stand-in for a pretrained model's directory, as the ``hf`` tokenizer reads it: a
    byte-level BPE ``tokenizer.json`` (with one special symbol) and a ``config.json`` with the
    model's embedding rows (default: the tokenizer's size). Needs ``tokenizers`` only."""
    import json

    tokenizer = byte_level_bpe(lines, size)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    vocab_size = rows or tokenizer.get_vocab_size()
    config = {"model_type": "llama", "vocab_size": vocab_size}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def byte_level_bpe(lines, size: int = 300):
    """A GPT-2-style byte-level BPE ``tokenizers.Tokenizer`` trained on ``lines``, with one
    special symbol (``<|endoftext|>``), as a small pretrained model would ship it."""
    import tokenizers as lib

    tokenizer = lib.Tokenizer(lib.models.BPE())
    tokenizer.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = lib.decoders.ByteLevel()
    trainer = lib.trainers.BpeTrainer(
        vocab_size=size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer)
    return tokenizer


def one_error(capsys, rc: int) -> str:
    """The one error line a command printed (without its ``targetlm: error:`` prefix), after
    checking it exited 2 and printed nothing else on stderr."""
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("targetlm: error: "), err
    return lines[0].removeprefix("targetlm: error: ")


def files_of(directory) -> dict[str, bytes]:
    """Each file of ``directory`` by name, with its bytes: compare before and after a command."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}
