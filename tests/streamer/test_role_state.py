"""Every role's state is sealed and locked like the service's checkpoint (streamer/state/role_state.py):
the E-S-A analyzer's ``analyzer.json`` and a scale-out worker's ``worker.json``. Bit flips are
refused with one line, two processes on one state directory are refused with one line. Of the
files panpriv 0.1 (main 0a7b7c3) wrote (tests/streamer/fixtures/role_states_v0_0a7b7c3, written by
that version's code) a worker's still loads and is sealed at once; an analyzer's is refused with one
line naming the migration, as is the sealed state of the same format: it is a state from before
onion-sealed messages and signed batches, whose rounds' messages sit on the messages topic sealed
to the analyzer alone (streamer/esa/analyzer.py, MIGRATION) — the statement of this version would
not hold for them."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey

from panpriv.streamer.commands import esa as esa_commands
from panpriv.streamer.commands.cli import build_parser
from panpriv.streamer.errors import CheckpointError, OutputBusyError
from panpriv.streamer.esa.analyze_service import AnalyzeOptions, load_analyzer, state_file
from panpriv.streamer.esa.families import FAMILIES
from panpriv.streamer.esa.keys import generate
from panpriv.streamer.scaleout.worker import worker_instance, worker_state
from panpriv.streamer.state.role_state import RoleState
from tests.esa.parts import env

FIXTURES = Path(__file__).parent / "fixtures" / "role_states_v0_0a7b7c3"
KEY = PrivateKey(bytes(range(32)))  # the fixtures' analyzer key (any key restores a state: keys open messages only)
ROOT = Path(__file__).resolve().parents[2]


def options(out: Path, learner: str | None = None) -> AnalyzeOptions:
    """What ``panpriv analyze`` passes; ``learner``: the one it builds when ``out`` holds no state
    (through the factory, as ``panpriv analyze --learner LEARNER --dim 3 --batch-size 8`` does)."""
    from panpriv.streamer.budget.open import BudgetSettings

    def no_learner() -> None:
        raise AssertionError("a state to resume: nothing is built")

    build: Any = no_learner
    if learner is not None:
        build = esa_commands.analyzer_learner(build_parser().parse_args([
            "analyze", "--bootstrap", "B", "--shuffled-topic", "s", "--model-topic", "m", "--messages-topic", "msg",
            "--analyzer-key", "k", "--shuffler-verify-key", "v", "--out", str(out), "--learner", learner, "--dim", "3",
            "--batch-size", "8", "--epsilon", "4", "--delta", "1e-5"]))
    return AnalyzeOptions(["127.0.0.1:1"], "shuffled", "model", "messages", [KEY], [], out, build, BudgetSettings())


def new_analyzer_state(out: Path, learner: str) -> None:
    """A sealed ``analyzer.json`` of this version in ``out``: a new analyzer of ``learner``."""
    load_analyzer(state_file(out), options(out, learner))


def assert_refused_naming_the_migration(out: Path, legacy: dict[str, Any]) -> None:
    before = (out / "analyzer.json").read_bytes()
    with pytest.raises(CheckpointError) as refused:
        load_analyzer(state_file(out), options(out))
    message = str(refused.value)
    assert "\n" not in message and str(out / "analyzer.json") in message and legacy["format"] in message
    assert "onion-sealed messages and signed batches" in message and "starting a new deployment" in message
    assert "--role shuffler" in message and "--shuffler-verify-key" in message
    assert (out / "analyzer.json").read_bytes() == before  # refused, not migrated: the file is left as it was


@pytest.mark.parametrize("learner", list(FAMILIES))
def test_an_analyzer_state_of_panpriv_0_1_is_refused_naming_the_migration(learner: str, tmp_path: Path) -> None:
    """Runtime's v0 migration of analyzer states gives way to issue 34's rule: their messages were
    sealed to the analyzer alone, so no version with onion sealing may resume them."""
    legacy = json.loads((FIXTURES / f"{learner}.json").read_bytes())
    (tmp_path / "analyzer.json").write_bytes((FIXTURES / f"{learner}.json").read_bytes())
    assert_refused_naming_the_migration(tmp_path, legacy)


@pytest.mark.parametrize("learner", list(FAMILIES))
def test_a_sealed_analyzer_state_of_the_format_before_onion_sealing_is_refused(learner: str, tmp_path: Path) -> None:
    """The same state sealed (as the version with role states and without onion sealing wrote it)."""
    legacy = json.loads((FIXTURES / f"{learner}.json").read_bytes())
    state_file(tmp_path).save(legacy)
    assert_refused_naming_the_migration(tmp_path, legacy)


def test_a_worker_state_of_panpriv_0_1_loads_and_is_sealed_at_once(tmp_path: Path) -> None:
    (tmp_path / "worker.json").write_bytes((FIXTURES / "worker.json").read_bytes())
    assert worker_instance(worker_state(tmp_path), "default") == "scaleout:default/worker-0123456789ab"
    assert json.loads((tmp_path / "worker.json").read_bytes())["kind"] == "scaleout-worker"
    assert worker_instance(worker_state(tmp_path), "default") == "scaleout:default/worker-0123456789ab"


def flips(raw: bytes, positions: list[int]) -> list[bytes]:
    out = []
    for position in positions:
        flipped = bytearray(raw)
        flipped[position // 8] ^= 1 << (position % 8)
        out.append(bytes(flipped))
    return out


def refused_or_identical(state: RoleState, original: dict, damaged: bytes) -> bool:
    """A flip is refused with one line, or leaves the parsed content identical (``e`` ↔ ``E`` in a
    float's exponent: harmless by construction, the content is what is used)."""
    state.path.write_bytes(damaged)
    try:
        loaded = state.load()
    except CheckpointError as exc:
        assert "\n" not in str(exc) and str(state.path) in str(exc)
        return True
    return loaded == original


def test_every_bit_flip_of_a_worker_state_is_refused(tmp_path: Path) -> None:
    state = worker_state(tmp_path)
    state.save({"instance": "scaleout:default/worker-0123456789ab"})
    raw = state.path.read_bytes()
    original = state.load()
    assert original is not None
    assert all(refused_or_identical(state, original, damaged) for damaged in flips(raw, list(range(8 * len(raw)))))


@pytest.mark.parametrize("learner", ["shuffle-gaussian", "shuffle-gd", "checkin"])
def test_bit_flips_of_an_analyzer_state_are_refused(learner: str, tmp_path: Path) -> None:
    new_analyzer_state(tmp_path, learner)
    state = state_file(tmp_path)
    raw = state.path.read_bytes()
    original = state.load()
    assert original is not None
    positions = random.Random(learner).sample(range(8 * len(raw)), 3000)
    assert all(refused_or_identical(state, original, damaged) for damaged in flips(raw, positions))


def test_other_files_and_other_versions_are_refused_with_one_line(tmp_path: Path) -> None:
    state = worker_state(tmp_path)
    state.save({"instance": "scaleout:default/worker-0123456789ab"})
    envelope = json.loads(state.path.read_bytes())
    analyzer = state_file(tmp_path)
    analyzer.path.write_bytes(state.path.read_bytes())  # a worker's state where an analyzer's belongs
    with pytest.raises(CheckpointError, match="holds a 'scaleout-worker' state, not a 'esa-analyzer' one"):
        analyzer.load()
    import hashlib

    from panpriv.streamer.state.integrity import canonical

    later = {**envelope, "version": 2}
    later["sha256"] = hashlib.sha256(canonical(later)).hexdigest()
    state.path.write_text(json.dumps(later))
    with pytest.raises(CheckpointError, match="of version 2, written by another panpriv; this one reads version 1"):
        state.load()
    state.path.write_text(json.dumps({"instance": 3, "extra": True}))
    with pytest.raises(CheckpointError, match="not a panpriv scaleout-worker state"):
        state.load()


def panpriv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "panpriv", *args], capture_output=True, text=True, env=env(),
                          cwd=ROOT, timeout=timeout)


