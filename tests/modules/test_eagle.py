"""The EAGLE-style drafting head (``modules/eagle.py``, kind ``eagle``): its layer against
transformers' Llama decoder layer with the same weights, its later steps against a
column-by-column computation of the training-time test's attention, the incremental drafter
against the training-time forward, the reduced draft vocabulary (FR-Spec), and train-heads
end to end."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import model_config

from targetlm.config import ComponentConfig
from targetlm.modules import HEADS, build_model
from targetlm.modules.drafting import DraftStart, Verified
from targetlm.modules.eagle import EagleHead, draft_vocabulary, rope
from targetlm.registry import ConfigError
from targetlm.training import distill

D, V = 16, 40
SHAPE = {"num_attention_heads": 4, "num_key_value_heads": 2, "ff_size": 24}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_head(n: int = 4, seed: int = 0, **options) -> EagleHead:
    torch.manual_seed(seed)
    head = HEADS.build("eagle", {"n": n, **SHAPE, **options}, "heads", embedding_dim=D)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.normal_(0, 0.3)
    assert isinstance(head, EagleHead)
    return head.eval()


def test_parameter_names_are_the_speculators_eagle3_layout():
    head = random_head(draft_vocab=8)
    names = set(head.state_dict())
    layer = "layers.0."
    expected = {"fc.weight", "norm.weight", "d2t"}
    expected |= {layer + f"{n}.weight" for n in ("input_layernorm", "hidden_norm")}
    expected |= {layer + "post_attention_layernorm.weight"}
    expected |= {layer + f"self_attn.{p}_proj.weight" for p in "qkvo"}
    expected |= {layer + f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert names == expected
    assert tuple(head.layers[0].self_attn.q_proj.weight.shape) == (16, 2 * D)
    assert tuple(head.layers[0].self_attn.k_proj.weight.shape) == (8, 2 * D)  # 2 kv heads of 4


def test_step_one_is_llamas_decoder_layer_with_eagle3s_first_layer_inputs():
    """With every column in the window, step 1 is transformers' LlamaDecoderLayer whose q/k/v
    read [input_layernorm(E[y]) ; hidden_norm(fc(x̂))] and whose residual is fc(x̂) (speculators'
    Eagle3 first layer), causal, RoPE positions t + 1."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    head = random_head(window=32, rope_theta=500.0, rms_norm_eps=1e-5)
    config = transformers.LlamaConfig(
        hidden_size=D, intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
        head_dim=4, rope_theta=500.0, rms_norm_eps=1e-5, attention_bias=False,
    )  # fmt: skip
    config._attn_implementation = "eager"
    llama = modeling_llama.LlamaDecoderLayer(config, 0)
    attention = llama.self_attn
    for name in "qkv":
        setattr(
            attention, f"{name}_proj", torch.nn.Linear(2 * D, 8 if name != "q" else 16, bias=False)
        )
    ours = head.layers[0]
    with torch.no_grad():
        for name in "qkvo":
            getattr(attention, f"{name}_proj").weight.copy_(
                getattr(ours.self_attn, f"{name}_proj").weight
            )
        for name in ("gate", "up", "down"):
            getattr(llama.mlp, f"{name}_proj").weight.copy_(
                getattr(ours.mlp, f"{name}_proj").weight
            )
        llama.input_layernorm.weight.copy_(ours.input_layernorm.weight)
        llama.post_attention_layernorm.weight.copy_(ours.post_attention_layernorm.weight)
    B, T = 2, 9
    hidden, words = torch.randn(B, T, D), torch.randn(B, T, D)
    with torch.no_grad():
        z = hidden @ head.fc.weight.T
        embeds = llama.input_layernorm(words)
        normed = F.rms_norm(z, (D,), ours.hidden_norm.weight, 1e-5)
        joined = torch.cat([embeds, normed], -1)
        positions = torch.arange(1, T + 1)[None]
        rotary = modeling_llama.LlamaRotaryEmbedding(config)
        cos_sin = rotary(joined, positions)
        causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
        attended, _ = attention(joined, position_embeddings=cos_sin, attention_mask=causal)
        x = z + attended
        expected = x + llama.mlp(llama.post_attention_layernorm(x))
        expected = F.rms_norm(expected, (D,), head.norm.weight, 1e-5)
        got = head.reconstruct(head(hidden)[:1], words)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _naive(head: EagleHead, hidden: torch.Tensor, words: torch.Tensor, depths: int):
    """Column by column, step by step: step k's query at column t attends to step 1's keys of
    columns t − window + 1..t and steps 2..k's keys at t."""
    layer, a = head.layers[0], head.layers[0].self_attn
    B, T, _ = hidden.shape
    words = F.pad(words, (0, 0, 0, depths))
    z = head.fc(hidden)
    out = torch.zeros(depths, B, T, D)
    times = a.heads // a.kv_heads

    def kv(word, h, position):
        q, k, v = layer.project(word[:, None], h[:, None])
        pos = torch.tensor([position])
        return rope(q, pos, head.rope_theta), rope(k, pos, head.rope_theta), v

    step1 = [kv(words[:, s], z[:, s], s + 1) for s in range(T)]
    for t in range(T):
        h = z[:, t]
        own: list = []
        for k in range(1, depths + 1):
            q, key, value = kv(words[:, t + k - 1], h, t + k) if k > 1 else step1[t]
            if k > 1:
                own.append((key, value))
            first = range(max(0, t - head.window + 1), t + 1)
            keys = torch.cat([step1[s][1] for s in first] + [x[0] for x in own], 2)
            values = torch.cat([step1[s][2] for s in first] + [x[1] for x in own], 2)
            keys, values = keys.repeat_interleave(times, 1), values.repeat_interleave(times, 1)
            weights = torch.softmax(q @ keys.transpose(-1, -2) / math.sqrt(a.head_dim), -1)
            h = layer.finish(h[:, None], weights @ values)[:, 0]
            out[k - 1, :, t] = head.norm(h)
    return out


