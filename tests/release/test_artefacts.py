"""The release artefacts: ``python -m build`` makes an sdist and a wheel that ``twine check``
accepts, the wheel holds plain files (the links in ``panpriv/`` followed), every module, the data
files and every ``py.typed``; the sdist holds each file once and builds the same wheel; and the
wheel, installed with its dependencies into a fresh virtual environment outside the source tree,
runs ``panpriv --help``, a one-record ``panpriv run`` on a file, reads its embedded data set and
runs the README's Python example.

The sources are copied first (the three layers through the links, as in a checkout), so that
building never writes ``build/`` or ``*.egg-info`` into the repository: a stale ``build/lib``
would put modules that no longer exist into a wheel built from the tree. The dependencies come
from the package index, as for a user (pip's cache serves them when it holds them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("accounting", "protocols", "streamer")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
BUILD_TIMEOUT_S = 600
"""Generous: a build installs setuptools into an isolated environment, on a loaded machine."""


def run(argv: list[str | Path], cwd: Path, env: dict[str, str] | None = None, timeout: float = BUILD_TIMEOUT_S) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def tracked(*paths: str) -> list[str]:
    """The repository's files under ``paths`` (git's view: what a clean clone builds from)."""
    return run(["git", "ls-files", "--", *paths], cwd=ROOT).splitlines()


def copy_sources(target: Path) -> Path:
    """The files a build reads, as a clean checkout has them: ``panpriv/`` with its links, the
    three layers, and the top-level files (everything but the folders that are not packaged)."""
    target.mkdir()
    for name in tracked("."):
        if "/" in name or not (ROOT / name).is_file():
            continue
        shutil.copy2(ROOT / name, target / name)
    for name in tracked("panpriv", *LAYERS):
        source, destination = ROOT / name, target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), destination)
        else:
            shutil.copy2(source, destination)
    return target


@pytest.fixture(scope="module")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``python -m build`` (the sdist, then the wheel built from it) and ``python -m build
    --wheel`` (the wheel built from the sources directly)."""
    base = tmp_path_factory.mktemp("release")
    sources = copy_sources(base / "src")
    run([sys.executable, "-m", "build", "--outdir", base / "dist", sources], cwd=base)
    run([sys.executable, "-m", "build", "--wheel", "--outdir", base / "direct", sources], cwd=base)
    (sdist,) = (base / "dist").glob("*.tar.gz")
    (wheel,) = (base / "dist").glob("*.whl")
    (direct,) = (base / "direct").glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "direct": direct, "base": base}


def expected_package_files() -> set[str]:
    """Every file the wheel must hold under ``panpriv/``: the tracked modules and data files of
    the three layers (``streamer/x.py`` → ``panpriv/streamer/x.py``) and ``panpriv/``'s own."""
    files = {f"panpriv/{name}" for name in tracked(*LAYERS)}
    files |= {name for name in tracked("panpriv") if not (ROOT / name).is_symlink()}
    return files


def test_artefacts_are_named_for_the_version_in_pyproject(artefacts: dict[str, Path]) -> None:
    assert artefacts["sdist"].name == f"panpriv-{VERSION}.tar.gz"
    assert artefacts["wheel"].name == artefacts["direct"].name == f"panpriv-{VERSION}-py3-none-any.whl"


def test_twine_check_passes(artefacts: dict[str, Path]) -> None:
    output = run([sys.executable, "-m", "twine", "check", "--strict", artefacts["sdist"], artefacts["wheel"], artefacts["direct"]],
                 cwd=artefacts["base"])
    assert output.count("PASSED") == 3, output


def test_the_wheel_holds_every_module_data_file_and_py_typed_as_plain_files(artefacts: dict[str, Path]) -> None:
    with zipfile.ZipFile(artefacts["wheel"]) as wheel:
        infos = wheel.infolist()
    names = [info.filename for info in infos]
    assert len(names) == len(set(names)), "a file is in the wheel twice"
    links = [info.filename for info in infos if stat.S_ISLNK(info.external_attr >> 16)]
    assert not links, f"symbolic links in the wheel: {links}"
    package = {name for name in names if not name.startswith(f"panpriv-{VERSION}.dist-info/")}
    expected = expected_package_files()
    assert package == expected, f"missing: {sorted(expected - package)}; unexpected: {sorted(package - expected)}"
    # Spelled out, so that the check does not rest on git's list alone.
    assert {f"panpriv/{layer}/py.typed" for layer in LAYERS} | {"panpriv/py.typed"} <= package
    adult = {name for name in package if name.startswith("panpriv/streamer/datasets/adult/")}
    assert {"panpriv/streamer/datasets/adult/adult.data.gz", "panpriv/streamer/datasets/adult/adult.test.gz",
            "panpriv/streamer/datasets/adult/adult.names", "panpriv/streamer/datasets/adult/README.md"} <= adult
    assert not any(name.startswith(LAYERS) for name in names), "a layer installed under its bare folder name"


