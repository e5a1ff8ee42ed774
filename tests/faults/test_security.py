"""Security faults (issue 15, failure 8): credentials in URLs, raw-record file modes, symlinked
temporary files."""

from __future__ import annotations

import argparse
import os
import stat

import pytest

from panpriv.streamer.commands.cli import _resume_args
from panpriv.streamer.io.recording import RecordingWriter
from panpriv.streamer.io.urls import redact
from panpriv.streamer.state.checkpoint import CheckpointStore
from tests.faults.harness import assert_no_traceback, run_panpriv
from tests.streamer.test_checkpoint import make

PASSWORD = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--source", f"kafka://alice:{PASSWORD}@127.0.0.1:1/t", "--n", "10", "--dim", "2", "--feature-bound", "1"],
        ["run", "--source", f"kafka://alice:{PASSWORD}@127.0.0.1:1/t?group=g", "--n", "10"],  # a config error first
        ["run", "--source", f"kafak://alice:{PASSWORD}@127.0.0.1:1/t", "--n", "10"],  # a bad scheme
        ["run", "--source", f"kafka://alice:{PASSWORD}/x@127.0.0.1:1/t", "--n", "10", "--dim", "2", "--feature-bound", "1"],
        ["record", f"kafka://alice:{PASSWORD}@127.0.0.1:1/t", "rec.bin", "--timeout", "1"],
    ],
)
def test_credentials_are_refused_and_never_printed(argv, tmp_path) -> None:
    argv = [str(tmp_path / a) if a == "rec.bin" else a for a in argv]
    if argv[0] == "run":
        argv += ["--out", str(tmp_path / "out"), "--metrics-port", "0"]
    code, output = run_panpriv(argv, tmp_path, timeout_s=60)
    assert code != 0
    assert_no_traceback(output)
    assert PASSWORD not in output and "alice" not in output
    assert "error" in output


def test_url_credentials_are_refused_before_any_connection(tmp_path) -> None:
    code, output = run_panpriv(
        ["run", "--source", f"kafka://alice:{PASSWORD}@127.0.0.1:1/t", "--n", "10", "--dim", "2", "--feature-bound", "1",
         "--out", str(tmp_path / "out"), "--metrics-port", "0"], tmp_path,
    )
    assert code != 0 and "carries credentials" in output and "unauthenticated" in output
    assert "kafka.conn" not in output  # no connection attempt was made


def test_resume_hint_and_any_text_are_redacted() -> None:
    args = argparse.Namespace(argv=["--source", f"kafka://alice:{PASSWORD}@h:1/t", f"--source=kafka://bob:{PASSWORD}@h:1/t"])
    config = argparse.Namespace(out="out")
    hint = " ".join(_resume_args(args, config))
    assert PASSWORD not in hint and "kafka://***@h:1/t" in hint
    assert redact("x kafka://u:p/a@b@h:1/t?group=g y") == "x kafka://***@h:1/t?group=g y"
    assert redact("kafka://h:1/t?group=g") == "kafka://h:1/t?group=g"


def test_checkpoint_tmp_symlink_is_not_followed(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    store = CheckpointStore(tmp_path / "checkpoints")
    store.directory.mkdir()
    (store.directory / "checkpoint.json.tmp").symlink_to(victim)
    store.save(make(sequence=1))
    assert victim.read_text() == "precious"  # before: the write went through the link (O_TRUNC)
    assert store.load().sequence == 1
    assert not (store.directory / "checkpoint.json.tmp").exists()
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_recording_is_private_and_its_tmp_symlink_is_not_followed(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "rec.bin"
    (tmp_path / "rec.bin.tmp").symlink_to(victim)
    old = os.umask(0o022)
    try:
        writer = RecordingWriter(path, "kafka://h:1/t", ["t/0"], {"t/0": 0}, "2026-01-01T00:00:00+00:00")
        writer.write("t/0", 0, 0, b'{"x": [1], "y": 1}')
        writer.close()
    finally:
        os.umask(old)
    assert victim.read_text() == "precious"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # before: 0644 (world-readable raw records)


@pytest.mark.integration
def test_panpriv_record_writes_a_private_file(kafka_broker, tmp_path) -> None:
    from tests.panpriv_service import produce_json_records

    topic = kafka_broker.create_topic(f"rec-mode-{os.getpid()}-{tmp_path.name[-6:]}", 1)
    produce_json_records(kafka_broker.bootstrap, topic, 20, 2, 1, seed=0)
    path = tmp_path / "topic.rec"
    code, output = run_panpriv(["record", f"kafka://{kafka_broker.bootstrap}/{topic}", str(path)], tmp_path)
    assert code == 0, output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
