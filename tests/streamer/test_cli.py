"""The `panpriv` command line: help, exit codes, messages, the what-if calculator, inspect, and
the embedded default run (what `make run` executes)."""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import types

import numpy as np
import pytest

from panpriv.accounting.gaussian import analytic_epsilon, analytic_sigma
from panpriv.streamer.commands.cli import _after_command, _resume_args, build_parser, main
from panpriv.streamer.config import load_config
from panpriv.streamer.datasets import adult
from panpriv.streamer.runtime.learners import build_learner
from panpriv.streamer.serving.snapshots import load_snapshot


@pytest.mark.parametrize("command", [[], ["run"], ["record"], ["privacy"], ["inspect"]])
def test_help_everywhere(command, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert "usage: panpriv" in capsys.readouterr().out


def test_no_command_prints_help_and_fails(capsys) -> None:
    assert main([]) == 2
    assert "usage: panpriv" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--learner", "shuffle-gd", "--metrics-port", "0"], "learner 'shuffle-gd' reads a recording by record index, so its source must be file:PATH"),
        (["run", "--source", "kafka://127.0.0.1:1/t", "--metrics-port", "0"], "records.dim is required"),
        (["run", "--source", "kafka://127.0.0.1:1/t", "--dim", "2", "--feature-bound", "1", "--metrics-port", "0", "--delta", "3"], "learner.delta: Input should be less than 1"),
        (["inspect", "/nonexistent/panpriv"], "does not exist"),
    ],
)
def test_errors_exit_2_with_a_message(argv, message, capsys, tmp_path) -> None:
    if argv[0] == "run":
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_flag_value_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--epsilon", "-1"])
    assert info.value.code == 2
    assert "must be a finite number > 0" in capsys.readouterr().err


def test_missing_source_file_exits_1(capsys, tmp_path) -> None:
    argv = ["run", "--source", f"file:{tmp_path / 'none.jsonl'}", "--dim", "2", "--feature-bound", "1", "--n", "5",
            "--metrics-port", "0", "--out", str(tmp_path / "out")]
    assert main(argv) == 1
    assert "does not exist" in capsys.readouterr().err


def test_privacy_target_to_noise_matches_the_learner(capsys) -> None:
    assert main(["privacy", "--n", "10000", "--epsilon", "0.5", "--delta", "1e-5", "--dim", "10", "--feature-bound", "2"]) == 0
    out = capsys.readouterr().out
    config = load_config(None, {"source.url": "synthetic:n=1&dim=10", "records.dim": 10, "records.feature_bound": 2.0,
                                "learner.epsilon": 0.5, "learner.delta": 1e-5})
    learner = build_learner(config, 10_000)
    plan = learner.current_plan()
    b = plan.batch_size(1)
    assert f"batches T = {plan.steps:,}" in out
    assert f"zeta = {learner.batch_noise_std(b):.6g} for b = {b:,}" in out
    # ζ is the analytic Gaussian σ for sensitivity 2L/b (L = R = √(2² + 1) for the logistic loss with the
    # default intercept).
    zeta = float(re.search(rf"zeta = (\S+) for b = {b:,}", out).group(1))
    assert zeta == pytest.approx(analytic_sigma(0.5, 1e-5, 2 * math.sqrt(5.0) / b), rel=1e-5)
    assert "per-record gradients clipped to norm L = 2.23607\n" in out and "restarts: gradient" in out
    assert "outputs:   (ε = 0.5, δ = 1e-05)" in out and "intrusion: (ε = 0.5, δ = 1e-05)" in out


def test_privacy_noise_to_guarantee(capsys) -> None:
    assert main(["privacy", "--noise-multiplier", "3.7306316348", "--delta", "1e-5"]) == 0
    out = capsys.readouterr().out
    # formulas.md reference value: σ ≈ 3.7306316348 for ε = 1, δ = 1e-5, Δ = 1.
    epsilon = float(re.search(r"epsilon = (\S+), delta", out).group(1))
    assert epsilon == pytest.approx(1.0, abs=1e-6)
    assert epsilon == pytest.approx(analytic_epsilon(3.7306316348, 1e-5), rel=1e-6)