def test_the_sdist_holds_each_file_once_and_no_links_or_tests(artefacts: dict[str, Path]) -> None:
    with tarfile.open(artefacts["sdist"]) as sdist:
        members = sdist.getmembers()
    prefix = f"panpriv-{VERSION}/"
    names = [member.name.removeprefix(prefix) for member in members if member.isfile()]
    assert len(names) == len(set(names)), "a file is in the sdist twice"
    assert all(member.isfile() or member.isdir() for member in members), "links or special files in the sdist"
    generated = {"PKG-INFO", "setup.cfg"} | {name for name in names if name.startswith("panpriv.egg-info/")}
    shipped = set(names) - generated
    top_level = {"pyproject.toml", "MANIFEST.in", "README.md", "CHANGELOG.md", "LICENSE"}
    expected = expected_package_files() | top_level
    assert shipped == expected, f"missing: {sorted(expected - shipped)}; unexpected: {sorted(shipped - expected)}"


def digests(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: hashlib.sha256(archive.read(name)).hexdigest() for name in archive.namelist() if not name.endswith("/RECORD")}


def test_the_wheel_built_from_the_sdist_is_the_wheel_built_from_the_sources(artefacts: dict[str, Path]) -> None:
    assert digests(artefacts["wheel"]) == digests(artefacts["direct"])


def readme_python_example() -> str:
    """The README's Python example: its first ``python`` code block."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"```python\n(.*?)```", text, re.S)
    assert match, "the README has no Python example"
    return match.group(1)


def test_the_installed_wheel_runs_outside_the_source_tree(artefacts: dict[str, Path], tmp_path: Path) -> None:
    """A fresh venv (no pip of its own: this interpreter's pip installs into it), the wheel built
    from the sdist and its dependencies; then, from a folder outside the repository, the
    commands a new user types first."""
    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    assert ROOT not in tmp_path.parents
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work, timeout=120)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet", artefacts["wheel"]], cwd=work)
    run([sys.executable, "-m", "pip", "--python", python, "check"], cwd=work, timeout=120)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8",
           "PANPRIV_STATE_DIR": str(tmp_path / "state"), "PANPRIV_CACHE_DIR": str(tmp_path / "cache")}

    def in_venv(*argv: str | Path, timeout: float = 120) -> str:
        return run(list(argv), cwd=work, env=env, timeout=timeout)

    where = in_venv(python, "-c", "import panpriv, panpriv.streamer.commands.cli as cli; print(panpriv.__file__); print(cli.__file__)")
    assert all(Path(line).is_relative_to(venv) for line in where.splitlines()), where
    assert in_venv(venv / "bin" / "panpriv", "--version").strip() == f"panpriv {VERSION}"
    assert "usage: panpriv" in in_venv(venv / "bin" / "panpriv", "--help")

    (work / "one.jsonl").write_text('{"x": [0.3, -0.2], "y": 1}\n', encoding="utf-8")
    summary = in_venv(venv / "bin" / "panpriv", "-q", "run", "--source", "file:one.jsonl", "--dim", "2", "--feature-bound", "1",
                      "--metrics-port", "0", "--progress", "off", "--out", "out")
    assert "records learned 1; rejected 0" in summary, summary
    checkpoint = json.loads(in_venv(venv / "bin" / "panpriv", "inspect", "out", "--json"))["checkpoint"]
    assert checkpoint["finished"] and checkpoint["privacy"]["records"] == 1, checkpoint

    shape = in_venv(python, "-c", "from panpriv.streamer.datasets import adult; X, y = adult.load('test'); print(X.shape)")
    assert shape.strip() == "(16281, 105)", shape

    (work / "example.py").write_text(readme_python_example(), encoding="utf-8")
    in_venv(python, "example.py")