def analyze_args(out: Path, keyfile: Path) -> list[str]:
    verify = keyfile.parent / "shuffler"
    generate(verify, "shuffler")
    return ["analyze", "--bootstrap", "127.0.0.1:1", "--shuffled-topic", "s", "--model-topic", "m", "--messages-topic",
            "msg", "--analyzer-key", str(keyfile), "--shuffler-verify-key", str(verify), "--out", str(out), "--dim", "3",
            "--batch-size", "8"]


def worker_args(out: Path) -> list[str]:
    return ["worker", "--bootstrap", "127.0.0.1:1", "--data-topic", "d", "--gradients-topic", "g", "--model-topic", "m",
            "--out", str(out)]


@pytest.fixture
def keyfile(tmp_path: Path) -> Path:
    return generate(tmp_path / "keys", "analyzer").private


@pytest.mark.parametrize("role", ["analyze", "worker"])
def test_two_processes_on_one_state_directory_are_refused_with_one_line(role: str, tmp_path: Path, keyfile: Path) -> None:
    """The second process is refused before it reads the state or reaches a broker; the lock is
    the one ``panpriv run`` holds on its --out (streamer/state/lock.py)."""
    out = tmp_path / "out"
    holder = state_file(out) if role == "analyze" else worker_state(out)
    lock = holder.lock()
    try:
        with pytest.raises(OutputBusyError):
            holder.lock()
        result = panpriv(*(analyze_args(out, keyfile) if role == "analyze" else worker_args(out)))
    finally:
        lock.release()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert "in use by another panpriv process" in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize("role", ["analyze", "worker"])
def test_a_flipped_state_stops_the_role_with_one_line(role: str, tmp_path: Path, keyfile: Path) -> None:
    out = tmp_path / "out"
    if role == "analyze":
        new_analyzer_state(out, "shuffle-gaussian")
        path = out / "analyzer.json"
    else:
        worker_state(out).save({"instance": "scaleout:default/worker-0123456789ab"})
        path = out / "worker.json"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    path.write_bytes(bytes(raw))
    result = panpriv(*(analyze_args(out, keyfile) if role == "analyze" else worker_args(out)))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert str(path) in lines[0] and "Traceback" not in result.stderr