def test_later_steps_attend_to_the_text_and_their_own_column():
    head = random_head(window=4)
    hidden, words = torch.randn(2, 9, D), torch.randn(2, 9, D)
    with torch.no_grad():
        got = head.reconstruct(head(hidden), words)
        expected = _naive(head, hidden, words, 3)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _verify(weight, drafted, columns_after):
    """A stand-in body: the x̂ after each drafted token, and greedy's tokens."""
    main = columns_after(drafted)
    greedy = (main @ weight.T).argmax(-1)
    return main, greedy


@pytest.mark.parametrize("batch", [1, 4])
def test_the_drafter_drafts_what_the_training_forward_gives(batch):
    """Rows of different lengths (some shorter than the window), ragged accepted lengths, a step
    without drafts and a row leaving: every proposal is the training-time forward's argmax
    over the draft vocabulary at the row's last column, the drafted words after it."""
    head = random_head(n=4, window=6, draft_vocab=24)
    generator = torch.Generator().manual_seed(3)
    head.set_draft_vocabulary(torch.sort(torch.randperm(V, generator=generator)[:24]).values)
    weight = torch.randn(V, D, generator=generator)
    ids = head.draft_ids(V)
    table = torch.randn(V, D, generator=generator)  # the stand-in body's x̂ after each token

    lengths = [3, 9, 5, 12][:batch]
    texts = [torch.randint(V, (n,), generator=generator).tolist() for n in lengths]
    columns = [table[torch.tensor(t)] for t in texts]  # x̂ of every column read
    P = head.context
    start_columns = torch.stack([F.pad(c[-P:], (0, 0, max(P - len(c), 0), 0)) for c in columns])
    drafter = head.drafter(DraftStart(weight, None, [list(t) for t in texts], start_columns))
    assert drafter.length == 3
    alive = list(range(batch))
    first = torch.randint(V, (batch,), generator=generator)
    for step in range(8):
        with torch.no_grad():
            drafted = drafter.propose(first) if step != 2 else first[:, None]
        for b, row in enumerate(alive if drafted.size(1) > 1 else []):  # the training forward
            text = texts[row] + drafted[b].tolist()
            read = len(texts[row])
            x = columns[row][None]
            embeddings = weight[torch.tensor(text[1:])][None]
            with torch.no_grad():
                vectors = head.reconstruct(head(x)[: drafted.size(1) - 1], embeddings)
            for k in range(1, drafted.size(1)):
                token = ids[(vectors[k - 1, 0, read - 1] @ weight[ids].T).argmax()]
                assert int(token) == int(drafted[b, k]), (step, row, k)
        main = table[drafted]
        greedy = (main @ weight.T).argmax(-1)
        agree = torch.randint(0, drafted.size(1), (len(alive),), generator=generator)
        keep = agree + 1
        kept = keep.tolist()
        for b, row in enumerate(alive):
            texts[row] = texts[row] + drafted[b, : kept[b]].tolist()
            columns[row] = torch.cat([columns[row], main[b, : kept[b]]])
        index = torch.arange(len(alive))
        verified = Verified(
            drafted=drafted, main=main, keep=keep, kept=kept,
            tokens=[drafted[b, : kept[b]].tolist() for b in range(len(alive))],
            predicted=main[index, keep - 1], first=greedy[index, keep - 1],
        )  # fmt: skip
        drafter.accept(verified)
        first = torch.randint(V, (len(alive),), generator=generator)
        if batch > 1 and step == 4:
            staying = [0, 2, 3]
            drafter.select(torch.tensor(staying))
            alive, first = [alive[b] for b in staying], first[staying]


