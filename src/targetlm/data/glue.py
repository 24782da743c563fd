"""GLUE (Wang et al. 2019): where each task's files live, how to read them, how it is scored.

GLUE cannot be downloaded on every machine; the registry says where it comes from, and
:func:`read_glue_split` reads a task's unpacked ``train.tsv`` / ``dev.tsv`` from a local
directory (``data.dir``, or ``$TARGETLM_DATA/glue/<task>``). The archives are the ones the
official download script (``download_glue_data.py``, nyu-mll / W4ngatang) fetches from
``dl.fbaipublicfiles.com/glue/data``; their SHA-256 are those tensorflow_datasets records for
the same archives under their former firebasestorage addresses
(``tensorflow_datasets/url_checksums/glue.txt``; CoLA's was also confirmed by a third party
hashing the fbaipublicfiles file). QQP is now served as ``QQP-clean.zip``, a re-release whose
checksum no source records: it has none here, and a download of it is not verified. MRPC is
built by the script from the SentEval mirror of Microsoft's two files (checksums also from
tensorflow_datasets) and a list of dev pair ids; it is read here once built (``train.tsv`` /
``dev.tsv`` in the script's format).

Metrics: those of the GLUE benchmark, which CrammedBERT reports through the Hugging Face
``glue`` metric (``metrics``: the first is the one a single-number table reports: Matthews
correlation for CoLA, F1 for MRPC and QQP, Spearman for STS-B, accuracy otherwise; MNLI
reports its matched and mismatched dev accuracies).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from targetlm.data.catalogue import Remote
from targetlm.data.vocab import DataError

GLUE_ROOT = "https://dl.fbaipublicfiles.com/glue/data"
SENTEVAL_ROOT = "https://dl.fbaipublicfiles.com/senteval/senteval_data"


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task.

    name: its GLUE name. files: what to fetch (an archive per task; MRPC's raw files).
    sentences: the 0-based TSV columns of the one or two sentences; label: the label's
    column (-1: the last); header: whether the TSV's first line is a header. labels: the
    label strings in class-id order (None: a regression task, STS-B). valid: the dev
    file(s) (MNLI: matched, then mismatched). metrics: as reported, the primary one first.
    """

    name: str
    files: tuple[Remote, ...]
    sentences: tuple[int, ...]
    label: int
    header: bool
    labels: tuple[str, ...] | None
    valid: tuple[str, ...] = ("dev.tsv",)
    metrics: tuple[str, ...] = ("accuracy",)


def _zip(name: str, sha256: str | None) -> tuple[Remote, ...]:
    return (Remote(f"{GLUE_ROOT}/{name}", sha256=sha256),)


GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask(
            "CoLA",
            _zip("CoLA.zip", "f212fcd832b8f7b435fb991f101abf89f96b933ab400603bf198960dfc32cbff"),
            sentences=(3,),
            label=1,
            header=False,
            labels=("0", "1"),
            metrics=("matthews", "accuracy"),
        ),
        GlueTask(
            "SST-2",
            _zip("SST-2.zip", "d67e16fb55739c1b32cdce9877596db1c127dc322d93c082281f64057c16deaa"),
            sentences=(0,),
            label=1,
            header=True,
            labels=("0", "1"),
        ),
        GlueTask(
            "MRPC",
            (
                Remote(
                    f"{SENTEVAL_ROOT}/msr_paraphrase_train.txt",
                    sha256="60a9b09084528f0673eedee2b69cb941920f0b8cd0eeccefc464a98768457f89",
                ),
                Remote(
                    f"{SENTEVAL_ROOT}/msr_paraphrase_test.txt",
                    sha256="a04e271090879aaba6423d65b94950c089298587d9c084bf9cd7439bd785f784",
                ),
            ),
            sentences=(3, 4),
            label=0,
            header=True,
            labels=("0", "1"),
            metrics=("f1", "accuracy"),
        ),
        GlueTask(
            "QQP",
            _zip("QQP-clean.zip", None),
            sentences=(3, 4),
            label=5,
            header=True,
            labels=("0", "1"),
            metrics=("f1", "accuracy"),
        ),
        GlueTask(
            "STS-B",
            _zip("STS-B.zip", "e60a6393de5a8b5b9bac5020a1554b54e3691f9d600b775bd131e613ac179c85"),
            sentences=(7, 8),
            label=9,
            header=True,
            labels=None,
            metrics=("spearman", "pearson"),
        ),
        GlueTask(
            "MNLI",
            _zip("MNLI.zip", "e7c1d896d26ed6caf700110645df426cc2d8ebf02a5ab743d5a5c68ac1c83633"),
            sentences=(8, 9),
            label=-1,
            header=True,
            labels=("contradiction", "entailment", "neutral"),
            valid=("dev_matched.tsv", "dev_mismatched.tsv"),
        ),
        GlueTask(
            "QNLI",
            _zip("QNLIv2.zip", "e634e78627a29adaecd4f955359b22bf5e70f2cbd93b493f2d624138a0c0e5f5"),
            sentences=(1, 2),
            label=3,
            header=True,
            labels=("entailment", "not_entailment"),
        ),
        GlueTask(
            "RTE",
            _zip("RTE.zip", "6bf86de103ecd335f3441bd43574d23fef87ecc695977a63b82d5efb206556ee"),
            sentences=(1, 2),
            label=3,
            header=True,
            labels=("entailment", "not_entailment"),
        ),
        GlueTask(
            "WNLI",
            _zip("WNLI.zip", "ae0e8e4d16f4d46d4a0a566ec7ecceccfd3fbfaa4a7a4b4e02848c0f2561ac46"),
            sentences=(1, 2),
            label=3,
            header=True,
            labels=("0", "1"),
        ),
    )
}