@pytest.mark.statistical
def test_embedded_default_run_and_inspect(tmp_path, capsys) -> None:
    """What `make run` does (unpaced here): Adult through pan-private AC-SA, then the summary.

    The noise is NOT seeded: this is the production path (OS entropy per draw). Over 200 runs of
    the default learner (radius √105, restarts) the test accuracy had mean 81.1 % and standard
    deviation 0.69 % (minimum 79.0 %); the assertion > 77 % is 5.9 standard deviations below the
    mean, a false-failure probability below 1e-8 under a normal approximation.
    """
    out = tmp_path / "out"
    assert main(["-q", "run", "--rate", "0", "--metrics-port", "0", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "panpriv run: finished" in text
    assert "records learned 32,561; rejected 0" in text
    accuracy = {name: float(value) for name, value in re.findall(r"^\s+(pan-acsa|non-private|majority).*?([\d.]+)%$", text, re.MULTILINE)}
    assert accuracy["majority"] == pytest.approx(76.38, abs=0.01)  # 12,435 of 16,281 test records earn <=50K
    assert 80.0 < accuracy["non-private"] < 90.0
    assert accuracy["pan-acsa"] > 77.0  # better than the majority class (see the docstring)
    assert "everything released is (ε = 1, δ = 1e-06)-differentially private per record" in text
    assert str(out / "checkpoints" / "checkpoint.json") in text and str(out / "snapshots.jsonl") in text
    snapshots = [json.loads(line) for line in (out / "snapshots.jsonl").read_text().splitlines()]
    assert snapshots[-1]["records"] == 32_561 and len(snapshots[-1]["params"]) == 106  # 105 features and the intercept

    assert main(["inspect", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "adult:train: next 32562; [0, 32562) x1" in summary  # the trailing blank line is charged too
    assert "record counts never decrease: yes" in summary

    # The last snapshot serves: plain Python, `panpriv predict` and scikit-learn give the service's own scoring.
    X_test, y_test = adult.load("test")
    served = load_snapshot(out / "snapshots.jsonl")
    labels = served.predict_many(X_test)
    assert float(np.mean(labels == y_test)) * 100 == pytest.approx(accuracy["pan-acsa"], abs=0.005)
    predictions = tmp_path / "predictions.jsonl"
    assert main(["predict", "--snapshot", str(out / "snapshots.jsonl"), "--source", "adult:test", "--out", str(predictions)]) == 0
    err = capsys.readouterr().err
    assert "scored 16,281 records (0 rejected)" in err
    balanced = 0.5 * (np.mean(labels[y_test > 0] > 0) + np.mean(labels[y_test < 0] < 0))
    assert f"balanced accuracy {balanced:.2%}" in err
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    np.testing.assert_array_equal([line["prediction"] for line in lines], labels)
    np.testing.assert_allclose([line["probability"] for line in lines], served.predict_proba_many(X_test), rtol=1e-15)
    np.testing.assert_array_equal(served.to_sklearn().predict(X_test), labels)  # every Adult row is inside the bound


def test_global_flags_work_before_and_after_the_subcommand() -> None:
    parser = build_parser()
    assert parser.parse_args(["run", "-q"]).quiet is True
    assert parser.parse_args(["-q", "run"]).quiet is True
    assert parser.parse_args(["run"]).quiet is False
    assert parser.parse_args(["inspect", "x", "--quiet"]).quiet is True


def test_the_resume_hint_is_one_shell_command_whatever_the_arguments_hold(tmp_path) -> None:
    """`&`, `?` and spaces in a URL or path survive a copy-paste of the hint into a shell; the
    arguments are those after the subcommand even when a global flag came first."""
    argv = ["-q", "run", "--source", "synthetic:n=10&dim=3&seed=1", "--dim", "3"]
    args = argparse.Namespace(argv=_after_command(argv))
    hint = "panpriv run " + shlex.join(_resume_args(args, types.SimpleNamespace(out=tmp_path / "a b?")))
    assert shlex.split(hint) == [
        "panpriv", "run", "--source", "synthetic:n=10&dim=3&seed=1", "--dim", "3", "--out", str(tmp_path / "a b?"),
    ]


def test_privacy_json_is_the_text_answer_as_data(capsys) -> None:
    assert main(["privacy", "--n", "5000", "--dim", "3", "--feature-bound", "1", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["learner"] == "pan-acsa" and answer["n"] == 5000
    assert answer["privacy"]["output"] == {"epsilon": 1.0, "delta": 1e-06}
    assert answer["noise"][0].startswith("records per run: 5,000; batches T = ")
    assert main(["privacy", "--noise-multiplier", "2", "--delta", "1e-5", "--json"]) == 0
    gaussian = json.loads(capsys.readouterr().out)
    assert gaussian["epsilon"] == pytest.approx(analytic_epsilon(2.0, 1e-5, 1.0))


def test_privacy_warns_when_pnsgd_noise_swamps_the_model(capsys) -> None:
    """Issue 17: the warning PNSGD gives about its noise is printed, and is in the JSON answer."""
    argv = ["privacy", "--learner", "pnsgd", "--n", "100000", "--dim", "20", "--options", '{"eta": 0.5}']
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "WARNING: pnsgd: one step's noise alone moves the iterate by" in out and "at every step" in out
    assert main([*argv, "--json"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert warning.startswith("pnsgd: one step's noise alone")
    assert main(["privacy", "--json"]) == 0  # pan-acsa on Adult: nothing to warn about
    assert json.loads(capsys.readouterr().out)["warnings"] == []


@pytest.mark.parametrize(("learner", "argv"), [
    ("shuffle-gaussian", ["--dim", "100", "--epsilon", "16"]),
    ("checkin", ["--dim", "20"]),
])
def test_privacy_warns_when_the_noise_dominates_each_step(capsys, learner, argv) -> None:
    """Issue 17: shuffle-gaussian and checkin warn, from the plan alone, when the noise in a step's
    mean message exceeds the clipped gradient (ρ > 1); printed, and listed in the JSON answer,
    with the learner's own ρ; a configuration with ρ < 1 has no warning."""
    full = ["privacy", "--learner", learner, "--n", "100000", *argv]
    assert main(full) == 0
    out = capsys.readouterr().out
    assert f"WARNING: {learner}: the noise in each step's mean gradient is rho = " in out
    assert main([*full, "--json"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    config = load_config(None, {"source.url": "synthetic:n=1&dim=1", "records.format": "json", "records.dim": int(argv[1]),
                                "records.feature_bound": 1.0,
                                "learner.name": learner, "learner.epsilon": float(argv[3]) if len(argv) > 2 else 1.0})
    assert f"= {build_learner(config, 100000).noise_to_signal():.3g} x the largest clipped gradient" in warning
    quiet = ["privacy", "--learner", "shuffle-gaussian", "--n", "100000", "--dim", "20", "--options", '{"batch_size": 1024}', "--json"]
    assert main(quiet) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
