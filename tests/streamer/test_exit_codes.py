"""One exit-code table for every command (streamer/commands/exit_codes.py): 0 done, 1 operational
error, 2 usage or configuration, 3 budget refusal, 4 a scale-out plan that cannot complete — each with
one line on stderr, never a traceback.

Where a code of a command is tested elsewhere (a real process against the real broker), the test
named here is that test: ``run`` 3 (tests/streamer/test_budget.py, test_refusal_is_one_line_and_exit_3),
``analyze`` 3 (tests/esa/test_esa_service.py), ``analyze``/``worker`` 1 and 2 for a busy or
corrupted state directory (tests/streamer/test_role_state.py), ``shuffle``/``coordinate`` 2 for a
topic they cannot serve (tests/streamer/test_topics.py), ``dev-broker`` 2 for a busy port
(tests/streamer/test_dev_broker.py), ``coordinate`` 4 (tests/scaleout/test_scaleout_stall.py), every
command's 0 in its own tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from panpriv.streamer.commands.cli import build_parser, main
from panpriv.streamer.commands.exit_codes import EXIT_BUDGET, EXIT_FAILURE, EXIT_OK, EXIT_STALLED, EXIT_USAGE, exit_code
from panpriv.streamer.errors import PlanStalled
from tests.esa.parts import env
from tests.realparts import KafkaBroker

ROOT = Path(__file__).resolve().parents[2]


def commands() -> list[str]:
    parser = build_parser()
    return sorted(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


def test_the_table_has_the_four_codes_of_the_issue() -> None:
    assert (EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_BUDGET) == (0, 1, 2, 3)


def test_a_plan_that_cannot_complete_has_its_own_code() -> None:
    """Not 1: restarting the coordinator at once does not help (issue 35)."""
    assert EXIT_STALLED == 4 and exit_code(PlanStalled("the plan cannot complete")) == EXIT_STALLED


@pytest.mark.parametrize("command", commands())
def test_every_command_refuses_a_bad_flag_with_2(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, "create"] if command == "topics" else [command]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--no-such-flag"])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "usage: panpriv" in err and "error:" in err and "Traceback" not in err


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("panpriv ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


SCENARIOS: list[tuple[str, Callable[[Path], list[str]], int, str]] = [
    ("run", lambda tmp: ["run", "--source", f"file:{tmp / 'missing.jsonl'}", "--dim", "3", "--feature-bound", "1",
                         "--out", str(tmp / "o")],
     EXIT_FAILURE, "missing.jsonl"),
    ("run", lambda tmp: ["run", "--learner", "pnsgd", "--source", "synthetic:n=100&dim=3", "--dim", "3",
                         "--feature-bound", "1", "--set", "etaa=0.1", "--out", str(tmp / "o")], EXIT_USAGE, "etaa"),
    ("privacy", lambda tmp: ["privacy", "--learner", "pnsgd", "--options", "{\"etaa\": 0.1}"], EXIT_USAGE, "etaa"),
    ("inspect", lambda tmp: ["inspect", str(tmp / "nothing")], EXIT_USAGE, "does not exist"),
    ("report", lambda tmp: ["report", str(tmp)], EXIT_USAGE, "no snapshots.jsonl"),
    ("predict", lambda tmp: ["predict", "--snapshot", str(tmp / "s.jsonl"), "--source", "adult:test"], EXIT_USAGE, "no such file"),
    ("keygen", lambda tmp: ["keygen", str(tmp / "a-file")], EXIT_FAILURE, "a-file"),
    ("budget", lambda tmp: ["budget", "--state-dir", str(tmp / "garbage")], EXIT_FAILURE, "budget store"),
    # A file given as the state directory is a configuration error, not an empty store (it printed "empty", exit 0).
    ("budget", lambda tmp: ["budget", "--state-dir", str(tmp / "a-file")], EXIT_USAGE, "is not a directory"),
    ("run", lambda tmp: ["run", "--source", "synthetic:n=100&dim=3", "--dim", "3", "--feature-bound", "1",
                         "--state-dir", str(tmp / "a-file"), "--out", str(tmp / "o")], EXIT_USAGE, "is not a directory"),
    ("analyze", lambda tmp: ["analyze", "--bootstrap", "127.0.0.1:1", "--shuffled-topic", "s", "--model-topic", "m",
                             "--messages-topic", "g", "--analyzer-key", "k", "--shuffler-verify-key", "v", "--out",
                             str(tmp / "o"), "--dim", "3", "--learner", "shuffle-acsa"], EXIT_USAGE, "horizon"),
    ("coordinate", lambda tmp: ["coordinate", "--bootstrap", "127.0.0.1:1", "--gradients-topic", "g", "--model-topic",
                                "m", "--workers", "2", "--dim", "3", "--n", "100", "--learner", "shuffle-sgd"],
     EXIT_USAGE, "cannot run on many workers"),
    ("encode", lambda tmp: ["encode", "--bootstrap", "127.0.0.1:1", "--model-topic", "m", "--messages-topic", "g",
                            "--analyzer-key", str(tmp / "missing.pub"), "--shuffler-key", str(tmp / "shuffler.pub"),
                            "--source", str(tmp / "r.jsonl")],
     EXIT_FAILURE, "missing.pub"),
    ("encode", lambda tmp: ["encode", "--bootstrap", "127.0.0.1:1", "--model-topic", "m", "--messages-topic", "g",
                            "--analyzer-key", str(tmp / "a-file"), "--shuffler-key", str(tmp / "a-file"),
                            "--source", str(tmp / "r.jsonl")],
     EXIT_USAGE, "is not a public key file"),
    ("shuffle", lambda tmp: ["shuffle", "--bootstrap", "127.0.0.1:1", "--messages-topic", "m", "--shuffled-topic", "s",
                             "--batch-size", "4", "--params", "3", "--shuffler-key", "k", "--checkin"], EXIT_USAGE,
     "--checkin needs"),
]


@pytest.mark.parametrize("command, argv, code, says", SCENARIOS, ids=[f"{s[0]}-{s[2]}" for s in SCENARIOS])
def test_errors_without_a_broker_give_their_code_and_one_line(command: str, argv: Callable[[Path], list[str]], code: int,
                                                              says: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_text("not a directory\n")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "budget.sqlite").write_bytes(b"not a database" * 100)
    assert main(argv(tmp_path)) == code
    line = one_error_line(capsys)
    assert line.startswith(f"panpriv {command}: ") and says in line, line


def test_every_command_has_a_scenario_here_or_in_the_tests_named_above() -> None:
    elsewhere = {"dev-broker", "topics", "worker", "record", "produce"}  # below, or in the docstring's tests
    assert set(commands()) <= {s[0] for s in SCENARIOS} | elsewhere


def panpriv(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "panpriv", *args], capture_output=True, text=True, env=env(), cwd=ROOT,
                          timeout=timeout)


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in result.stderr, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("panpriv ")]


@pytest.mark.integration
def test_a_worker_refused_by_its_budget_exits_3(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                               tmp_path: Path) -> None:
    """The model's ε exceeds the worker's --max-epsilon: nothing is learned (exit 3; it exited 0)."""
    from panpriv.streamer.scaleout.coordinator import Coordinator
    from tests.scaleout import parts

    names = parts.topics(kafka_broker, unique_name, partitions=1)
    model = Coordinator(parts.learner(10_000), 2, "default").model()
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    try:
        producer.send(names["model"], key=b"default", value=model.to_json()).get(timeout=30)
    finally:
        producer.close()
    result = panpriv("worker", "--bootstrap", kafka_broker.bootstrap, "--data-topic", names["data"], "--gradients-topic",
                     names["gradients"], "--model-topic", names["model"], "--out", str(tmp_path / "w"),
                     "--state-dir", str(tmp_path / "state"), "--max-epsilon", "0.5")
    lines = error_lines(result)
    assert result.returncode == EXIT_BUDGET and len(lines) == 1 and "refusing to start" in lines[0], result.stderr


@pytest.mark.integration
def test_a_client_refusing_a_model_for_its_privacy_exits_3_and_for_its_key_2(
        kafka_broker: KafkaBroker, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    from nacl.public import PrivateKey

    from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
    from panpriv.streamer.esa.analyzer import Analyzer
    from panpriv.streamer.esa.keys import generate
    from tests.esa import parts as esa

    keys = generate(tmp_path / "keys", "analyzer")
    shuffler = generate(tmp_path / "keys", "shuffler")
    from panpriv.streamer.esa.keys import load_private

    names = esa.topics(kafka_broker, unique_name)
    learner = ShuffleGaussianSGD(dim=3, loss="logistic", epsilon=4.0, delta=1e-5, batch_size=8, radius=2.0)
    analyzer = Analyzer(learner, [load_private(keys.private)], "default")
    esa.send(kafka_broker.bootstrap, names["model"], [analyzer.model().to_json()])
    source = tmp_path / "records.jsonl"
    source.write_text("".join(json.dumps({"x": [0.1, 0.2, 0.3], "y": 1}) + "\n" for _ in range(8)))
    common = ["encode", "--bootstrap", kafka_broker.bootstrap, "--model-topic", names["model"], "--messages-topic",
              names["messages"], "--shuffler-key", str(shuffler.public), "--source", str(source), "--timeout", "20"]
    weak = panpriv(*common, "--analyzer-key", str(keys.public), "--max-local-epsilon", "0.5")
    assert weak.returncode == EXIT_BUDGET and "refused the model" in weak.stdout, weak.stdout + weak.stderr
    other = generate(tmp_path / "other", "analyzer")
    assert PrivateKey.generate()  # another key: the model asks for the analyzer's
    foreign = panpriv(*common, "--analyzer-key", str(other.public))
    assert foreign.returncode == EXIT_USAGE and "fetch the new public key" in foreign.stdout, foreign.stdout + foreign.stderr


@pytest.mark.integration
def test_record_of_a_missing_topic_exits_1(kafka_broker: KafkaBroker, unique_name: Callable[[str], str],
                                          tmp_path: Path) -> None:
    result = panpriv("record", f"kafka://{kafka_broker.bootstrap}/{unique_name('missing')}", str(tmp_path / "r.rec"))
    lines = error_lines(result)
    assert result.returncode == EXIT_FAILURE and len(lines) == 1 and "does not exist" in lines[0], result.stderr


@pytest.mark.integration
def test_topics_and_produce_exit_0(kafka_broker: KafkaBroker, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("events")
    assert panpriv("topics", "create", "--bootstrap", kafka_broker.bootstrap, topic).returncode == EXIT_OK
    produced = panpriv("produce", "--bootstrap", kafka_broker.bootstrap, "--topic", topic, "--n", "10", "--dim", "3")
    assert produced.returncode == EXIT_OK and "wrote 10 records" in produced.stdout
