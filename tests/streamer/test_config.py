"""panpriv.streamer.config: defaults, validation messages, TOML + flags, privacy-relevant hashing."""

from __future__ import annotations

import math

import pytest

from panpriv.streamer.config import (
    ADULT_DEMO,
    describe_changes,
    load_config,
    privacy_hash,
    privacy_relevant,
)
from panpriv.streamer.datasets import adult
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.runtime.learners import constructor_arguments

KAFKA = {"source.url": "kafka://127.0.0.1:9092/t", "records.dim": 3, "records.feature_bound": 1.0}


def test_defaults_resolve_the_embedded_adult_source() -> None:
    config = load_config()
    assert config.source.url == "adult:train"
    assert config.records.format == "adult"
    assert config.records.dim == adult.DIM == 105
    assert config.records.feature_bound == pytest.approx(math.sqrt(14))
    assert (config.learner.name, config.learner.epsilon, config.learner.delta) == ("pan-acsa", 1.0, 1e-6)


def test_demo_preset_and_flags_on_top() -> None:
    config = load_config(None, {"learner.epsilon": 0.5}, base=ADULT_DEMO)
    assert config.source.rate == 2000.0
    assert config.learner.options == {"radius": math.sqrt(105)}  # the public rule r = √p
    assert config.learner.epsilon == 0.5


def test_toml_file_then_flags(tmp_path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        """
[source]
url = "kafka://127.0.0.1:9092/a,b?group=g"
[records]
dim = 4
feature_bound = 2.0
[learner]
epsilon = 0.7
n = 1000
[learner.options]
radius = 3.0
[learner.options.loss]
name = "logistic"
ridge = 0.01
"""
    )
    config = load_config(path, {"learner.epsilon": 0.9, "learner.delta": None})
    assert config.records.format == "json"  # inferred for Kafka
    assert config.learner.epsilon == 0.9  # the flag wins
    assert config.learner.delta == 1e-6  # None flags are ignored
    assert config.learner.options["loss"] == {"name": "logistic", "ridge": 0.01}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"learner.epsilon": -1}, "learner.epsilon: Input should be greater than 0 (got -1)"),
        ({"learner.delta": 1.5}, "learner.delta: Input should be less than 1 (got 1.5)"),
        ({"learner.name": "nope"}, "learner.name: unknown learner 'nope'; choose one of pan-acsa, pnsgd"),
        ({"records.dimm": 3}, "records.dimm: unknown setting"),
        ({"source.url": "http://x"}, "source.url: must start with kafka://, file:, synthetic: or adult:"),
        ({"source.url": "kafka://h:1/t"}, "records.dim is required for format 'json'"),
        ({"source.url": "kafka://h:1/t", "records.dim": 2}, "records.feature_bound is required"),
        ({"records.dim": 7}, "records.dim must be 105 for format 'adult' (got 7)"),
        ({**KAFKA, "records.label_min": 2.0, "records.label_max": 1.0, "records.label_values": []}, "label_min (2.0) must be <= label_max (1.0)"),
        ({"source.url": "file:x.jsonl", "records.dim": 2, "records.feature_bound": 1, "source.dead_letter_topic": "d"}, "dead_letter_topic needs a kafka:// source"),
    ],
)
def test_invalid_settings_are_named(overrides, expected) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert expected in str(info.value)


def test_missing_and_broken_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[source\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_config_is_frozen() -> None:
    config = load_config()
    with pytest.raises(Exception):  # pydantic's ValidationError for frozen instances
        config.learner.epsilon = 2.0  # type: ignore[misc]


def _hash(config, n: int = 1000) -> tuple[dict, str]:
    relevant = privacy_relevant(config, constructor_arguments(config, n))
    return relevant, privacy_hash(relevant)


def test_privacy_hash_covers_mechanism_settings_and_names_changes() -> None:
    base_relevant, base_hash = _hash(load_config(None, KAFKA))
    changed = [
        {"learner.epsilon": 2.0},
        {"learner.delta": 1e-5},
        {"records.feature_bound": 2.0},
        {"records.dim": 4},
        {"learner.options": {"radius": 2.0}},
        {"learner.options": {"loss": {"name": "logistic", "ridge": 0.1}}},
        {"learner.seed": 3},
        {"learner.max_records_per_user": 2},
    ]
    for overrides in changed:
        relevant, digest = _hash(load_config(None, {**KAFKA, **overrides}))
        assert digest != base_hash, overrides
        assert describe_changes(base_relevant, relevant), overrides
    relevant, digest = _hash(load_config(None, KAFKA), n=2000)
    assert describe_changes(base_relevant, relevant) == ["learner.horizon: 1000 in the checkpoint, 2000 now"]
    # Not privacy-relevant: cadence, pacing, budget cap, metrics port, output directory.
    same = {"checkpoint.every_records": 5, "source.rate": 10.0, "learner.max_epsilon": 3.0, "metrics.port": 1234, "out": "/tmp/x"}
    assert _hash(load_config(None, {**KAFKA, **same}))[1] == base_hash


def test_the_configuration_page_lists_every_setting_and_loads() -> None:
    """docs/configuration.md lists every setting; its example must load as it is written."""
    import re
    import tomllib
    from pathlib import Path

    from panpriv.streamer.config import ServiceConfig

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", page, re.S).group(1)
    config = ServiceConfig.model_validate(tomllib.loads(block))
    documented = set(re.findall(r"^(?:# )?(\w+) =", block, re.MULTILINE)) | {"options", "consumer", "producer", "librdkafka"}  # tables
    for section in ("source", "records", "learner", "checkpoint", "snapshots", "metrics", "budget", "kafka"):
        fields = set(getattr(config, section).__class__.model_fields)
        assert fields <= documented, f"[{section}] settings missing from docs/configuration.md: {fields - documented}"
    top_level = set(ServiceConfig.model_fields) - {"source", "records", "learner", "checkpoint", "snapshots", "metrics", "budget", "kafka"}
    assert top_level <= documented, f"top-level settings missing from docs/configuration.md: {top_level - documented}"
