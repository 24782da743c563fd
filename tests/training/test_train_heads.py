"""Drafting heads trained by self-distillation (``targetlm.training.distill``, ``targetlm
train-heads``): the targets are the body's own argmax, the cache reproduces the body's states,
training raises the heads' agreement with the body, the new run directory is whole or absent,
and bad input is one clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from conftest import model_config

from targetlm.config import ComponentConfig
from targetlm.modules import build_model
from targetlm.training import distill

V = 30
WORDS = ["<unk>", "<eos>"] + [f"w{i}" for i in range(V - 2)]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(kind: str = "simple", n: int = 3, seed: int = 0, **options):
    config = dataclasses.replace(
        model_config("transformer", max_context=32),
        heads=ComponentConfig(kind, {"n": n, **options}),
    )
    torch.manual_seed(seed)
    return build_model(config, WORDS).eval()


def greedy_text(model, rows: int, length: int) -> torch.Tensor:
    """(rows, length): random first tokens, then the body's greedy continuation."""
    text = torch.randint(2, V, (rows, 2), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        while text.size(1) < length:
            log_probs, _ = model.log_probs(text)
            text = torch.cat([text, log_probs[:, -1:].argmax(-1)], 1)
    return text


def test_distillation_targets_are_the_bodys_argmax_and_the_cache_its_states():
    """Each segment alone, through the model's own log-probabilities: the cached x̂ and the
    targets g (the body's argmax) are the same, batching aside; head n's targets are g n
    columns later."""
    model = tiny()
    segments = torch.randint(2, V, (5, 12))
    cache = distill.HiddenCache.build(model, segments, batch_size=2)
    assert cache.hidden.shape == (5, 12, 16) and cache.bytes == 5 * 12 * (16 * 4 + 16)
    with torch.no_grad():
        for row in range(5):
            alone = model(segments[row : row + 1], run_heads=False).main[0]
            torch.testing.assert_close(cache.hidden[row], alone, atol=1e-5, rtol=1e-5)
            log_probs, _ = model.log_probs(segments[row : row + 1])
            assert torch.equal(cache.greedy[row], log_probs[0].argmax(-1))
        weight, bias = model.output()
        logits = distill.head_logits(model.heads, cache.hidden, cache.greedy, weight, bias)
    assert [tuple(x.shape) for x in logits] == [(5, 11, V), (5, 10, V)]  # g[:, 1:], g[:, 2:]


@pytest.mark.parametrize("kind", ["simple", "mtp"])
def test_training_the_heads_raises_their_agreement_and_leaves_the_body(kind):
    model = tiny(kind, window=4) if kind == "mtp" else tiny(kind)
    body = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("heads.")}
    segments = greedy_text(model, 24, 16)  # the body's own continuations: predictable
    train = distill.HiddenCache.build(model, segments[:20])
    held = distill.HiddenCache.build(model, segments[20:])
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parameter in model.heads.parameters():
        parameter.requires_grad_(True)
    weight, bias = model.output()
    before = distill.draft_acceptance(model.heads, held, weight, bias)[0]
    distill.train_drafting_heads(model, train, steps=40, lr=1e-2, batch_size=4)
    after = distill.draft_acceptance(model.heads, held, weight, bias)[0]
    assert all(a > b + 0.1 for a, b in zip(after, before)), (before, after)
    for key, value in body.items():
        assert torch.equal(model.state_dict()[key], value), key


# --- the command ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A run directory of the tiny quickstart model as built (no training: only its files)."""
    from test_cli import QUICKSTART

    from targetlm import builders
    from targetlm import config as config_lib
    from targetlm.checkpoint import save_atomic
    from targetlm.data.readers import load_corpus

    run = tmp_path_factory.mktemp("train_heads") / "run"
    run.mkdir()
    config = builders.load_config(
        QUICKSTART,
        [
            "data.synthetic.train_sentences=120",
            "data.synthetic.valid_sentences=20",
            "data.synthetic.test_sentences=20",
            "model.encoder.hidden_size=16",
            "model.embedding.size=16",
        ],
    )
    vocab = load_corpus(config.data, (config.data.train,)).vocab
    torch.manual_seed(0)
    model = build_model(config.model, vocab.itos)
    (run / "config.toml").write_text(config_lib.dumps(config))
    vocab.save(run / "vocab.txt")
    save_atomic(
        {"model": model.state_dict(), "vocab": vocab.state_dict(), "config": config.to_dict()},
        run / "best.pt",
    )
    return run


