"""Seeded mode is loud: a warning line at start, ``panpriv_seeded_mode`` = 1, and an alert rule
(issue 15, failure 9)."""

from __future__ import annotations

import yaml

from panpriv.streamer.metrics.service import ServiceMetrics
from tests.faults.conftest import synthetic_args
from tests.faults.harness import ROOT, run_panpriv


def test_seeded_run_logs_a_warning_and_unseeded_does_not(tmp_path) -> None:
    code, output = run_panpriv(synthetic_args(tmp_path / "seeded", "--seed", "7"), tmp_path, "seeded")
    assert code == 0, output
    warnings = [line for line in output.splitlines() if "WARNING" in line and "SEEDED MODE" in line]
    assert len(warnings) == 1 and "pan-private guarantee does not hold" in warnings[0]
    code, output = run_panpriv(synthetic_args(tmp_path / "unseeded"), tmp_path, "unseeded")
    assert code == 0 and "SEEDED" not in output


def test_seeded_mode_gauge() -> None:
    metrics = ServiceMetrics()
    assert metrics.registry.get_sample_value("panpriv_seeded_mode") == 0.0  # exported before it is set
    metrics.set_seeded(True)
    assert metrics.registry.get_sample_value("panpriv_seeded_mode") == 1.0
    metrics.set_seeded(False)
    assert metrics.registry.get_sample_value("panpriv_seeded_mode") == 0.0


def test_alert_rule_fires_on_the_gauge() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules" / "panpriv.yml").read_text())
    alerts = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    assert "panpriv_seeded_mode" in alerts["PanprivSeededMode"]["expr"]
    assert alerts["PanprivSeededMode"]["labels"]["severity"] == "critical"