def glue_task(name: str) -> GlueTask:
    """The registry entry of a GLUE task (one clear error listing the names otherwise)."""
    try:
        return GLUE_TASKS[name]
    except KeyError:
        raise DataError(f"unknown GLUE task {name!r}; available: {', '.join(GLUE_TASKS)}") from None


def read_glue_split(task: GlueTask, path: str | Path) -> tuple[list[tuple[str, ...]], list[int]]:
    """The examples of one GLUE TSV file: (the one or two sentences of each, its class id).

    Every malformed line (too few columns, a label outside ``task.labels``) is an error
    naming the file and the line. A regression task (STS-B) has no class ids to read.
    """
    path = Path(path)
    if task.labels is None:
        raise DataError(f"GLUE {task.name} is a regression task: only classification is read")
    if not path.is_file():
        raise DataError(f"{path}: not found (GLUE {task.name}: unpack {task.files[0].url} there)")
    classes = {label: i for i, label in enumerate(task.labels)}
    sentences, labels = [], []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if (task.header and number == 1) or not line.strip():
            continue
        columns = line.split("\t")
        needed = max(*task.sentences, task.label) + 1
        if len(columns) < needed:
            raise DataError(
                f"{path}, line {number}: {len(columns)} columns, GLUE {task.name} needs {needed}"
            )
        label = columns[task.label].strip()
        if label not in classes:
            raise DataError(
                f"{path}, line {number}: label {label!r} is not one of {', '.join(task.labels)}"
            )
        sentences.append(tuple(columns[i] for i in task.sentences))
        labels.append(classes[label])
    return sentences, labels


def _register() -> None:
    """The ``glue`` entry of the dataset registry (``targetlm data download glue``): every
    file with a recorded checksum (QQP-clean.zip has none and is left to the user)."""
    from targetlm.data.catalogue import DATASETS, DatasetSpec

    files = {
        Path(remote.url).name: remote
        for task in GLUE_TASKS.values()
        for remote in task.files
        if remote.sha256 is not None
    }
    DATASETS["glue"] = DatasetSpec(
        "glue",
        "GLUE (Wang et al. 2019): the task archives of the official download script, unpacked "
        "by the user into <dir>/<task>/ (classification tasks read by task.kind = "
        "'classification' with task.glue_task); not obtainable on every machine",
        tuple(GLUE_TASKS),
        files=files,
        describe=describe,
    )


def describe(data_dir: str | None) -> list[str]:
    """``targetlm data info glue``: per task, its metrics, where it comes from and how many
    examples its local train / dev files hold (``data_dir``/<task>, else the glue directory)."""
    from targetlm.data.catalogue import candidate_dirs

    root = Path(data_dir) if data_dir else candidate_dirs("glue", None)[0]
    lines = [f"{'task':<7}{'metrics':<19}{'train':>9}{'dev':>8}  source"]
    for task in GLUE_TASKS.values():
        counts = []
        for file in ("train.tsv", task.valid[0]):
            path = root / task.name / file
            if task.labels is None or not path.is_file():
                counts.append("-")
            else:
                try:
                    counts.append(f"{len(read_glue_split(task, path)[1]):,}")
                except DataError:
                    counts.append("bad")
        checked = "sha256" if all(r.sha256 for r in task.files) else "no checksum"
        lines.append(
            f"{task.name:<7}{'/'.join(task.metrics):<19}{counts[0]:>9}{counts[1]:>8}  "
            f"{task.files[0].url} ({checked})"
        )
    lines.append(f"local files: {root}/<task>/ ('-': absent, or a regression task: not read)")
    return lines


_register()
