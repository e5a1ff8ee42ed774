"""panpriv.streamer.runtime.learners: the catalogue's names and classes, building from config sections, and clear failures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from panpriv.accounting.ledger import PrivacyLedger
from panpriv.protocols.catalogue import CATALOGUE
from panpriv.streamer.config import LEARNER_NAMES, load_config
from panpriv.streamer.errors import ConfigError, LearnerUnavailableError
from panpriv.streamer.runtime.learners import build_learner, constructor_arguments, learner_class, restore_learner
from panpriv.streamer.runtime.processor import Processor
from panpriv.streamer.runtime.recorded_driver import reads_by_index
from panpriv.streamer.runtime.stream_driver import StreamDriver
from panpriv.streamer.state.checkpoint import CheckpointStore

SYNTHETIC = {"source.url": "synthetic:n=6000&dim=4&seed=2", "records.dim": 4, "records.feature_bound": 1.0}


def test_every_catalogued_name_is_a_cli_name_and_its_class_agrees() -> None:
    assert tuple(CATALOGUE) == LEARNER_NAMES
    for name in CATALOGUE:
        assert learner_class(name).name == name


def test_unknown_and_broken_entries_fail_clearly(monkeypatch) -> None:
    with pytest.raises(LearnerUnavailableError, match="unknown learner 'nope'; choose one of pan-acsa"):
        learner_class("nope")
    monkeypatch.setitem(CATALOGUE, "shuffle-gd", "panpriv.protocols.no_such_module:ShuffleGD")
    with pytest.raises(LearnerUnavailableError, match="catalogued but its module panpriv.protocols.no_such_module is missing"):
        learner_class("shuffle-gd")
    monkeypatch.setitem(CATALOGUE, "shuffle-gd", "panpriv.protocols.shuffle_gd:NoSuchClass")
    with pytest.raises(LearnerUnavailableError, match="panpriv.protocols.shuffle_gd has no NoSuchClass"):
        learner_class("shuffle-gd")
    monkeypatch.setitem(CATALOGUE, "shuffle-gd", "panpriv.protocols.shuffle_sgd:ShuffleSGD")
    with pytest.raises(LearnerUnavailableError, match="name is 'shuffle-sgd', catalogued as 'shuffle-gd'"):
        learner_class("shuffle-gd")


def test_common_settings_reach_the_constructor() -> None:
    config = load_config(None, {**SYNTHETIC, "learner.epsilon": 0.5, "learner.options": {"radius": 3.0}})
    arguments = constructor_arguments(config, 6000)
    assert arguments == {"dim": 4, "feature_bound": 1.0, "epsilon": 0.5, "delta": 1e-6, "horizon": 6000, "radius": 3.0}
    learner = build_learner(config, 6000)
    assert learner.config()["horizon"] == 6000 and learner.config()["radius"] == 3.0


def test_the_readme_python_example_is_the_cli_default_learner() -> None:
    """The README's snippet, ``PanPrivateACSA(dim=20, loss="logistic", epsilon=1.0, delta=1e-6,
    horizon=100_000)``, and ``panpriv run --dim 20 --n 100000``: the same learner."""
    from panpriv.protocols.pan_acsa import PanPrivateACSA

    python = PanPrivateACSA(dim=20, loss="logistic", epsilon=1.0, delta=1e-6, horizon=100_000)
    config = load_config(None, {"source.url": "synthetic:n=100000&dim=20", "records.dim": 20,
                                "records.feature_bound": 1.0, "learner.n": 100_000})
    assert build_learner(config, 100_000).config() == python.config()
    assert python.radius == math.sqrt(20) and python.loss.intercept and python.param_count == 21


@pytest.mark.parametrize(
    ("options", "loss"),
    [({"loss": {"intercept": False}}, {"name": "logistic", "intercept": False}),
     ({"loss": "hinge"}, {"name": "hinge", "intercept": True}),
     ({"loss": {"name": "squared", "label_bound": 2.0}}, {"name": "squared", "intercept": True, "label_bound": 2.0})],
)
def test_a_loss_option_is_completed_by_the_learners_defaults(options, loss) -> None:
    """A loss named, or a loss table without ``intercept`` or ``name``, gets the learners' defaults
    (panpriv.protocols.losses.learner_loss): what ``--no-intercept`` and ``--set loss.name=…`` give."""
    learner = build_learner(load_config(None, {**SYNTHETIC, "learner.options": options}), 6000)
    config = learner.config()["loss"]
    assert {k: config[k] for k in loss} == loss


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"learner.options": {"radiuss": 1.0}}, "learner.options.radiuss: PanPrivateACSA has no parameter 'radiuss'"),
        ({"learner.options": {"epsilon": 1.0}}, "learner.options.epsilon: set it through its own setting"),
        ({"learner.options": {"radius": -1.0}}, "The 'radius' parameter of PanPrivateACSA must be"),
    ],
)
def test_bad_options_are_named(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_learner(load_config(None, {**SYNTHETIC, **overrides}), 6000)


def test_pnsgd_runs_resumes_and_accounts_its_releases(tmp_path, monkeypatch, caplog) -> None:
    """OnlinePNSGD's guarantee depends on when snapshots are released (Sordello et al. 2021 Thm 7 with
    release-following accounting): the release is taken before the checkpoint that holds it. Its
    warning that the noise swamps the model (issue 17) is logged before it learns."""
    overrides = {**SYNTHETIC, "learner.name": "pnsgd", "learner.options": {"eta": 0.5, "radius": 2.0},
                 "source.batch_records": 500, "checkpoint.every_records": 1000, "snapshots.every_records": 1000,
                 "metrics.port": None, "out": str(tmp_path / "out")}
    original = StreamDriver._process
    calls = {"n": 0}

    def stop_after_five(self, batch):
        calls["n"] += 1
        learned = original(self, batch)
        if calls["n"] == 5:
            self._stop.set()  # a stop request: the driver sees it before it polls (and charges) another batch
        return learned

    monkeypatch.setattr(StreamDriver, "_process", stop_after_five)
    first = Processor(load_config(None, overrides)).run()
    monkeypatch.undo()
    assert first.outcome == "stopped" and first.records == 2500
    assert any(r.levelname == "WARNING" and "one step's noise alone moves the iterate" in r.getMessage()
               for r in caplog.records)
    final = Processor(load_config(None, overrides)).run()
    assert final.outcome == "finished" and final.records == 6000
    checkpoint = CheckpointStore(tmp_path / "out" / "checkpoints").load()
    segments = PrivacyLedger.from_dict(checkpoint.ledger).coverage("synthetic:seed=2,dim=4")
    assert [(s.start, s.stop, len(s.uses)) for s in segments] == [(0, 6000, 1)]
    # The report is the learner's, composed by the ledger: ε as configured, δ from Sordello et al.'s bound.
    assert final.report.output.epsilon == 1.0 and 0.0 < final.report.output.delta < 1.0
    assert final.report == final.report.__class__.from_dict(final.last_snapshot["privacy"])


STREAMING = sorted(name for name in CATALOGUE if not reads_by_index(learner_class(name)))


@pytest.mark.parametrize("name", STREAMING)
def test_every_registered_learner_streams_stops_and_resumes_exactly_once(name, tmp_path, monkeypatch, caplog) -> None:
    """Learners that read a recording by index are tested in tests/streamer/test_replay.py. The
    learner's utility warnings (issue 17; checkin's and shuffle-gaussian's at this d) are logged
    before it learns."""
    # The shuffle learners' "paper" calibration is quicker to set up than "tight" (the default).
    options = {"pnsgd": {"eta": 0.5, "radius": 2.0}, "shuffle-sgd": {"calibration": "paper"},
               "shuffle-acsa": {"calibration": "paper"}}.get(name, {})
    overrides = {**SYNTHETIC, "learner.name": name, "learner.options": options, "source.batch_records": 300,
                 "checkpoint.every_records": 700, "snapshots.every_records": 1500, "metrics.port": None,
                 "out": str(tmp_path / "out")}
    original = StreamDriver._process
    calls = {"n": 0}

    def stop_after_seven(self, batch):
        calls["n"] += 1
        learned = original(self, batch)
        if calls["n"] == 7:
            self._stop.set()  # a stop request: the driver sees it before it polls (and charges) another batch
        return learned

    monkeypatch.setattr(StreamDriver, "_process", stop_after_seven)
    assert Processor(load_config(None, overrides)).run().records == 2100
    monkeypatch.undo()
    result = Processor(load_config(None, overrides)).run()
    assert (result.outcome, result.records) == ("finished", 6000)
    checkpoint = CheckpointStore(tmp_path / "out" / "checkpoints").load()
    assert (checkpoint.learner, checkpoint.records) == (name, 6000)
    segments = PrivacyLedger.from_dict(checkpoint.ledger).coverage("synthetic:seed=2,dim=4")
    assert [(s.start, s.stop, len(s.uses)) for s in segments] == [(0, 6000, 1)]
    assert result.report.output.is_meaningful
    warnings = build_learner(load_config(None, overrides), 6000).utility_warnings()
    assert bool(warnings) == (name in ("checkin", "pnsgd", "shuffle-gaussian"))
    logged = {r.getMessage() for r in caplog.records if r.levelname == "WARNING"}
    assert set(warnings) <= logged


def test_pan_acsa_secure_noise_streams_checkpoints_and_resumes(tmp_path) -> None:
    """``[learner.options] noise = "secure"`` reaches the learner; its int64 accumulator is written to
    the checkpoint as integers and rebuilds the learner; the report states the discrete Gaussian."""
    overrides = {**SYNTHETIC, "learner.name": "pan-acsa", "learner.options": {"noise": "secure"},
                 "source.batch_records": 300, "checkpoint.every_records": 700, "snapshots.every_records": 1500,
                 "metrics.port": None, "out": str(tmp_path / "out")}
    result = Processor(load_config(None, overrides)).run()
    assert (result.outcome, result.records) == ("finished", 6000)
    checkpoint = CheckpointStore(tmp_path / "out" / "checkpoints").load()
    assert checkpoint.learner_config["noise"] == "secure"
    assert not {"grad", "grad_units", "filled"} & set(checkpoint.learner_state)  # a batch boundary: no accumulator
    rebuilt = learner_class("pan-acsa").from_state_dict(checkpoint.learner_config, checkpoint.learner_state)
    assert rebuilt.records_seen == checkpoint.records and rebuilt._grad.dtype == "int64"
    assert any(a.startswith("secure noise") for a in result.report.assumptions)
    assert any("Canonne" in r for r in result.report.references)


def test_option_errors_of_a_recorded_learner_come_before_the_scan(tmp_path, monkeypatch) -> None:
    """Issue 38: a learner that reads a recording by index used to scan the whole file before the
    options were checked; now the scan is not even started."""
    import panpriv.streamer.runtime.processor as processor

    def no_scan(*args, **kwargs):
        raise AssertionError("the recording was scanned before the options were checked")

    monkeypatch.setattr(processor, "open_indexed", no_scan)
    data = tmp_path / "records.jsonl"
    data.write_text('{"x": [0.1, 0.2, 0.3, 0.4], "y": 1}\n')
    config = load_config(None, {"source.url": f"file:{data}", "records.dim": 4, "records.feature_bound": 1.0,
                                "learner.name": "shuffled-pnsgd", "learner.options": {"etaa": 0.1},
                                "metrics.port": None, "out": str(tmp_path / "out")})
    with pytest.raises(ConfigError, match="learner.options.etaa: ShuffledPNSGD has no parameter 'etaa'"):
        Processor(config).run()
def test_a_seeded_state_is_not_restored_with_its_seed() -> None:
    """restore_learner (and Learner.from_state_dict) refuse a seed for a state that has learned
    records: the seed restarts the noise stream, so the restored learner's first draw would be the
    first draw already added to what was released (shown here: a fresh learner with the seed
    draws exactly it). Without a seed, or for a state with no records, it restores."""
    config = {"dim": 3, "loss": "logistic", "epsilon": 1.0, "delta": 1e-5, "horizon": 40, "batch_size": 4}
    X = np.full((8, 3), 0.1)
    y = np.ones(8)
    seeded = learner_class("pan-acsa")(**config, rng=7)
    seeded.learn_many(X[:3], y[:3])
    first_draw = seeded._grad.copy()
    seeded.learn_many(X[3:], y[3:])  # two batches: both released through theta
    state = seeded.state_dict()
    again = learner_class("pan-acsa")(**config, rng=7)
    again.learn_many(X[:3], y[:3])
    np.testing.assert_array_equal(again._grad, first_draw)  # what a resume with the seed would repeat
    with pytest.raises(ConfigError, match="refusing to resume a state that has learned 8 records with a seed"):
        restore_learner("pan-acsa", seeded.config(), state, 7)
    assert restore_learner("pan-acsa", seeded.config(), state, None).records_seen == 8
    fresh = learner_class("pan-acsa")(**config, rng=7).state_dict()
    assert restore_learner("pan-acsa", seeded.config(), fresh, 7).records_seen == 0
