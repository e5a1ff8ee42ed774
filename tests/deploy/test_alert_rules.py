"""The alert rules fire when they should and stay quiet otherwise (``promtool test rules``).

Each case feeds synthetic series to Prometheus's own rule-unit-test engine and states which alerts
are firing at one evaluation time. In promtool's clock, ``time()`` is the seconds since the start of
the test, so a checkpoint timestamp of ``60`` means "a checkpoint one minute in".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_stack import RULES

INSTANCE = {"instance": "panpriv:9477", "job": "panpriv"}
LABELS = 'instance="panpriv:9477", job="panpriv"'
ROLES = ("shuffler", "analyzer", "worker", "coordinator")  # each scraped as job panpriv-<role> (prometheus.yml)


def descriptions() -> dict[str, str]:
    """Each rule's description (static text, no template), as promtool will render it."""
    return {rule["alert"]: rule["annotations"]["description"]
            for path in RULES for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]}


def case(series: dict[str, str], eval_time: str, alert: str, summary: str | None,
         severity: str = "warning", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """One promtool test: ``series`` (selector → values), and ``alert`` firing with ``summary``
    at ``eval_time`` (``summary=None``: not firing)."""
    expected = []
    if summary is not None:
        expected = [{"exp_labels": {"severity": severity, **(INSTANCE if labels is None else labels)},
                     "exp_annotations": {"summary": summary, "description": descriptions()[alert]}}]
    return {
        "interval": "1m",
        "input_series": [{"series": name, "values": values} for name, values in series.items()],
        "alert_rule_test": [{"eval_time": eval_time, "alertname": alert, "exp_alerts": expected}],
    }


BUDGET_4 = {f'panpriv_privacy_epsilon_budget{{{LABELS}, guarantee="{g}"}}': "4x6" for g in ("output", "intrusion")}
FLOWING = {f"panpriv_records_total{{{LABELS}}}": "0+6000x30"}  # 100 records/s
CASES = {
    "down: scrape fails for 2 minutes": case(
        {f"up{{{LABELS}}}": "0x10"}, "5m", "PanprivServiceDown", "panpriv panpriv:9477 is not answering on /metrics",
        severity="critical"),
    "down: healthy target is quiet": case({f"up{{{LABELS}}}": "1x10"}, "5m", "PanprivServiceDown", None),
    "no records for 10 minutes": case(
        {f"panpriv_records_total{{{LABELS}}}": "500x30"}, "12m", "PanprivNoRecordsProcessed",
        "panpriv panpriv:9477 has learned from no record for 10 minutes", labels={"instance": "panpriv:9477"}),
    "records flowing: quiet": case(FLOWING, "12m", "PanprivNoRecordsProcessed", None),
    "10% rejected for 10 minutes": case(
        {**FLOWING, f'panpriv_records_rejected_total{{{LABELS}, reason="wrong_dimension"}}': "0+400x30",
         f'panpriv_records_rejected_total{{{LABELS}, reason="undecodable"}}': "0+266.6666666666667x30"},
        "20m", "PanprivRejectedRateHigh", "panpriv panpriv:9477 rejects 10% of records",
        labels={"instance": "panpriv:9477"}),
    "1% rejected: quiet": case(
        {**FLOWING, f'panpriv_records_rejected_total{{{LABELS}, reason="non_finite"}}': "0+60x30"},
        "20m", "PanprivRejectedRateHigh", None),
    "checkpoint stuck while records flow": case(
        {**FLOWING, f"panpriv_last_checkpoint_timestamp_seconds{{{LABELS}}}": "60x30"},
        "5m", "PanprivCheckpointStale", "panpriv panpriv:9477: last checkpoint is 4m 0s old", severity="critical"),
    "checkpoint every minute: quiet": case(
        {**FLOWING, f"panpriv_last_checkpoint_timestamp_seconds{{{LABELS}}}": "0+60x30"},
        "20m", "PanprivCheckpointStale", None),
    "old checkpoint but idle stream: quiet": case(
        {f"panpriv_records_total{{{LABELS}}}": "500x30", f"panpriv_last_checkpoint_timestamp_seconds{{{LABELS}}}": "60x30"},
        "20m", "PanprivCheckpointStale", None),
    "epsilon above 80% of max_epsilon": case(
        {f'panpriv_privacy_epsilon{{{LABELS}, guarantee="output"}}': "2 3.3x5",
         f'panpriv_privacy_epsilon{{{LABELS}, guarantee="intrusion"}}': "+Inf +Inf +Inf +Inf +Inf +Inf",
         **BUDGET_4},
        "3m", "PanprivPrivacyBudgetHigh", "panpriv panpriv:9477 has spent 82.5% of max_epsilon",
        labels={"instance": "panpriv:9477"}),
    "the intrusion guarantee counts too": case(
        {f'panpriv_privacy_epsilon{{{LABELS}, guarantee="output"}}': "1x6",
         f'panpriv_privacy_epsilon{{{LABELS}, guarantee="intrusion"}}': "1 3.6x5", **BUDGET_4},
        "3m", "PanprivPrivacyBudgetHigh", "panpriv panpriv:9477 has spent 90% of max_epsilon",
        labels={"instance": "panpriv:9477"}),
    "another budget: the same epsilon is quiet": case(
        {f'panpriv_privacy_epsilon{{{LABELS}, guarantee="output"}}': "2 3.3x5",
         f'panpriv_privacy_epsilon_budget{{{LABELS}, guarantee="output"}}': "10x6",
         f'panpriv_privacy_epsilon_budget{{{LABELS}, guarantee="intrusion"}}': "10x6"},
        "3m", "PanprivPrivacyBudgetHigh", None),
    "no max_epsilon: no budget to spend": case(
        {f'panpriv_privacy_epsilon{{{LABELS}, guarantee="output"}}': "2 30x5"},
        "3m", "PanprivPrivacyBudgetHigh", None),
    "no pan-private guarantee (+Inf) is not a spent budget": case(
        {f'panpriv_privacy_epsilon{{{LABELS}, guarantee="output"}}': "1x6",
         f'panpriv_privacy_epsilon{{{LABELS}, guarantee="intrusion"}}': "+Inf +Inf +Inf +Inf +Inf +Inf", **BUDGET_4},
        "3m", "PanprivPrivacyBudgetHigh", None),
    "seeded noise (replay/testing mode)": case(
        {f"panpriv_seeded_mode{{{LABELS}}}": "1x5"}, "2m", "PanprivSeededMode",
        "panpriv panpriv:9477 runs with seeded noise (replay/testing mode)", severity="critical",
        labels={"instance": "panpriv:9477"}),
    "unseeded noise: quiet": case({f"panpriv_seeded_mode{{{LABELS}}}": "0x5"}, "2m", "PanprivSeededMode", None),
    **{f"{role} not answering for 2 minutes": case(
        {f'up{{instance="{role}:9477", job="panpriv-{role}"}}': "0x10",
         **{f'up{{instance="{other}:9477", job="panpriv-{other}"}}': "1x10" for other in ROLES if other != role}},
        "5m", "PanprivRoleDown", f"panpriv-{role} {role}:9477 is not answering on /metrics", severity="critical",
        labels={"instance": f"{role}:9477", "job": f"panpriv-{role}"}) for role in ROLES},
    "a role answering again within 2 minutes: quiet": case(
        {'up{instance="worker:9477", job="panpriv-worker"}': "1 0 1 1 1 1 1 1 1 1 1"}, "5m", "PanprivRoleDown", None),
    "the roles healthy, the service down: not this alert": case(
        {**{f'up{{instance="{role}:9477", job="panpriv-{role}"}}': "1x10" for role in ROLES}, f"up{{{LABELS}}}": "0x10"},
        "5m", "PanprivRoleDown", None),
    "consumer lag growing for 30 minutes": case(
        {f'panpriv_consumer_lag_messages{{{LABELS}, topic="events", partition="0"}}': "0+100x60",
         f'panpriv_consumer_lag_messages{{{LABELS}, topic="events", partition="1"}}': "500x60"},
        "40m", "PanprivConsumerLagGrowing",
        "panpriv panpriv:9477 falls behind: its consumer lag grew by 1.5k messages in 15 minutes",
        labels={"instance": "panpriv:9477"}),
    "a large lag that shrinks (catching up): quiet": case(
        {f'panpriv_consumer_lag_messages{{{LABELS}, topic="events", partition="0"}}': "90000-1000x60"},
        "40m", "PanprivConsumerLagGrowing", None),
    "a lag that grew for less than the hold time: quiet": case(
        {f'panpriv_consumer_lag_messages{{{LABELS}, topic="events", partition="0"}}': "0+100x20 2000x40"},
        "40m", "PanprivConsumerLagGrowing", None),
}


@pytest.mark.parametrize("name", CASES)
def test_alert_rule(promtool: str, tmp_path: Path, name: str) -> None:
    spec = {"rule_files": [str(path) for path in RULES], "evaluation_interval": "1m", "tests": [CASES[name]]}
    path = tmp_path / "rules_test.yml"
    path.write_text(json.dumps(spec))
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    firing = {c["alert_rule_test"][0]["alertname"] for c in CASES.values() if c["alert_rule_test"][0]["exp_alerts"]}
    quiet = {c["alert_rule_test"][0]["alertname"] for c in CASES.values() if not c["alert_rule_test"][0]["exp_alerts"]}
    assert firing == quiet == set(descriptions())
