"""What commands write and print: an output is never one of the command's inputs, an existing
one is replaced only with ``--force``, files and export directories get the umask's modes;
progress bars on a terminal only; one clear line for a directory that is not a run, an
offline download, a missing optional package, a pickled hf checkpoint, a high OOV rate."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import urllib.error
import warnings
from pathlib import Path

import pytest
import torch
from conftest import one_error, tiny_config

from targetlm.cli import main
from targetlm.training import Trainer


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("outputs") / "run"
    Trainer(tiny_config(**{"train.max_steps": 2}), path, log=lambda m: None).train()
    torch.set_num_threads(threads)
    return path


@pytest.fixture
def umask():
    """Set a umask for one test (restored after)."""
    previous = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def text_file(tmp_path: Path, text: str = "the cat saw a dog\n", name: str = "text.txt") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- never over an input; --force to replace an output -----------------------------------------


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_translate_refuses_to_write_over_its_input(tmp_path, capsys, force):
    source = text_file(tmp_path, "ein Haus\n")
    rc = main(
        [
            "translate",
            str(tmp_path / "no-run"),
            "--input",
            str(source),
            "--output",
            str(source),
            *force,
        ]
    )
    assert "is an input of this command" in one_error(capsys, rc)
    assert source.read_text(encoding="utf-8") == "ein Haus\n"


def test_translate_refuses_to_write_over_its_reference_through_another_path(tmp_path, capsys):
    source, reference = text_file(tmp_path, "a\n", "src.txt"), text_file(tmp_path, "b\n", "ref.txt")
    link = tmp_path / "sub"
    link.mkdir()
    output = link / ".." / "ref.txt"
    rc = main(["translate", str(tmp_path / "no-run"), "--input", str(source), "--reference", str(reference),
               "--output", str(output), "--force"])  # fmt: skip
    assert "is an input" in one_error(capsys, rc)
    assert reference.read_text(encoding="utf-8") == "b\n"


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_score_refuses_to_write_over_its_input_or_the_run(run, tmp_path, capsys, force):
    text = text_file(tmp_path)
    rc = main(["score", str(run), "--file", str(text), "--out", str(text), *force])
    assert "is an input of this command" in one_error(capsys, rc)
    assert text.read_text(encoding="utf-8") == "the cat saw a dog\n"
    checkpoint = run / "last.pt"
    before = checkpoint.read_bytes()
    rc = main(["score", str(run), "--file", str(text), "--out", str(checkpoint), *force])
    assert "is an input" in one_error(capsys, rc)
    assert checkpoint.read_bytes() == before


def test_score_replaces_an_existing_output_only_with_force(run, tmp_path, capsys):
    text, out = text_file(tmp_path), tmp_path / "scores.jsonl"
    out.write_text("keep me\n", encoding="utf-8")
    rc = main(["score", str(run), "--file", str(text), "--out", str(out)])
    assert one_error(capsys, rc) == f"--out {out}: exists; pass --force to replace it"
    assert out.read_text(encoding="utf-8") == "keep me\n"
    assert main(["score", str(run), "--file", str(text), "--out", str(out), "--force"]) == 0
    assert out.read_text(encoding="utf-8").count('"position"') == 6  # 5 words and <eos>


def test_export_refuses_the_run_directory_itself(run, tmp_path, capsys):
    rc = main(["export", str(run), "--output", str(run), "--force"])
    assert "is an input" in one_error(capsys, rc)
    rc = main(["export", str(run), "--output", str(run.parent), "--force"])  # holds the run
    assert "is an input" in one_error(capsys, rc)


def test_score_refuses_to_write_over_the_config_it_reads(run, tmp_path, capsys):
    config = tmp_path / "quick.toml"  # a config file as RUN_DIR
    shutil.copyfile(run / "config.toml", config)
    before = config.read_bytes()
    text = text_file(tmp_path)
    rc = main(["score", str(config), "--file", str(text), "--out", str(config), "--force"])
    assert "is an input of this command" in one_error(capsys, rc)
    assert config.read_bytes() == before


# what other commands read in a run directory besides what training writes: its learning curve,
# train-heads' heads.json, compare's eval and translate records
READ_BY_OTHERS = ("learning_curve.png", "heads.json", "eval-test.json", "translate-test-k10.json")


@pytest.fixture
def finished(run, tmp_path) -> Path:
    """A copy of ``run`` that also holds the files of READ_BY_OTHERS (records compare reads)."""
    copy = tmp_path / "finished"
    shutil.copytree(run, copy)
    for name in READ_BY_OTHERS:
        (copy / name).write_text('{"ppl": 5.0, "bleu": 1.0}\n', encoding="utf-8")
    return copy


@pytest.mark.parametrize("name", READ_BY_OTHERS)
def test_score_refuses_to_write_over_a_file_other_commands_read(finished, tmp_path, capsys, name):
    target = finished / name
    before = target.read_bytes()
    rc = main(["score", str(finished), "--file", str(text_file(tmp_path)), "--out", str(target),
               "--force"])  # fmt: skip
    assert "is an input of this command" in one_error(capsys, rc)
    assert target.read_bytes() == before


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_compare_plot_never_writes_over_a_compared_runs_file(finished, capsys, force):
    curve = finished / "learning_curve.png"
    before = curve.read_bytes()
    rc = main(["compare", str(finished), "--plot", str(curve), *force])
    assert "is an input of this command" in one_error(capsys, rc)
    assert curve.read_bytes() == before


def test_compare_plot_replaces_an_existing_file_only_with_force(finished, tmp_path, capsys):
    plot = tmp_path / "curves.png"
    plot.write_bytes(b"keep me")
    rc = main(["compare", str(finished), "--plot", str(plot)])
    assert one_error(capsys, rc) == f"--plot {plot}: exists; pass --force to replace it"
    assert plot.read_bytes() == b"keep me"
    assert main(["compare", str(finished), "--plot", str(plot), "--force"]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def not_a_regular_file(tmp_path: Path, kind: str) -> Path:
    """An output path that is a link (to a device, or to a regular file) or a named pipe."""
    path = tmp_path / f"out-{kind}.png"
    if kind == "link-to-device":
        path.symlink_to(os.devnull)
    elif kind == "link-to-file":
        path.symlink_to(text_file(tmp_path, "linked\n", "linked.txt"))
    else:
        os.mkfifo(path)
    return path


def kind_of(path: Path) -> tuple[bool, str | None, int]:
    """(is a link, where it points, file type bits): what must not change."""
    link = os.readlink(path) if path.is_symlink() else None
    return path.is_symlink(), link, path.lstat().st_mode & 0o170000


@pytest.mark.parametrize("kind", ["link-to-device", "link-to-file", "fifo"])
@pytest.mark.parametrize("command", ["score", "translate", "compare"])
def test_an_output_that_is_a_link_or_not_a_regular_file_is_refused(
    finished, tmp_path, capsys, kind, command
):
    out = not_a_regular_file(tmp_path, kind)
    before = kind_of(out)
    text = text_file(tmp_path)
    argv = {
        "score": ["score", str(finished), "--file", str(text), "--out", str(out)],
        "translate": ["translate", str(tmp_path / "no-run"), "--input", str(text),
                      "--output", str(out)],
        "compare": ["compare", str(finished), "--plot", str(out)],
    }[command]  # fmt: skip
    message = one_error(capsys, main([*argv, "--force"]))
    assert message.endswith(("is a symbolic link; refusing to replace it (name the file it "
                             "points to)", "exists and is not a regular file"))  # fmt: skip
    assert kind_of(out) == before
    if kind == "link-to-file":
        assert out.read_text(encoding="utf-8") == "linked\n"


def test_export_refuses_an_output_directory_that_is_a_link(tmp_path, capsys):
    target = tmp_path / "models"
    target.mkdir()
    (target / "keep").write_text("x", encoding="utf-8")
    link = tmp_path / "exported"
    link.symlink_to(target)
    rc = main(["export", str(tmp_path / "no-run"), "--output", str(link), "--force"])
    assert one_error(capsys, rc).endswith("is a symbolic link; refusing to replace it (name the "
                                          "file it points to)")  # fmt: skip
    assert link.is_symlink() and (target / "keep").is_file()


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_outputs_get_the_umasks_mode(run, tmp_path, capsys, umask, mask, mode):
    umask(mask)
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(run), "--file", str(text_file(tmp_path)), "--out", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_an_export_directory_gets_the_umasks_mode(tmp_path, umask, mask):
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from targetlm.config import ComponentConfig, ModelConfig
    from targetlm.modules.hf import export
    from targetlm.modules.model import build_model

    llama = {"model_type": "llama", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 32,
             "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
             "max_position_embeddings": 32}  # fmt: skip
    model = build_model(ModelConfig(backbone=ComponentConfig("hf", {"config": llama})), 40)
    umask(mask)
    target = tmp_path / "exported"
    export(model, None, target)
    assert target.stat().st_mode & 0o777 == 0o777 & ~mask
    assert (target / "config.json").stat().st_mode & 0o777 == 0o666 & ~mask
    # replaced only when asked
    (target / "extra").write_text("x", encoding="utf-8")
    export(model, None, target, replace=True)
    assert not (target / "extra").exists() and (target / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no staging left behind


# --- progress bars ---------------------------------------------------------------------------


def test_eval_shows_a_progress_bar_on_a_terminal_and_not_with_quiet(run, capsys, monkeypatch):
    assert main(["eval", str(run), "--json"]) == 0  # stderr is not a terminal: no bar
    plain = capsys.readouterr()
    assert plain.err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["eval", str(run), "--json"]) == 0
    shown = capsys.readouterr()
    assert "scoring" in shown.err and "tok/s" in shown.err
    assert shown.out == plain.out  # the same numbers
    assert main(["eval", str(run), "--json", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_generate_shows_a_progress_bar_on_a_terminal(run, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    args = ["generate", str(run), "--prompt", "the", "--max-tokens", "5", "--seed", "1"]
    assert main(args) == 0
    shown = capsys.readouterr()
    assert "generating" in shown.err
    assert main([*args, "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out == shown.out


def test_translation_decoding_reports_sentences(capsys):
    from targetlm.inference.progress import showing_progress
    from targetlm.inference.translate import decode_in_batches

    sources = [torch.tensor([1, 2, 3])] * 5
    with showing_progress(True):
        outputs = decode_in_batches(
            torch.nn.Linear(1, 1), sources, lambda s, m, index: [[i] for i in index], 2, "cpu"
        )
    assert outputs == [[i] for i in range(5)]
    assert "translating" in capsys.readouterr().err


# --- messages --------------------------------------------------------------------------------


def test_a_directory_that_is_not_a_run(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    rc = main(["eval", str(tmp_path)])
    assert one_error(capsys, rc) == (
        f"{tmp_path} is not a run directory (no config.toml / last.pt / best.pt)"
    )


def test_an_eval_file_of_blank_lines_is_one_error(run, tmp_path, capsys):
    blank = text_file(tmp_path, "\n" * 10, "blank_lines.txt")
    rc = main(["eval", str(run), "--file", str(blank)])
    assert one_error(capsys, rc) == f"{blank} has no words (only blank lines): nothing to evaluate"


def test_a_high_oov_rate_is_said_in_the_printed_line(run, tmp_path, capsys):
    known = text_file(tmp_path, "the the the the\n", "known.txt")
    assert main(["eval", str(run), "--file", str(known)]) == 0
    assert "(high" not in capsys.readouterr().out
    unknown = text_file(tmp_path, "zzq xxv qqw the\n", "unknown.txt")
    assert main(["eval", str(run), "--file", str(unknown)]) == 0
    line = capsys.readouterr().out
    assert "OOV rate 60.00% (high, over 10%: 60.00% of the tokens are out of the vocabulary" in line
    assert "mostly" not in line and "try --lowercase or --open-vocab" in line
    # the perplexity over the known words, as targetlm score computes it
    assert main(["eval", str(run), "--file", str(unknown), "--json"]) == 0
    known_ppl = json.loads(capsys.readouterr().out)["ppl_known"]
    assert f"known words only: ppl {known_ppl:.2f}" in line
    out = tmp_path / "scores.jsonl"
    assert main(["score", str(run), "--file", str(unknown), "--out", str(out)]) == 0
    assert f"known words only: ppl {known_ppl:.2f}" in capsys.readouterr().out
    # an option already given is not suggested
    assert main(["eval", str(run), "--file", str(unknown), "--open-vocab", "--lowercase"]) == 0
    line = capsys.readouterr().out
    assert "new words, scored by their spelling" in line
    assert "(high, over 10%" in line and "try" not in line


def test_an_offline_download_names_the_url_it_tried(tmp_path, capsys, monkeypatch):
    from targetlm.data.catalogue import DATASETS

    def offline(url, timeout):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    rc = main(["data", "download", "ptb", "--dir", str(tmp_path / "ptb")])
    message = one_error(capsys, rc)
    url = next(iter(DATASETS["ptb"].files.values())).url
    assert message == f"download of {url} failed: [Errno -3] Temporary failure in name resolution"


def test_a_failed_download_removes_the_folders_it_created(tmp_path, capsys, monkeypatch):
    def offline(url, timeout):
        raise urllib.error.URLError("offline")

    monkeypatch.setattr("urllib.request.urlopen", offline)
    (tmp_path / "kept").mkdir()
    rc = main(
        ["data", "download", "ptb", "--dir", str(tmp_path / "kept" / "new" / "deeper" / "ptb")]
    )
    one_error(capsys, rc)
    assert sorted(tmp_path.rglob("*")) == [tmp_path / "kept"]  # the folder that was there stays


def test_tsne_without_scikit_learn_says_how_the_readme_installs_it(monkeypatch):
    from targetlm.analysis.tsne import target_tsne
    from targetlm.data import DataError

    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.manifold", None)
    with pytest.raises(DataError, match=r'pip install -e "\.\[analysis\]"'):
        target_tsne(torch.zeros(5, 2), torch.tensor([0, 1, 2]), [0])
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert 'pip install -e ".[analysis]"' in readme


class _Payload:
    """Unpickling it writes a file: proof that a pickle was loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "loaded"))


