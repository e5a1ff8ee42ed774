"""panpriv.streamer.state.checkpoint: exact round trip, atomic replacement, refusal of changed settings."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyLedger
from panpriv.protocols import checks
from panpriv.streamer.commands.cli import main
from panpriv.streamer.errors import CheckpointError, OutputError
from panpriv.streamer.runtime.learners import restore_learner
from panpriv.streamer.state.checkpoint import Checkpoint, CheckpointStore, check_resumable, decode_value, encode_value, read_manifest
from panpriv.streamer.state.integrity import open_document, seal_document


def make(sequence: int = 1, **changes) -> Checkpoint:
    fields = dict(
        sequence=sequence,
        created=1.0,
        instance="pan-acsa-abc",
        learner="pan-acsa",
        learner_config={"dim": 2, "epsilon": 1.0},
        learner_state={"records": 5, "theta": np.array([0.1, -1e-300]), "grad": np.array([np.pi, 2.0])},
        positions={"t/0": 10, "t/1": 3},
        ledger=PrivacyLedger().to_dict(),
        rejects={"undecodable": 2},
        records=11,
        snapshots=1,
        config_hash="h1",
        privacy_config={"learner.epsilon": 1.0, "learner.delta": 1e-6},
    )
    fields.update(changes)
    return Checkpoint(**fields)


def test_state_arrays_round_trip_bit_exactly(tmp_path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.load() is None
    store.save(make())
    loaded = store.load()
    assert loaded is not None
    np.testing.assert_array_equal(loaded.learner_state["theta"], [0.1, -1e-300])
    assert loaded.learner_state["grad"].tobytes() == np.array([np.pi, 2.0]).tobytes()
    assert loaded.learner_state["grad"].flags.writeable
    assert (loaded.positions, loaded.rejects, loaded.records) == ({"t/0": 10, "t/1": 3}, {"undecodable": 2}, 11)


@pytest.mark.parametrize("value", [np.arange(6, dtype=">i4").reshape(2, 3), np.array([True, False]), np.float32(1.5), float("-inf"), 7, "phase"])
def test_value_encoding(value) -> None:
    with seal_document({"value": encode_value(value)}) as sealed:
        decoded = decode_value(open_document(sealed, "test")["value"])
    if isinstance(value, np.ndarray):
        np.testing.assert_array_equal(decoded, value)
        assert decoded.dtype.isnative
    else:
        assert decoded == value


def test_a_failed_write_leaves_the_previous_manifest(tmp_path, monkeypatch) -> None:
    store = CheckpointStore(tmp_path)
    store.save(make(sequence=1))

    def crash(*args, **kwargs):
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OutputError, match="simulated crash"):
        store.save(make(sequence=2))
    monkeypatch.undo()
    assert store.load().sequence == 1  # the old manifest is intact; the temporary file is removed
    assert not (tmp_path / "checkpoint.json.tmp").exists()
    (tmp_path / "checkpoint.json.tmp").write_text("a leftover of a kill -9")
    store.save(make(sequence=3))  # and the next save replaces a leftover
    assert store.load().sequence == 3
    assert not (tmp_path / "checkpoint.json.tmp").exists()


def test_manifest_never_holds_generator_state_or_nan(tmp_path) -> None:
    store = CheckpointStore(tmp_path)
    with pytest.raises(ValueError):  # allow_nan=False: a NaN would not be valid JSON
        store.save(make(learner_config={"x": float("nan")}))
    with pytest.raises(CheckpointError, match="object array"):
        encode_value(np.array([np.random.default_rng(0)], dtype=object))


def test_unreadable_or_foreign_manifests_are_refused(tmp_path) -> None:
    store = CheckpointStore(tmp_path)
    store.path.write_text("{}")
    with pytest.raises(CheckpointError, match="schema_version None"):
        store.load()
    store.path.write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(CheckpointError, match="not a valid panpriv checkpoint"):
        store.load()


def test_resume_is_refused_naming_each_changed_setting(tmp_path) -> None:
    saved = make()
    check_resumable(saved, "h1", saved.privacy_config, tmp_path)  # unchanged: fine
    with pytest.raises(CheckpointError) as info:
        check_resumable(saved, "h2", {"learner.epsilon": 2.0, "learner.delta": 1e-6, "records.dim": 3}, tmp_path)
    message = str(info.value)
    assert "learner.epsilon: 1.0 in the checkpoint, 2.0 now" in message
    assert "records.dim: '(unset)' in the checkpoint, 3 now" in message
    assert "learner.delta" not in message


OLD_CHECKPOINTS = Path(__file__).parent / "fixtures" / "checkpoints_v0_2ecd321"


@pytest.mark.parametrize("name", ["pan-acsa", "shuffle-sgd"])
def test_checkpoints_written_before_the_learner_catalogue_still_load_and_continue(name: str, tmp_path: Path) -> None:
    """Checkpoints written by commit 2ecd321 (hand-written ``config()``s, before the catalogue and
    servable snapshots): 219 accepted records of a public horizon of 800 (``panpriv run --n 800`` on
    a 400-line file). They load, rebuild the same configuration, and the learner continues."""
    checkpoint = read_manifest(OLD_CHECKPOINTS / f"{name}.json")
    learner = restore_learner(name, checkpoint.learner_config, checkpoint.learner_state, None)
    assert learner.records_seen == checkpoint.records == 219
    added_since = {"batch_rule": "worst-case"} if name == "pan-acsa" else {}  # a new argument, at its default
    assert learner.config() == {**checkpoint.learner_config, **added_since}
    X, y = checks.make_stream(4, 100, binary=True)
    learner.learn_many(X, 2.0 * y - 1.0)
    snapshot = learner.snapshot()
    assert learner.records_seen == 319 and snapshot.records == learner.state_records  # pan-acsa: its last batch boundary
    assert np.all(np.isfinite(snapshot.params)) and snapshot.model is not None
    out = tmp_path / "out" / "checkpoints"
    out.mkdir(parents=True)
    shutil.copy(OLD_CHECKPOINTS / f"{name}.json", out / "checkpoint.json")
    assert main(["inspect", str(tmp_path / "out")]) == 0


CURRENT_MAIN_CHECKPOINTS = Path(__file__).parent / "fixtures" / "checkpoints_v1_c2fd030"
"""One checkpoint per learner, written by commit c2fd030 (the service's defaults then lived in
panpriv.streamer.runtime.learners (then panpriv.streamer.learners); ``tests/streamer/fixtures/checkpoints_v1_c2fd030`` holds the script's
settings: 400 records of d = 4 from a file, ``learner.n`` 800 for the streaming learners, pnsgd
and shuffled-pnsgd with ``eta = 0.5``, shuffle-gd with 3 rounds)."""

ADDED_SINCE_C2FD030 = {
    "pnsgd": {"horizon": None, "schedule": "sordello"},  # the paper's schedule, as then
    "shuffled-pnsgd": {"pan_delta": None, "schedule": "sordello"},
    "shuffle-gd": {"fit_intrusion": False},  # Lemma B.6's split of delta, as then
}
"""Constructor arguments added after c2fd030, with the value that rebuilds the learner of then
(``Learner.legacy_defaults``)."""


@pytest.mark.parametrize("name", sorted(p.stem for p in CURRENT_MAIN_CHECKPOINTS.glob("*.json")))
def test_checkpoints_written_by_c2fd030_restore_the_same_learner_and_continue(name: str) -> None:
    """The defaults moved from the service into the constructors; a checkpoint stores the resolved
    configuration, so it restores the learner it was written by — the same config (plus arguments
    added since, at their old behaviour), the same state, the same report — and learns on."""
    checkpoint = read_manifest(CURRENT_MAIN_CHECKPOINTS / f"{name}.json")
    learner = restore_learner(name, checkpoint.learner_config, checkpoint.learner_state, None)
    assert learner.config() == {**checkpoint.learner_config, **ADDED_SINCE_C2FD030.get(name, {})}
    assert learner.records_seen == checkpoint.records
    saved = dict(checkpoint.learner_state)
    if name == "pan-acsa":  # written at a batch boundary: its open batch was empty, which states no longer hold (issue 32)
        assert saved.pop("filled") == 0 and not np.any(saved.pop("grad"))
    checks._assert_states_equal(learner.state_dict(), saved, "restored")
    registered = checkpoint.ledger["instances"].get(checkpoint.instance)  # shuffle-gd registers per round
    if registered is not None:
        assert learner.privacy().to_dict()["output"] == registered["output"]
    if name in ("shuffled-pnsgd", "shuffle-gd"):
        return  # their passes are complete: nothing more to learn
    X, y = checks.make_stream(4, 100, binary=True)
    learner.learn_many(X, 2.0 * y - 1.0)
    assert learner.records_seen == checkpoint.records + 100 and np.all(np.isfinite(learner.snapshot().params))
def test_a_replaced_manifest_is_overwritten_with_zeros_unless_another_name_keeps_it(tmp_path) -> None:
    """os.replace leaves the old manifest's blocks on the disk: the store zeroes the replaced file once
    the new one is durable (read here through a descriptor opened before the replacement), but
    not a file that a hard link (a user's backup) still names."""
    store = CheckpointStore(tmp_path)
    store.save(make(sequence=1))
    held = os.open(store.path, os.O_RDONLY)
    try:
        store.save(make(sequence=2))
        replaced = os.pread(held, 1 << 20, 0)
        assert replaced and not replaced.strip(b"\0")
    finally:
        os.close(held)
    backup = tmp_path / "backup.json"
    os.link(store.path, backup)
    store.save(make(sequence=3))
    assert read_manifest(backup).sequence == 2  # the backup is intact
    assert store.load().sequence == 3


def test_a_document_of_many_arrays_round_trips_and_the_copies_made_to_seal_it_are_zeroed(monkeypatch) -> None:
    """Twelve arrays (placeholder 1 is a prefix of placeholders 10 and 11: an alternation of the
    placeholders refused such a document), a string shaped like a placeholder (text, not an array),
    and the little-endian copy made of a big-endian array zeroed once sealed."""
    from panpriv.streamer.state import integrity

    state = {f"a{k}": np.full(3, float(k)) for k in range(11)} | {"big": np.arange(4, dtype=">f8")}
    made: list[np.ndarray] = []
    contiguous = np.ascontiguousarray

    def recording(array, dtype=None):  # the copies _skeleton makes, to look at them after sealing
        result = contiguous(array, dtype=dtype)
        made.append(result)
        return result

    monkeypatch.setattr(integrity.np, "ascontiguousarray", recording)
    lookalike = "\x00" + "0" * 16 + ":1"
    with seal_document({"learner": {"state": state}, "note": lookalike}) as sealed:
        body = open_document(sealed, "test")
    monkeypatch.undo()
    for name, array in state.items():
        np.testing.assert_array_equal(body["learner"]["state"][name], array)
    assert body["note"] == lookalike
    copies = [array for array in made if not any(np.shares_memory(array, original) for original in state.values())]
    assert len(copies) == 1 and not copies[0].any()  # the big-endian array's copy, zeroed


def test_sealing_leaves_no_copy_of_the_state_in_python_strings(tmp_path) -> None:
    """The manifest's arrays never become Python text: seal_document encodes them straight into the
    buffer it returns, and open_document decodes them from it (the base64 matches base64.b64encode)."""
    import base64

    state = {"theta": np.array([0.1, -2.5, np.pi]), "units": np.array([3, -7], dtype=np.int64)}
    with seal_document({"learner": {"state": state}, "n": 3}) as sealed:
        text = bytes(sealed.view())
        assert base64.b64encode(state["theta"].tobytes()) in text
        body = open_document(sealed, "test")
    np.testing.assert_array_equal(body["learner"]["state"]["theta"], state["theta"])
    assert body["learner"]["state"]["units"].dtype == np.int64 and body["n"] == 3
