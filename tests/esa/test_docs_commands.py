"""The three-role commands of docs/how-to/esa.md are accepted by ``panpriv``'s parser as written, and
agree with each other (the shuffler's settings are the analyzer's)."""

from __future__ import annotations

import pytest

from panpriv.streamer.commands import esa as commands
from panpriv.streamer.commands.cli import build_parser
from tests.docs.pages import DOCS, code_blocks, panpriv_commands

GUIDE = DOCS / "how-to" / "esa.md"


def esa_commands(heading: str = "# Encode–Shuffle–Analyze") -> list[list[str]]:
    """The commands of the first shell block after ``heading``."""
    return panpriv_commands(code_blocks(GUIDE, "sh", after=heading)[0])


def test_guide_esa_commands_parse() -> None:
    """The shuffle-gaussian block: both key pairs, each role given the keys it needs (the shuffler its
    private key, the analyzer the shuffler's verify key, clients both public keys), and
    ``--max-epsilon`` admits one use of a round (the statement the analyzer charges) and not a second."""
    from nacl.public import PrivateKey

    from panpriv.streamer.esa.analyzer import Analyzer

    parsed: dict[str, list] = {}
    for args in esa_commands():
        parsed.setdefault(args[0], []).append(build_parser().parse_args(args))
    assert set(parsed) == {"keygen", "analyze", "shuffle", "encode"}
    assert sorted(k.role for k in parsed["keygen"]) == ["analyzer", "shuffler"]
    (analyze,), (shuffle,), (encode,) = parsed["analyze"], parsed["shuffle"], parsed["encode"]
    assert analyze.handler is commands.cmd_analyze and analyze.messages_topic == shuffle.messages_topic
    assert analyze.max_epsilon is not None and analyze.metrics_port and shuffle.metrics_port
    assert str(analyze.shuffler_verify_key[0]).endswith(".verify") and str(shuffle.shuffler_key).endswith(".key")
    assert str(encode.shuffler_key).endswith(".pub") and str(encode.analyzer_key).endswith(".pub")
    learner = commands.analyzer_learner(analyze)()
    assert shuffle.batch_size == analyze.batch_size and shuffle.params == learner.calibration()["params"]
    report = Analyzer(learner, [PrivateKey.generate()], "readme").report()
    one = max(report.output.epsilon, report.intrusion.epsilon)
    assert one <= analyze.max_epsilon < one + report.output.epsilon, "one use of a round, not a second"


@pytest.mark.parametrize("kind", ["shuffle-acsa", "shuffle-sgd"])
def test_guide_secure_sum_commands_parse_and_agree(kind: str) -> None:
    """The shuffle-acsa and shuffle-sgd blocks: the shuffler's --shares is the analyzer's m for
    these settings."""
    from nacl.public import PrivateKey

    from panpriv.streamer.esa.sum_analyzer import SumAnalyzer

    parsed = {args[0]: build_parser().parse_args(args) for args in esa_commands(f"## `{kind}` in three roles")}
    assert set(parsed) == {"analyze", "shuffle", "encode"}
    analyze, shuffle = parsed["analyze"], parsed["shuffle"]
    assert analyze.learner == kind and shuffle.shuffler_key and analyze.shuffler_verify_key
    analyzer = SumAnalyzer(commands.analyzer_learner(analyze)(), [PrivateKey.generate()], "readme")
    assert (shuffle.batch_size, shuffle.params, shuffle.shares) == (analyzer.users, analyzer.dim, analyzer.shares)
    report = analyzer.report()
    assert report.output.epsilon <= analyze.max_epsilon, "the example could not start"


def test_guide_shuffle_gd_commands_parse_and_agree() -> None:
    """The shuffle-gd block: the shuffler's threshold is n and its --shares the analyzer's m; the
    encoder keeps a state file; the plan's T is the analyzer's --rounds."""
    from nacl.public import PrivateKey

    from panpriv.streamer.esa.gd_analyzer import GDAnalyzer

    parsed = {args[0]: build_parser().parse_args(args) for args in esa_commands("## `shuffle-gd` in three roles")}
    assert set(parsed) == {"analyze", "shuffle", "encode"}
    analyze, shuffle, encode = parsed["analyze"], parsed["shuffle"], parsed["encode"]
    assert analyze.learner == "shuffle-gd" and encode.state is not None
    assert analyze.messages_topic == shuffle.messages_topic == encode.messages_topic
    analyzer = GDAnalyzer(commands.analyzer_learner(analyze)(), [PrivateKey.generate()], "readme")
    assert (shuffle.batch_size, shuffle.params, shuffle.shares) == (analyzer.users, analyzer.dim, analyzer.shares)
    assert analyzer.rounds == analyze.rounds


def test_guide_checkin_commands_parse_and_agree() -> None:
    """The checkin block: the shuffler's --batch-size and --params are the analyzer's slot_length
    and parameter count (it refuses to start otherwise), and the example can start."""
    from nacl.public import PrivateKey

    from panpriv.streamer.esa.checkin_analyzer import CheckinAnalyzer

    parsed = {args[0]: build_parser().parse_args(args) for args in esa_commands("## `checkin` in three roles")}
    assert set(parsed) == {"keygen", "analyze", "shuffle", "encode"}
    keygen, analyze, shuffle, encode = parsed["keygen"], parsed["analyze"], parsed["shuffle"], parsed["encode"]
    assert keygen.role == "shuffler" and analyze.learner == "checkin" and shuffle.checkin
    assert encode.shuffler_key is not None and shuffle.shuffler_key.name.startswith("shuffler-")
    calibration = CheckinAnalyzer(commands.analyzer_learner(analyze)(), [PrivateKey.generate()], "readme").model().calibration
    assert (shuffle.batch_size, shuffle.params) == (calibration["slot_length"], calibration["params"])
    report = commands.analyzer_learner(analyze)().privacy()
    assert report.output.epsilon <= analyze.max_epsilon, "the example could not start"