def test_an_hf_directory_with_a_pickled_checkpoint_is_one_line(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    from targetlm.config import ComponentConfig, ModelConfig
    from targetlm.modules.model import build_model
    from targetlm.registry import ConfigError

    directory = tmp_path / "pickled"
    transformers.LlamaConfig(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    ).save_pretrained(directory)  # fmt: skip
    marker = tmp_path / "marker"
    (directory / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(ConfigError) as info:
        build_model(ModelConfig(backbone=ComponentConfig("hf", {"path": str(directory)})), 40)
    assert str(info.value).endswith(
        f"{directory}: only safetensors weights are read (model.safetensors); "
        "pytorch_model.bin is a pickle and is never loaded"
    )
    assert not marker.exists()


def test_an_hf_backbone_reads_without_transformers_deprecation_warnings():
    pytest.importorskip("transformers")
    from targetlm.config import ComponentConfig, ModelConfig
    from targetlm.modules.model import build_model

    llama = {"model_type": "llama", "vocab_size": 40, "hidden_size": 16, "intermediate_size": 32,
             "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
             "max_position_embeddings": 32}  # fmt: skip
    model = build_model(ModelConfig(backbone=ComponentConfig("hf", {"config": llama})), 40).eval()
    tokens = torch.tensor([[1, 2, 3, 4]])
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        first = model(tokens[:, :2])
        second = model(tokens[:, 2:], first.state)  # reads the KV cache of the first two
        whole = model(tokens)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], caught
    assert torch.allclose(second.main, whole.main[:, 2:], atol=1e-5)
