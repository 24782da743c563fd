"""``targetlm export --format speculators | medusa``: a run's drafting heads as a serving engine
loads them beside their verifier.

The eagle heads are loaded back by the ``speculators`` package's own Eagle3 model
(``Eagle3DraftModel.from_pretrained`` of the export, its verifier weights read from the named
verifier directory), and its draft logits for a batch equal ours at every step; those tests
skip where the library is not installed (``bash scripts/setup.sh --serve`` installs it in
``.venv/serve``). The medusa heads are read as vLLM's Medusa model computes them. Bad input
(a run without an hf backbone or without drafting heads, heads with no such form, a draft
vocabulary larger than the vocabulary, an unknown ``--format``, a verifier that is not the
run's body) is one line and writes nothing.

Every model here is a tiny random Llama (2 layers, d = 32, grouped-query attention, tied
embeddings) written locally: no download.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from targetlm.cli import main  # noqa: E402
from targetlm.config import ComponentConfig, Config, ModelConfig  # noqa: E402
from targetlm.modules.hf import export as export_hf  # noqa: E402
from targetlm.modules.model import build_model  # noqa: E402
from targetlm.modules.serving import draft_checkpoint, export_drafter  # noqa: E402
from targetlm.registry import ConfigError  # noqa: E402

V, D = 300, 32
EAGLE = {"n": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "ff_size": 48, "window": 16}

try:
    import speculators  # noqa: F401

    SPECULATORS = None
except ImportError as error:
    SPECULATORS = f"speculators is not installed ({error}): bash scripts/setup.sh --serve"
needs_speculators = pytest.mark.skipif(SPECULATORS is not None, reason=SPECULATORS or "")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny random Llama as ``save_pretrained`` writes it."""
    directory = tmp_path_factory.mktemp("serve") / "base"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def model_with(base: Path, kind: str, seed: int = 1, **options):
    """A model over ``base`` with ``kind`` heads whose weights are all random (an untrained
    head starts as the identity, which would hide a misplaced tensor), in eval mode."""
    config = ModelConfig(
        backbone=ComponentConfig("hf", {"path": str(base)}),
        heads=ComponentConfig(kind, options),
    )
    torch.manual_seed(seed)
    model = build_model(config, V).eval()
    with torch.no_grad():
        for parameter in model.heads.parameters() if model.heads is not None else []:
            parameter.add_(torch.randn_like(parameter) * 0.2)
    return model


def _eagle(base: Path, draft_vocab: int | None):
    options = dict(EAGLE, **({"draft_vocab": draft_vocab} if draft_vocab else {}))
    model = model_with(base, "eagle", **options)
    with torch.no_grad():  # a final norm that is not all ones: input_norm must carry it
        model.encoder.body.norm.weight.mul_(1 + 0.5 * torch.rand(D))
        if draft_vocab:
            ids = torch.sort(
                torch.randperm(V, generator=torch.Generator().manual_seed(2))[:draft_vocab]
            )
            model.heads.set_draft_vocabulary(ids.values)
    return model


def _our_draft_logits(model, ids: torch.Tensor, columns: int) -> list[torch.Tensor]:
    """Step k's logits over the draft vocabulary at columns 0..T−1 (teacher-forced on ``ids``,
    as the heads train), and the body's last-layer states before its final norm."""
    with torch.no_grad():
        hidden = model(ids[:, :columns]).main  # x̂ = the body's normalised last state
        weight, _ = model.output()
        words = weight[ids[:, 1:]]
        steps = model.heads.reconstruct(model.heads(hidden), words)
        draft = model.heads.draft_ids(weight.size(0))
        return [model.logits(s)[..., slice(None) if draft is None else draft] for s in steps]


def _pre_norm_state(model, ids: torch.Tensor) -> torch.Tensor:
    grabbed = []
    body = model.encoder.body
    hook = body.norm.register_forward_hook(lambda m, i, o: grabbed.append(i[0]))
    try:
        with torch.no_grad():
            body(input_ids=ids)
    finally:
        hook.remove()
    return grabbed[0]