def test_train_heads_writes_a_whole_run_that_drafts(tiny_run, tmp_path, capsys):
    import json

    from targetlm.cli import main
    from targetlm.runs import load_run

    new = tmp_path / "heads"
    # what was measured on the source model would describe other heads: left behind
    (tiny_run / "eval-test.json").write_text("{}", encoding="utf-8")
    (tmp_path / ".heads.k1ll3d.tmp").mkdir()  # a staging directory left by a killed call
    (tmp_path / ".heads.k1ll3d.tmp" / "best.pt").write_bytes(b"half a checkpoint")
    args = ["train-heads", str(tiny_run), "--corpus", "train", "--steps", "30", "--segment", "16"]
    assert main([*args, "--run-dir", str(new), "--heads-kind", "simple", "--n", "3", "--json"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.splitlines()[-1])
    assert "head 2: top-1 agreement with the body on held-out text" in out
    assert len(result["agreement"]) == 2 and result["heads"] == {"kind": "simple", "n": 3}
    assert sorted(p.name for p in new.iterdir()) == [
        "best.pt",
        "config.toml",
        "heads.json",
        "vocab.txt",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    _, _, model, _ = load_run(new)
    _, _, source, _ = load_run(tiny_run)
    assert model.num_heads == 2
    for key, value in source.state_dict().items():  # the body is the source run's
        assert torch.equal(model.state_dict()[key], value), key
    rc = main(["generate", str(new), "--prompt", "the", "--max-tokens", "8", "--temperature", "0"])
    greedy = capsys.readouterr().out
    assert rc == 0
    extra = ["--speculative", "heads"]
    rc = main(
        ["generate", str(new), "--prompt", "the", "--max-tokens", "8", "--temperature", "0", *extra]
    )
    assert rc == 0 and capsys.readouterr().out == greedy


def test_train_heads_bad_input_is_one_error_and_writes_nothing(
    tiny_run, tmp_path, capsys, monkeypatch
):
    from test_cli import assert_one_error

    from targetlm.checkpoint import load, save_atomic
    from targetlm.cli import main
    from targetlm.cli import train_heads as command

    new = tmp_path / "heads"
    base = ["train-heads", str(tiny_run), "--steps", "2", "--segment", "16", "--run-dir", str(new)]
    rc = main([*base, "--corpus", "nowhere.txt", "--heads-kind", "simple"])
    assert_one_error(capsys, rc, "--corpus nowhere.txt", "neither a file nor a split")
    rc = main([*base, "--corpus", "train"])  # the quickstart run has no heads
    assert_one_error(capsys, rc, "no heads", "--heads-kind")
    rc = main([*base, "--corpus", "train", "--heads-kind", "simple", "--steps", "0"])
    assert_one_error(capsys, rc, "--steps must be >= 1")
    # heads trained for another body: one error naming the tensor and both shapes
    other = tmp_path / "other"
    other.mkdir()
    for item in tiny_run.iterdir():
        if item.is_file():
            (other / item.name).write_bytes(item.read_bytes())
    checkpoint = load(other / "best.pt")
    checkpoint["model"]["heads.mlps.0.0.weight"] = torch.zeros(24, 24)
    checkpoint["model"]["heads.mlps.0.0.bias"] = torch.zeros(24)
    save_atomic(checkpoint, other / "best.pt")
    rc = main([*base, "--corpus", "train", "--heads-kind", "simple", "--init-heads", str(other)])
    assert_one_error(capsys, rc, "heads.mlps.0.0.weight is (24, 24) there and (16, 16) here")
    assert not new.exists()
    # a failure while writing leaves neither the run nor its staging directory

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("targetlm.checkpoint.save_atomic", broken)
    with pytest.raises(OSError):
        command.run(command_args(base[1:], "--corpus", "train", "--heads-kind", "simple"))
    assert not new.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def command_args(*args: str):
    from targetlm.cli import build_parser

    flat = [a for part in args for a in (part if isinstance(part, list) else [part])]
    return build_parser().parse_args(["train-heads", *flat])


def test_heads_train_on_an_hf_backbone():
    """The recipe needs only the model's x̂ and output layer: a tiny local llama body."""
    pytest.importorskip("transformers")
    from targetlm.config import ModelConfig

    hf = {
        "model_type": "llama",
        "vocab_size": V,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 48,
        "tie_word_embeddings": True,
    }
    torch.manual_seed(0)
    config = ModelConfig(
        backbone=ComponentConfig("hf", {"config": hf}), heads=ComponentConfig("simple", {"n": 3})
    )
    model = build_model(config, WORDS).eval()
    segments = greedy_text(model, 48, 12)  # (its greedy text soon repeats one word a row)
    train = distill.HiddenCache.build(model, segments[:40])
    with torch.no_grad():
        log_probs, _ = model.log_probs(segments[:40])
    assert torch.equal(train.greedy, log_probs.argmax(-1))
    held = distill.HiddenCache.build(model, segments[40:])
    heads = {id(p) for p in model.heads.parameters()}
    for parameter in model.parameters():
        parameter.requires_grad_(id(parameter) in heads)
    weight, bias = model.output()
    before = distill.draft_acceptance(model.heads, held, weight, bias)[0]
    distill.train_drafting_heads(model, train, steps=30, lr=0.05, batch_size=8)
    after = distill.draft_acceptance(model.heads, held, weight, bias)[0]
    assert all(a > b + 0.2 for a, b in zip(after, before)), (before, after)


def test_train_heads_reads_a_config_file_as_its_body(tmp_path, capsys):
    """A config file: its model as built (a pretrained backbone as published) is the body."""
    from test_cli import QUICKSTART

    from targetlm.cli import main
    from targetlm.runs import load_run

    new = tmp_path / "heads"
    sets = ["data.synthetic.train_sentences=60", "model.encoder.hidden_size=16"]
    sets += ["model.embedding.size=16"]
    config = tmp_path / "body.toml"
    from targetlm import builders
    from targetlm import config as config_lib

    config.write_text(config_lib.dumps(builders.load_config(QUICKSTART, sets)))
    args = ["train-heads", str(config), "--corpus", "train", "--steps", "2", "--segment", "16"]
    assert main([*args, "--run-dir", str(new), "--heads-kind", "medusa", "--n", "3"]) == 0
    assert "head 2: top-1 agreement" in capsys.readouterr().out
    _, vocab, model, _ = load_run(new)
    assert model.num_heads == 2 and len(vocab) > 10