def test_draft_vocabulary_is_the_most_frequent_ids_sorted_and_round_trips():
    counts = torch.tensor([5, 0, 9, 9, 1, 0, 7])
    ids = draft_vocabulary(counts, 4)
    assert ids.tolist() == [0, 2, 3, 6]  # 9, 9 (id order), 7, 5
    assert draft_vocabulary(counts, 7).tolist() == list(range(7))
    assert draft_vocabulary(torch.tensor([0, 0, 3, 0]), 2).tolist() == [0, 2]  # unseen: id order
    head = random_head(draft_vocab=4)
    head.set_draft_vocabulary(ids)
    assert head.d2t.tolist() == [0, 1, 1, 3]  # target = index + d2t[index] (speculators')
    assert torch.equal(head.draft_ids(7), ids)
    assert head.target_mask(7).tolist() == [True, False, True, True, False, False, True]
    for size in (0, 8):
        with pytest.raises(ConfigError, match="draft_vocab"):
            draft_vocabulary(counts, size)
    with pytest.raises(ConfigError, match="does not fit the body's 5 tokens"):
        head.draft_ids(5)  # id 6 is not a token of a 5-token body


def test_bad_shapes_are_one_clear_error():
    with pytest.raises(ConfigError, match="does not divide"):
        HEADS.build(
            "eagle", {"num_attention_heads": 4, "num_key_value_heads": 3}, "h", embedding_dim=D
        )
    with pytest.raises(ConfigError, match="not divisible"):
        HEADS.build("eagle", {"num_attention_heads": 3}, "h", embedding_dim=D)
    with pytest.raises(ConfigError, match="even"):
        HEADS.build("eagle", {"head_dim": 5}, "h", embedding_dim=D)


def tiny_model(**options):
    config = dataclasses.replace(
        model_config("transformer", max_context=32),
        heads=ComponentConfig("eagle", {"n": 3, **SHAPE, **options}),
    )
    torch.manual_seed(0)
    return build_model(config, [f"w{i}" for i in range(V)]).eval()


def test_distillation_learns_the_bodys_distribution_over_the_draft_vocabulary():
    """The loss is the soft cross entropy with the body's distribution n columns later over the
    draft vocabulary (checked against a direct computation); training lowers it and raises
    the agreement and the accepted length on held-out segments; the body never changes."""
    model = tiny_model(window=8, draft_vocab=20)
    segments = torch.randint(V, (24, 12), generator=torch.Generator().manual_seed(0))
    ids = draft_vocabulary(torch.bincount(segments[:20].flatten(), minlength=V), 20)
    model.heads.set_draft_vocabulary(ids)
    train = distill.HiddenCache.build(model, segments[:20])
    held = distill.HiddenCache.build(model, segments[20:])
    weight, bias = model.output()
    with torch.no_grad():
        loss = distill.distillation_loss(
            model.heads, train.hidden, train.greedy, train.tokens, weight, bias
        )
        following = F.pad(train.tokens[:, 1:], (0, 1))
        vectors = model.heads.reconstruct(model.heads(train.hidden), weight[following])
        rows = weight[ids], bias[ids]
        expected = []
        for n in (1, 2):
            p = torch.softmax(F.linear(train.hidden[:, n:], *rows), -1)
            log_q = torch.log_softmax(F.linear(vectors[n - 1, :, :-n], *rows), -1)
            expected.append(-(p * log_q).sum(-1).mean())
    torch.testing.assert_close(loss, torch.stack(expected).mean())
    body = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("heads.")}
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    for parameter in model.heads.parameters():
        parameter.requires_grad_(True)

    def held_loss():
        with torch.no_grad():
            return float(
                distill.distillation_loss(
                    model.heads, held.hidden, held.greedy, held.tokens, weight, bias
                )
            )

    before, accepted_before = distill.draft_acceptance(model.heads, train, weight, bias)
    held_before = held_loss()
    last, steps = distill.train_drafting_heads(model, train, steps=60, lr=1e-2, batch_size=4)
    after, accepted = distill.draft_acceptance(model.heads, train, weight, bias)
    assert steps == 60 and last < float(loss) and held_loss() < held_before
    assert after[0] > before[0] + 0.1 and accepted > accepted_before, (before, after)
    for key, value in body.items():
        assert torch.equal(model.state_dict()[key], value), key