def _speculators_draft_logits(directory: Path, hidden, ids, steps: int) -> list[torch.Tensor]:
    """The logits of speculators' model of ``directory`` (an Eagle3DraftModel) at each step:
    its forward teacher-forced on ``ids`` (B = 1), read where its lm_head writes them."""
    from speculators import SpeculatorModel, SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel

    # the library's generic entry points pick the model from config.json
    config = SpeculatorModelConfig.from_pretrained(str(directory))
    # dense attention masks on the CPU (flex attention's block masks want 128-token blocks)
    config.transformer_layer_config._attn_implementation = "eager"
    draft = SpeculatorModel.from_pretrained(str(directory), config=config).eval()
    assert isinstance(draft, Eagle3DraftModel)
    captured: list[torch.Tensor] = []
    hook = draft.lm_head.register_forward_hook(lambda m, i, o: captured.append(o))
    try:
        with torch.no_grad():
            tokens = draft(
                hidden_states=hidden,
                input_ids=ids,
                document_ids=torch.zeros_like(ids),
                ttt_steps=steps,
            )
    finally:
        hook.remove()
    assert len(tokens) == steps and len(captured) == steps
    return captured


@needs_speculators
@pytest.mark.parametrize("draft_vocab", [None, 40])
def test_eagle_heads_load_in_speculators_and_draft_our_logits(base, tmp_path, draft_vocab):
    """The export loads with speculators' own classes; its draft logits at each of the 3 steps,
    for every column of a 10-token text (shorter than the head's window of 16: the Eagle3 model
    attends over the whole prefix), equal ours to 1e-5 (float32; measured 2e-7)."""
    model = _eagle(base, draft_vocab)
    verifier = tmp_path / "verifier"
    export_hf(model, None, verifier)
    out = tmp_path / "draft"
    config = export_drafter(model, "speculators", str(verifier), ["LlamaForCausalLM"], out)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert config["speculators_model_type"] == "eagle3"
    assert config["draft_vocab_size"] == (draft_vocab or V)
    ids = torch.randint(0, V, (1, 14), generator=torch.Generator().manual_seed(3))
    T, steps = 10, 3
    ours = _our_draft_logits(model, ids, T)
    hidden = _pre_norm_state(model, ids[:, :T])
    theirs = _speculators_draft_logits(out, hidden, ids[:, 1 : T + 1], steps)
    for k in range(steps):  # step k+1 at column t reads the word t+k+1: columns < T − k
        torch.testing.assert_close(theirs[k][:, : T - k], ours[k][:, : T - k], atol=1e-5, rtol=0)
        assert ours[k].abs().max() > 0.1  # not a vanishing comparison
    if draft_vocab:  # speculators' draft index + d2t[index] is our target id
        from safetensors.torch import load_file

        stored = load_file(str(out / "model.safetensors"))
        target = torch.arange(draft_vocab) + stored["d2t"]
        assert torch.equal(target, model.heads.draft_ids(V))
        assert torch.equal(stored["t2d"].nonzero()[:, 0], target)


