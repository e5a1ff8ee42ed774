"""Every E-S-A statement names who reads which topic and holds which key, what a broker operator
colluding with the analyzer learns, each role's guarantee and the honest fraction γ — for each of the
five learners — and docs/privacy.md shows the same table of topics (Bittau et al. 2017 §3)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey

from panpriv.protocols.checkin import RandomCheckinSGD
from panpriv.protocols.shuffle_acsa import ShuffleACSA
from panpriv.protocols.shuffle_gaussian import ShuffleGaussianSGD
from panpriv.protocols.shuffle_gd import ShuffleGD
from panpriv.protocols.shuffle_sgd import ShuffleSGD
from panpriv.streamer.esa.analyzer import Analyzer
from panpriv.streamer.esa.checkin_analyzer import CheckinAnalyzer
from panpriv.streamer.esa.deployment import topic_access
from panpriv.streamer.esa.gd_analyzer import GDAnalyzer
from panpriv.streamer.esa.sum_analyzer import SumAnalyzer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"
KEY = PrivateKey.generate()


def analyzers() -> dict[str, Any]:
    common: dict[str, Any] = {"dim": 4, "loss": "logistic", "epsilon": 2.0, "delta": 1e-5, "radius": 2.0}
    return {
        "shuffle-gaussian": Analyzer(ShuffleGaussianSGD(batch_size=16, **common), [KEY], "t"),
        "shuffle-sgd": SumAnalyzer(ShuffleSGD(batch_size=16, **common), [KEY], "t"),
        "shuffle-acsa": SumAnalyzer(ShuffleACSA(horizon=64, batch_size=16, **common), [KEY], "t"),
        "shuffle-gd": GDAnalyzer(ShuffleGD(n=16, rounds=3, **common), [KEY], "t"),
        "checkin": CheckinAnalyzer(RandomCheckinSGD(slots=4, slot_length=4, **common), [KEY], "t"),
    }


@pytest.mark.parametrize("learner", ["shuffle-gaussian", "shuffle-sgd", "shuffle-acsa", "shuffle-gd", "checkin"])
def test_every_statement_names_the_parties_their_topics_keys_and_guarantees(learner: str) -> None:
    report = analyzers()[learner].report()
    lines = {line.split(":")[0]: line for line in report.assumptions}
    for heading in ("readable topics (deploy/ Kafka ACLs)", "keys", "broker operator colluding with the analyzer",
                    "client", "shuffler", "analyzer intrusion", "colluding clients"):
        assert heading in lines, (heading, list(lines))
    access = topic_access(learner == "checkin")
    for role, rights in access.items():
        assert f"the {role} reads the {rights['read'][0]}" in lines["readable topics (deploy/ Kafka ACLs)"]
    assert ("model" in lines["readable topics (deploy/ Kafka ACLs)"].split("the shuffler reads")[1].split(";")[0]) \
        == (learner == "checkin"), "only the checkin shuffler reads the model topic"
    assert "onion sealing" in lines["keys"] and "verify key" in lines["keys"]
    assert str(report.output) in lines["broker operator colluding with the analyzer"]
    assert str(report.output) in lines["analyzer intrusion"] and report.intrusion == report.output
    assert re.search(r"gamma = 1\b", lines["colluding clients"]) and "outside the model" in lines["colluding clients"]


def test_docs_show_the_table_of_topics_the_statements_print() -> None:
    """The table in docs/privacy.md ("Who reads what") is :func:`topic_access`, the checkin
    shuffler's extra topic marked as such."""
    text = DOCS.read_text()
    section = text[text.index("**Who reads what, who holds which key**"):]
    table = [line for line in section.splitlines()[:12] if line.startswith("|")][2:]  # no header, no rule
    rows = {}
    for line in table:
        role, reads, writes, _ = (cell.strip() for cell in line.strip("|").split("|"))
        rows[role] = (reads, writes)
    plain, checkin = topic_access(False), topic_access(True)
    for role, (reads, writes) in rows.items():
        listed = [part.strip() for part in reads.split(",")]
        always = [re.sub(r" \(.*\)$", "", item) for item in listed if "checkin" not in item]
        only_checkin = [item.split(" ")[0] for item in listed if "checkin" in item]
        assert tuple(always) == plain[role]["read"], role
        assert tuple(always + only_checkin) == checkin[role]["read"], role
        assert tuple(writes.split(", ")) == plain[role]["write"] == checkin[role]["write"], role
    assert set(rows) == set(plain)