# --- train-heads ------------------------------------------------------------------------------

from test_train_heads import tiny_run  # noqa: E402, F401  (the fixture: a tiny run directory)


def test_train_heads_trains_an_eagle_head_that_drafts_exactly(tiny_run, tmp_path, capsys):  # noqa: F811
    """``--heads-kind eagle`` with a draft vocabulary: the map is the training text's K most
    frequent tokens, saved in best.pt as a tensor; the same call gives the same heads; a run
    continued with --init-heads keeps the map; speculative decoding with the head is greedy's
    output; a draft vocabulary larger than the vocabulary is one error, nothing written."""
    import json

    from test_cli import assert_one_error

    from targetlm.checkpoint import load
    from targetlm.cli import main
    from targetlm.runs import load_run

    base = ["train-heads", str(tiny_run), "--corpus", "train", "--segment", "16", "--json"]
    eagle = ["--heads-kind", "eagle", "--n", "3", "--heads-set", "draft_vocab=12"]
    eagle += ["--heads-set", "window=8", "--heads-set", "ff_size=24"]
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        assert main([*base, "--steps", "20", "--lr", "1e-2", *eagle, "--run-dir", str(run)]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.splitlines()[-1])
    assert result["heads"]["kind"] == "eagle" and result["heads"]["draft_vocab"] == 12
    assert "accepted length" in out and len(result["agreement"]) == 2
    first, second = (load(run / "best.pt")["model"] for run in runs)
    assert all(torch.equal(first[k], second[k]) for k in first)  # the same call, the same heads
    config, vocab, model, _ = load_run(runs[0])
    ids = model.heads.draft_ids(len(vocab))
    assert torch.equal(first["heads.d2t"] + torch.arange(12), ids)
    # the map: the 12 most frequent tokens of the segments trained on
    from targetlm.data import read_lines, with_context_token

    lines = read_lines(config.data, config.data.train)
    text = with_context_token(vocab.encode(vocab.require_tokenizer().tokenize(lines)), vocab.eos_id)
    segments = text[: text.numel() // 16 * 16].view(-1, 16)
    trained = segments[: result["train_segments"]]
    assert torch.equal(
        ids, draft_vocabulary(torch.bincount(trained.flatten(), minlength=len(vocab)), 12)
    )
    # continued from its own heads: the map comes with them
    more = tmp_path / "more"
    args = [*base, "--steps", "2", *eagle, "--init-heads", str(runs[0]), "--run-dir", str(more)]
    assert main(args) == 0
    assert torch.equal(load(more / "best.pt")["model"]["heads.d2t"], first["heads.d2t"])
    capsys.readouterr()
    generate = ["generate", str(runs[0]), "--prompt", "the", "--max-tokens", "12"]
    generate += ["--temperature", "0"]
    assert main(generate) == 0
    greedy = capsys.readouterr().out
    assert main([*generate, "--speculative", "heads"]) == 0
    assert capsys.readouterr().out == greedy
    # bad input: K beyond the vocabulary
    too_many = ["--heads-kind", "eagle", "--heads-set", f"draft_vocab={len(vocab) + 1}"]
    bad = tmp_path / "bad"
    rc = main([*base, "--steps", "2", *too_many, "--run-dir", str(bad)])
    assert_one_error(capsys, rc, f"draft_vocab = {len(vocab) + 1} exceeds the vocabulary's")
    assert not bad.exists()
