"""The ESA roles as monitored services on the real broker: a real Prometheus scrapes the shuffler's
and the analyzer's ``/metrics``, and the analyzer's use of its data source is in the shared budget
store — ``panpriv budget`` shows it, a second analyzer over the same source composes with it, and
``--max-epsilon`` refuses one that would exceed it (exit code 3)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.streamer.esa.analyzer import REJECT_REASONS
from panpriv.streamer.esa.keys import KeyFiles, load_public
from panpriv.streamer.esa.shuffler import DROP_REASONS
from tests.esa import parts
from tests.realparts import KafkaBroker, free_loopback_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DIM, B, ROUNDS, EPSILON, DELTA = 5, 32, 4, 2.0, 1e-5


def analyzer_args(broker: KafkaBroker, names: dict[str, str], keys: tuple[KeyFiles, KeyFiles], out: Path, state: Path,
                  name: str) -> list[str]:
    return ["analyze", "--bootstrap", broker.bootstrap, "--shuffled-topic", names["shuffled"], "--model-topic",
            names["model"], "--messages-topic", names["messages"], "--analyzer-key", str(keys[0].private),
            "--shuffler-verify-key", str(keys[1].verify), "--out", str(out),
            "--state-dir", str(state), "--deployment", name, "--dim", str(DIM), "--batch-size", str(B), "--epsilon",
            str(EPSILON), "--delta", str(DELTA), "--options", json.dumps({"loss": {"name": "logistic", "intercept": False}, "radius": math.sqrt(DIM)})]


def cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "panpriv", *args], capture_output=True, text=True, timeout=120,
                          env=parts.env())


def test_prometheus_scrapes_both_roles_and_the_budget_store_composes_analyzers(
    kafka_broker: KafkaBroker, unique_name: Callable[[str], str], prometheus, tmp_path: Path
) -> None:
    names = parts.topics(kafka_broker, unique_name)
    keys = parts.key_pairs(tmp_path)
    shuffler_public = load_public(keys[1].public)
    state = tmp_path / "state"
    X, y = parts.synthetic(B * ROUNDS, DIM, seed=4)
    source = parts.write_jsonl(tmp_path / "records.jsonl", X, y)
    # Before any client: a message to a key nobody holds (it takes a place in round 0's batch: the
    # analyzer rejects it as unknown_key, and the last client message of round 0 is late at the
    # shuffler), junk (malformed) and a message for a round far ahead (too_early).
    parts.send(kafka_broker.bootstrap, names["messages"],
               [parts.fake_message(0, 1, DIM, shuffler_public), b"junk", parts.fake_message(7, 2, DIM, shuffler_public)])
    shuffler_port, analyzer_port = free_loopback_port(), free_loopback_port()
    shuffler = parts.panpriv(["shuffle", "--bootstrap", kafka_broker.bootstrap, "--messages-topic", names["messages"],
                              "--shuffled-topic", names["shuffled"], "--batch-size", str(B), "--params", str(DIM),
                              "--shuffler-key", str(keys[1].private),
                              "--group", unique_name("shuffler"), "--metrics-port", str(shuffler_port),
                              "--metrics-addr", "127.0.0.1"], tmp_path / "shuffler.log")
    analyzer = parts.panpriv([*analyzer_args(kafka_broker, names, keys, tmp_path / "first", state, "first"),
                              "--metrics-port", str(analyzer_port), "--metrics-addr", "127.0.0.1"],
                             tmp_path / "analyzer.log")
    client = parts.panpriv([*parts.encode_args(kafka_broker, names, keys, source), "--deployment", "first"],
                           tmp_path / "client.log")
    checkpoint = tmp_path / "first" / "analyzer.json"
    try:
        prom = prometheus([f"127.0.0.1:{shuffler_port}", f"127.0.0.1:{analyzer_port}"], scrape_interval_s=0.5)

        def done() -> bool:
            analyzer.check_alive()
            return checkpoint.exists() and parts.analyzer_state(checkpoint)["round"] == ROUNDS

        wait_until(done, 180, f"{ROUNDS} rounds analysed")
        saved = parts.analyzer_state(checkpoint)
        assert saved["rejected"] == {"unknown_key": 1} and saved["min_valid"] == B - 1

        def equal(expected: float) -> Callable[[float], bool]:
            return lambda value: value == expected

        prom.wait_for_value("panpriv_esa_rounds_total", equal(ROUNDS))
        prom.wait_for_value("panpriv_esa_messages_total", equal(ROUNDS * B - 1))
        prom.wait_for_value('panpriv_esa_rejected_total{reason="unknown_key"}', equal(1))
        prom.wait_for_value("panpriv_esa_round", equal(ROUNDS))
        assert len(prom.query("panpriv_esa_rejected_total")) == len(REJECT_REASONS)  # every reason, at 0 too
        for guarantee in ("output", "intrusion"):
            expected = saved["privacy"][guarantee]
            prom.wait_for_value(f'panpriv_privacy_epsilon{{guarantee="{guarantee}"}}', equal(expected["epsilon"]))
            prom.wait_for_value(f'panpriv_privacy_delta{{guarantee="{guarantee}"}}', equal(expected["delta"]))
        # One round had B − 1 valid messages: the output guarantee is Thm 1 at n = B − 1, above the full
        # round's; an intrusion into the analyzer is bounded by it too (its key opens only released units).
        full = ShuffleGaussianSGD(dim=DIM, loss="logistic", epsilon=EPSILON, delta=DELTA, batch_size=B,
                                  radius=math.sqrt(DIM)).privacy().output.epsilon
        assert saved["privacy"]["output"]["epsilon"] > full
        assert saved["privacy"]["intrusion"] == saved["privacy"]["output"]
        sources = {s["metric"]["source"] for s in prom.query("panpriv_budget_epsilon")}
        assert len(sources) == 1 and all(s.startswith("esa:") and s.endswith(f"/{names['messages']}") for s in sources)

        prom.wait_for_value("panpriv_esa_shuffler_rounds_released_total", equal(ROUNDS))
        prom.wait_for_value("panpriv_esa_shuffler_messages_released_total", equal(ROUNDS * B))
        prom.wait_for_value('panpriv_esa_shuffler_dropped_total{reason="malformed"}', equal(1))
        prom.wait_for_value('panpriv_esa_shuffler_dropped_total{reason="too_early"}', equal(1))
        prom.wait_for_value('panpriv_esa_shuffler_dropped_total{reason="late"}', equal(1))
        prom.wait_for_value("panpriv_esa_shuffler_waiting_messages", equal(0))
        prom.wait_for_value("panpriv_esa_shuffler_last_released_round", equal(ROUNDS - 1))
        assert len(prom.query("panpriv_esa_shuffler_dropped_total")) == len(DROP_REASONS)
        assert [float(s["value"][1]) for s in prom.query("up")] == [1.0, 1.0]

        assert client.process.wait(timeout=60) == 0, client.log_path.read_text()[-3000:]
        # A client whose --max-local-epsilon the model's messages would exceed sends nothing and
        # says why (exit code 3, a budget refusal: streamer/commands/exit_codes.py; no traceback).
        refused_client = cli([*parts.encode_args(kafka_broker, names, keys, source), "--deployment", "first",
                              "--max-local-epsilon", "0.01", "--timeout", "30"])
        assert refused_client.returncode == 3, refused_client.stdout + refused_client.stderr
        assert "refused the model" in refused_client.stdout and "local" in refused_client.stdout
        assert "Traceback" not in refused_client.stderr
        analyzer.process.terminate()
        assert analyzer.process.wait(timeout=30) == 0, analyzer.log_path.read_text()[-3000:]
    finally:
        for process in (client, shuffler, analyzer):
            process.stop()
    first_instance = saved["instance"]

    shown = cli(["budget", "--state-dir", str(state), "--source", names["messages"]])
    assert shown.returncode == 0, shown.stderr
    assert f"/{names['messages']}: composed over all runs" in shown.stdout
    assert f"[0, {ROUNDS}) used by {first_instance}" in shown.stdout

    # A second analyzer (another deployment name, another --out) over the same batches: with a
    # budget below two uses it is refused before it publishes anything; without one it composes.
    single = saved["privacy"]["intrusion"]["epsilon"]
    refused = cli([*analyzer_args(kafka_broker, names, keys, tmp_path / "second", state, "second"),
                   "--max-epsilon", str(single * 1.01), "--max-rounds", "2"])
    assert refused.returncode == 3, refused.stdout + refused.stderr
    assert "refusing to start" in refused.stderr and first_instance in refused.stderr
    second = cli([*analyzer_args(kafka_broker, names, keys, tmp_path / "second", state, "second"),
                  "--max-rounds", "2"])
    assert second.returncode == 0, second.stdout + second.stderr
    second_instance = parts.analyzer_state(tmp_path / "second" / "analyzer.json")["instance"]
    shown = cli(["budget", "--state-dir", str(state), "--source", names["messages"]])
    pair = ", ".join(sorted([first_instance, second_instance]))
    assert f"[0, 2) used by {pair}" in shown.stdout, shown.stdout
    assert f"[2, {ROUNDS}) used by {first_instance}" in shown.stdout, shown.stdout
    composed = parts.analyzer_state(tmp_path / "second" / "analyzer.json")["privacy"]
    assert composed["output"]["epsilon"] > saved["privacy"]["output"]["epsilon"]
    assert first_instance in json.dumps(composed["assumptions"])
    print(shown.stdout)
