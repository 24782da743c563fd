"""The Tensorized Transformer and Reformer encoders beyond the shared contracts (which
tests/modules/test_modules.py runs on every registered encoder): the multi-linear attention's
equation, the LSH attention in training, and a tiny training with WDR heads through the CLI."""

from __future__ import annotations

import json

import torch
from conftest import needs_encoder

from targetlm.cli import main
from targetlm.modules.tensorized import MultiLinearAttention, TensorizedTransformer

needs_reformer = needs_encoder("reformer")


def test_multilinear_attention_equals_the_block_term_sum():
    """Output i = Σ_{j,k ≤ i} T[i,j,k] W^O[(j,k)], T from the shared factors and mean core."""
    torch.manual_seed(0)
    attention = MultiLinearAttention(6, rank=3, num_blocks=2, max_context=5, dropout=0.0)
    with torch.no_grad():
        for parameter in attention.parameters():
            parameter.normal_()
    x = torch.randn(2, 4, 6)
    out = attention(x)
    q, k, v = attention.factors(x).chunk(3, -1)
    p = attention.position_factor(attention.sinusoids[:4])
    g = attention.cores.mean(0)
    weight = attention.merge.weight.view(6, 5, 5)
    expected = torch.zeros(2, 4, 6)
    for b in range(2):
        for i in range(4):
            for j in range(i + 1):
                for k_ in range(i + 1):
                    t = (
                        g
                        * (
                            (q[b, i] + attention.content_bias) * k[b, j]
                            + (q[b, i] + attention.position_bias) * p[j]
                        )
                        * v[b, k_]
                    ).sum()
                    expected[b, i] += t * weight[:, j, k_]
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_tensorized_transformer_has_the_papers_size():
    """Heo et al.'s TT on PTB: 3 layers of width 256 with a tied 10K vocabulary, ≈ 6.7M."""
    encoder = TensorizedTransformer(256)  # the defaults are the PTB preset's
    total = sum(p.numel() for p in encoder.parameters()) + 10_000 * 256 + 10_000
    assert 6.65e6 < total < 6.75e6


def _reformer(**options):
    from targetlm.modules.reformer import ReformerEncoder

    torch.manual_seed(0)
    defaults = dict(
        model_size=16, num_layers=2, num_heads=2, head_size=8, ff_chunks=1, lsh_dropout=0.0
    )
    return ReformerEncoder(16, **{**defaults, **options})


@needs_reformer
def test_lsh_attention_over_two_buckets_equals_the_eval_attention():
    """One hashing round over a window of two buckets lets every query see every earlier
    position, so training's LSH attention equals eval mode's exact attention."""
    encoder = _reformer(bucket_size=4, num_hashes=1)
    x = torch.randn(2, 8, 16)
    trained, _ = encoder.train()(x)
    evaluated, _ = encoder.eval()(x)
    torch.testing.assert_close(trained, evaluated, atol=1e-5, rtol=1e-5)


@needs_reformer
def test_training_hashes_afresh_and_backpropagates_through_reversible_layers():
    encoder = _reformer(bucket_size=2, num_hashes=2).train()
    x = torch.randn(2, 13, 16, requires_grad=True)  # padded to 16 positions inside
    a, state = encoder(x)
    b, _ = encoder(x)
    assert a.shape == (2, 13, 16) and state.shape == (2, 13, 16)
    assert not torch.allclose(a, b)  # random rotations drawn at each call: LSH is in use
    a.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is not None for p in encoder.reformer.parameters() if p.requires_grad)


@needs_reformer
def test_eval_attention_lsh_keeps_hashing_in_eval_mode():
    encoder = _reformer(bucket_size=2, num_hashes=2, eval_attention="lsh").eval()
    x = torch.randn(2, 16, 16)
    torch.manual_seed(1)
    a, _ = encoder(x)
    torch.manual_seed(2)
    b, _ = encoder(x)
    assert not torch.allclose(a, b)


def _train_through_cli(tmp_path, encoder: str, output: str) -> dict:
    """Train a tiny model with 2-gram WDR heads through ``targetlm train``; its results."""
    config = tmp_path / "tiny.toml"
    config.write_text(
        f"""
[data]
name = "synthetic"
batch_size = 4
bptt = 8
synthetic = {{ train_sentences = 40, valid_sentences = 8, test_sentences = 8 }}

[model.embedding]
kind = "lookup"
size = 16

[model.encoder]
{encoder}

[model.output]
kind = "{output}"

[model.heads]
kind = "wdr"
n = 2

[objective]
kind = "cross_entropy"
ngram_alpha = 1.0

[train]
optimizer = "adam"
lr = 0.003
epochs = 1
progress = false

[eval]
batch_size = 2
""",
        encoding="utf-8",
    )
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert 1 < results["test"]["ppl"] < float("inf")
    return run


def test_a_tiny_tensorized_transformer_with_wdr_heads_trains_and_ensembles(tmp_path, capsys):
    encoder = 'kind = "tensorized_transformer"\nnum_layers = 1\nrank = 4\nff_size = 16\n'
    run = _train_through_cli(tmp_path, encoder + "max_context = 16\ndropout = 0.1", "tied")
    capsys.readouterr()
    assert main(["eval", str(run), "--json", "--ensemble-lambda", "0,0.3"]) == 0
    assert json.loads(capsys.readouterr().out)


@needs_reformer
def test_a_tiny_reformer_with_wdr_heads_trains_through_the_cli(tmp_path):
    encoder = 'kind = "reformer"\nmodel_size = 16\nnum_layers = 2\nnum_heads = 2\n'
    encoder += "head_size = 8\nbucket_size = 4\nnum_hashes = 2\nff_chunks = 1\nmax_context = 16"
    _train_through_cli(tmp_path, encoder, "lookup")