def _write_run_config(path: Path, model: Path, heads: str, options: str) -> Path:
    path.write_text(
        f"""
[data]
name = "synthetic"
tokenizer = "hf"
tokenizer_file = "{model}"
batch_size = 4
bptt = 8
[data.synthetic]
train_sentences = 40
valid_sentences = 4
test_sentences = 4
[model.backbone]
kind = "hf"
path = "{model}"
[model.heads]
kind = "{heads}"
{options}
[train]
optimizer = "adamw"
lr = 0.003
max_steps = 1
carry_state = false
progress = false
threads = 1
[eval]
batch_size = 4
""",
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def eagle_run(tmp_path_factory) -> tuple[Path, Path]:
    """A trained hf run (one step: the body fine-tuned too) with eagle heads, over a tiny Llama
    with its own byte-level BPE tokenizer."""
    from conftest import byte_level_bpe

    root = tmp_path_factory.mktemp("eagle-run")
    lines = [f"the cat number {i} sat on the mat" for i in range(40)]
    tokenizer = byte_level_bpe(lines)
    base = root / "base"
    base.mkdir()
    tokenizer.save(str(base / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=D,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(base)
    options = "\n".join(f"{k} = {v}" for k, v in EAGLE.items())
    run_config = _write_run_config(root / "c.toml", base, "eagle", options)
    run = root / "run"
    assert main(["train", str(run_config), "--run-dir", str(run)]) == 0
    return run, base


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("targetlm: error:") and "\n" not in err and "Traceback" not in err
    return err


def test_export_speculators_through_the_cli_names_the_run_exported_as_its_verifier(
    eagle_run, tmp_path, capsys
):
    """The run's body was fine-tuned, so its backbone path is not the verifier: export refuses
    it by default, takes the run's own --format hf export as --verifier, and refuses a
    verifier whose weights are another model's."""
    run, base = eagle_run
    out = tmp_path / "draft"
    assert main(["export", str(run), "--output", str(out), "--format", "speculators"]) == 2
    assert "fine-tuned" in _one_error_line(capsys) and not out.exists()
    assert main(["export", str(run), "--output", str(out), "--format", "speculators",
                 "--verifier", str(base)]) == 2  # fmt: skip
    assert "not the run's backbone's" in _one_error_line(capsys) and not out.exists()
    verifier = tmp_path / "verifier"
    assert main(["export", str(run), "--output", str(verifier)]) == 0
    assert main(["export", str(run), "--output", str(out), "--format", "speculators",
                 "--verifier", str(verifier)]) == 0  # fmt: skip
    assert "3 drafted tokens a step" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(verifier.resolve())
    assert config["eagle_aux_hidden_state_layer_ids"] == [2]  # the last layer's state
    if SPECULATORS is None:  # speculators reads the CLI's export and drafts the run's logits
        from targetlm.runs import load_run

        _, _, model, _ = load_run(run)
        model.eval()
        ids = torch.randint(0, model.output()[0].size(0), (1, 12))
        ours = _our_draft_logits(model, ids, 8)
        hidden = _pre_norm_state(model, ids[:, :8])
        theirs = _speculators_draft_logits(out, hidden, ids[:, 1:9], 3)
        for k in range(3):
            torch.testing.assert_close(
                theirs[k][:, : 8 - k], ours[k][:, : 8 - k], atol=1e-5, rtol=0
            )


def test_an_unchanged_body_is_its_own_verifier(base, tmp_path, capsys, monkeypatch):
    """Heads trained on a frozen body (train-heads): the backbone's path is the verifier."""
    import targetlm.runs

    model = model_with(base, "medusa", n=3)
    config = Config(model=ModelConfig(backbone=ComponentConfig("hf", {"path": str(base)})))
    monkeypatch.setattr(targetlm.runs, "load_run", lambda *a, **k: (config, None, model, None))
    out = tmp_path / "draft"
    assert main(["export", "run", "--output", str(out), "--format", "medusa"]) == 0
    assert "2 drafted tokens a step" in capsys.readouterr().out
    written = json.loads((out / "config.json").read_text())["verifier"]
    assert written == {"name_or_path": str(base.resolve()), "architectures": ["LlamaForCausalLM"]}
    # the verifier's own directory is an input: never written over
    assert main(["export", "run", "--output", str(base), "--format", "medusa", "--force"]) == 2
    assert "is an input of this command" in _one_error_line(capsys)


def _body_is(model, directory: Path) -> bool:
    from targetlm.modules.serving import same_weights

    return same_weights(model, directory)


def test_same_weights_tells_the_backbone_it_was_built_from(base, tmp_path):
    model = model_with(base, "medusa", n=3)
    assert _body_is(model, base)
    with torch.no_grad():
        model.encoder.body.layers[0].mlp.up_proj.weight[0, 0] += 1e-3
    assert not _body_is(model, base)
    assert not _body_is(model, tmp_path)  # no safetensors there


def test_medusa_heads_in_vllms_layout_compute_our_logits(base, tmp_path):
    """vLLM's Medusa: head h is ``x + SiLU(W x + b)`` per layer over the verifier's last
    hidden state, read by ``lm_heads.0`` (original_lm_head); computed here from the exported
    tensors and config alone, it equals our heads' logits."""
    from safetensors.torch import load_file

    model = model_with(base, "medusa", n=4, num_layers=2)
    out = tmp_path / "medusa"
    config = export_drafter(model, "medusa", str(base), ["LlamaForCausalLM"], out)
    stored = load_file(str(out / "model.safetensors"))
    read = json.loads((out / "config.json").read_text())
    assert read == config and read["num_heads"] == 3 and read["num_hidden_layers"] == 2
    ids = torch.randint(0, V, (2, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        prediction = model(ids)
        ours = [model.logits(h) for h in model.heads.reconstruct(prediction.heads, None)]
        hidden = prediction.main
        for h in range(read["num_heads"]):
            x = hidden
            for layer in range(read["num_hidden_layers"]):
                w, b = (
                    stored[f"blocks.{h}.layers.{layer}.weight"],
                    stored[f"blocks.{h}.layers.{layer}.bias"],
                )
                x = x + torch.nn.functional.silu(x @ w.T + b)
            torch.testing.assert_close(
                x @ stored["lm_heads.0.weight"].T, ours[h], atol=1e-5, rtol=0
            )


@pytest.mark.parametrize(
    ("kind", "options", "message"),
    [
        (
            "mtp",
            {"n": 3, "num_attention_heads": 4, "window": 4},
            "the mtp heads have no exact form",
        ),
        ("wdr", {"n": 3}, "speculators has no model for"),
        ("none", {}, "no drafting heads"),
    ],
)
def test_heads_without_a_speculators_form_are_one_line_and_nothing_written(
    base, tmp_path, kind, options, message
):
    model = model_with(base, kind, **options)
    out = tmp_path / "draft"
    with pytest.raises(ConfigError, match=message) as error:
        export_drafter(model, "speculators", str(base), [], out)
    assert "\n" not in str(error.value) and not out.exists()


def test_a_draft_vocabulary_larger_than_the_vocabulary_is_one_line_and_nothing_written(
    base, tmp_path
):
    model = model_with(base, "eagle", **EAGLE, draft_vocab=V + 5)
    out = tmp_path / "draft"
    with pytest.raises(ConfigError, match="does not fit") as error:
        export_drafter(model, "speculators", str(base), [], out)
    assert "\n" not in str(error.value) and not out.exists()


def test_medusa_format_takes_medusa_heads_only(base):
    with pytest.raises(ConfigError, match="holds medusa heads"):
        draft_checkpoint(model_with(base, "wdr", n=3), "medusa", "v", [])
    with pytest.raises(ConfigError, match="--format medusa"):
        draft_checkpoint(model_with(base, "medusa", n=3), "speculators", "v", [])


def test_bad_export_input_through_the_cli_is_one_line_and_writes_nothing(
    base, tmp_path, capsys, monkeypatch
):
    """An unknown --format, a run without an hf backbone, a run without drafting heads:
    exit 2, one line, no --output."""
    import targetlm.runs

    out = tmp_path / "out"
    assert main(["export", str(tmp_path), "--output", str(out), "--format", "onnx"]) == 2
    assert "invalid choice: 'onnx'" in _one_error_line(capsys) and not out.exists()

    def run_of(model, backbone: ComponentConfig):
        config = Config(model=ModelConfig(backbone=backbone))
        monkeypatch.setattr(targetlm.runs, "load_run", lambda *a, **k: (config, None, model, None))

    headless = model_with(base, "none")
    run_of(headless, ComponentConfig("hf", {"path": str(base)}))
    assert main(["export", "run", "--output", str(out), "--format", "speculators"]) == 2
    assert "no drafting heads" in _one_error_line(capsys) and not out.exists()
    from conftest import model_config

    lstm = build_model(
        dataclasses.replace(model_config(), heads=ComponentConfig("simple", {"n": 2})), V
    )
    run_of(lstm, ComponentConfig("none", {}))
    assert main(["export", "run", "--output", str(out), "--format", "speculators"]) == 2
    assert "model.backbone.kind = 'hf'" in _one_error_line(capsys) and not out.exists()
    assert main(["export", "run", "--output", str(out), "--verifier", str(base)]) == 2
    assert "--verifier names the verifier" in _one_error_line(capsys) and not out.exists()
