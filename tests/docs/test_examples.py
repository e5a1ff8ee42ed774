"""The documentation's examples work as written: every ``panpriv`` command of a shell block is
accepted by the CLI's parser, every TOML example is a valid configuration, and the Python examples
run (the README's, and those of the Python API guide, in order, after the run they read)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from panpriv.streamer.commands.cli import build_parser
from panpriv.streamer.config import ServiceConfig
from tests.docs.pages import DOCS, ROOT, code_blocks, pages, panpriv_commands

COMMANDS = [(page.relative_to(ROOT).as_posix(), command) for page in pages()
            for block in code_blocks(page, "sh") for command in panpriv_commands(block)]


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) > 30 and {page for page, _ in COMMANDS} >= {
        "README.md", "docs/getting-started.md", "docs/how-to/kafka.md", "docs/how-to/esa.md", "docs/how-to/scale-out.md",
        "docs/how-to/replay.md", "docs/how-to/reports.md", "docs/how-to/python.md"}


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{page}:{' '.join(command)[:60]}" for page, command in COMMANDS])
def test_every_documented_command_parses(page: str, command: list[str]) -> None:
    try:
        build_parser().parse_args(command)
    except SystemExit as exc:  # --help exits 0: accepted
        if exc.code in (0, None):
            return
        pytest.fail(f"{page}: `panpriv {' '.join(command)}` is refused by the parser (exit {exc.code})")


TOML = [(page.relative_to(ROOT).as_posix(), block) for page in pages() for block in code_blocks(page, "toml")]


@pytest.mark.parametrize(("page", "block"), TOML, ids=[page for page, _ in TOML])
def test_every_configuration_example_is_valid(page: str, block: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Valid as written, once the files it names exist (the settings check that they do) and the
    password variable its command sets is set."""
    monkeypatch.setenv("KAFKA_PASSWORD", "set-as-the-page-shows")
    for name in ("kafka-ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("")
    ServiceConfig.model_validate(tomllib.loads(block.replace("/etc/panpriv/", f"{tmp_path}/")))


def test_the_readme_python_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's Python example (the release test runs it again from the installed wheel)."""
    (example,) = code_blocks(ROOT / "README.md", "python")
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out
    assert "accuracy 0." in printed and "(ε = 1, δ = 1e-06)" in printed


@pytest.mark.slow
def test_the_python_guide_runs_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/how-to/python.md: its one ``panpriv run`` writes the snapshots its later blocks read."""
    guide = DOCS / "how-to" / "python.md"
    ((run,),) = [panpriv_commands(block) for block in code_blocks(guide, "sh")]
    subprocess.run([sys.executable, "-m", "panpriv", *run], cwd=tmp_path, check=True, capture_output=True,
                   env={**os.environ, "PANPRIV_STATE_DIR": str(tmp_path / "state")}, timeout=300)
    script = tmp_path / "guide.py"
    script.write_text("\n".join(code_blocks(guide, "python")), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(script), run_name="__main__")
    assert namespace["served"].records == 20_000 and namespace["report"].records == 20_000


EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_every_example_is_listed() -> None:
    listed = (ROOT / "examples" / "README.md").read_text()
    assert EXAMPLES and all(f"`{script.name}`" in listed for script in EXAMPLES)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_the_examples_run_from_outside_the_tree(script: Path, tmp_path: Path) -> None:
    """Each script of ``examples/`` runs as a user runs it (another folder, a budget store it makes
    itself) and prints what its docstring promises."""
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PANPRIV_STATE_DIR": str(tmp_path / "not-used")})
    assert done.returncode == 0, done.stderr[-3000:]
    if script.name == "learn_and_compare.py":
        scores = {line.split(":")[0]: float(line.split("AUC ")[1].split(";")[0]) for line in done.stdout.splitlines()}
        assert set(scores) == {"pan-acsa", "pan-ftrl"} and min(scores.values()) > 0.8, done.stdout
    if script.name == "budget_across_runs.py":
        assert "events.csv: pan-acsa: after 2000 records, everything released is (ε = 2, δ = 2e-06)" in done.stdout
        assert "exits 3" in done.stdout and "used by pan-acsa-" in done.stdout
        assert not (tmp_path / "not-used").exists(), "the example used a store other than its own"
