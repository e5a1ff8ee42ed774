"""The service configuration: frozen pydantic models, a TOML file, and CLI flags on top.

Sections (TOML tables) and what they decide:

- ``[source]`` — where records come from (``url``), pacing (``rate``, ``recorded_pace``),
  micro-batch size, whether to stop once a Kafka topic is caught up, dead-letter topic.
- ``[records]`` — how a record is encoded (``format``) and what a valid record is (``dim``,
  ``feature_bound``, labels); records are clipped to ``feature_bound`` before learning.
- ``[learner]`` — the learner name, the privacy target (``epsilon``, ``delta``), the public stream
  length ``n``, ``max_epsilon`` (stop before the composed guarantee would exceed it),
  ``max_records_per_user`` (declared, not enforced), a test-only ``seed``, and learner-specific ``options``.
- ``[checkpoint]``, ``[snapshots]``, ``[metrics]`` — cadence, sinks, HTTP endpoint.
- ``[kafka]`` — how to reach the cluster: TLS, SASL, client options (:class:`KafkaConfig`); used by
  every Kafka client of the process (source, dead letters, snapshot and budget topics, ``produce``,
  ``record``), secrets from the environment.
- ``[budget]`` — ``state_dir``, the directory of the budget store shared by every run, or
  ``kafka_topic``/``kafka_bootstrap`` to keep it on a compacted Kafka topic
  (:mod:`panpriv.streamer.budget.store`).
- top level: ``out`` (directory of checkpoints and snapshots), ``progress`` and ``status_interval_s``.

Privacy-relevant settings are those that change what the learner's noise protects or how it is
accounted: the whole ``[learner]`` section except ``max_epsilon`` (a stopping policy, not a
mechanism parameter), and the ``[records]`` settings that define the data domain
(``format``, ``dim``, ``feature_bound``, labels). :func:`privacy_relevant` lists them;
:func:`privacy_hash` hashes them into every checkpoint, and :func:`describe_changes` names the
settings that differ when a resume is refused.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from panpriv.protocols.catalogue import learner_names
from panpriv.protocols.defaults import DEFAULT_DELTA, DEFAULT_EPSILON
from panpriv.protocols.schema import FeatureSchema
from panpriv.streamer.datasets import adult
from panpriv.streamer.errors import ConfigError
from panpriv.streamer.io.source_url import SCHEMES, scheme_of
from panpriv.streamer.io.urls import redact

LEARNER_NAMES = learner_names()
"""Every learner name the CLI accepts, from :mod:`panpriv.protocols.catalogue`."""

RecordFormat = Literal["json", "csv", "binary", "adult", "json-batch", "ndjson", "csv-batch"]
"""``json-batch``, ``ndjson`` and ``csv-batch``: many records per message (:mod:`panpriv.streamer.io.batch_formats`)."""
ADULT_TRAIN_URL = "adult:train"
"""The embedded default source: the UCI Adult training set shipped as package data."""

OptionValue = bool | int | float | str
Options = dict[str, OptionValue | dict[str, OptionValue]]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceConfig(_Section):
    """Where records come from (see :mod:`panpriv.streamer.sources` for the URL forms)."""

    url: str = ADULT_TRAIN_URL
    rate: float | None = Field(default=None, gt=0, description="records per second; None = as fast as possible")
    recorded_pace: bool = Field(default=False, description="replay a recording at its recorded timestamps")
    batch_records: int = Field(default=1024, ge=1, le=1_000_000, description="most messages per micro-batch")
    batch_bytes: int = Field(
        default=8 * 2**20, ge=1, le=2**31,
        description="most payload bytes per micro-batch (at least one message): bounds memory whatever the "
        "message packing (binary batches of many records, large d)",
    )
    poll_timeout_s: float = Field(default=0.2, gt=0, le=60)
    stop_at_end: bool = Field(default=False, description="Kafka: exit once every partition of the topics is caught up")
    start: Literal["earliest", "latest"] = "earliest"
    dead_letter_topic: str | None = None
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=300_000)
    accept_offset_reset: bool = Field(default=False, description="Kafka: read on after a partition's offsets went back (panpriv.streamer.kafka.calls)")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        if scheme_of(url) not in SCHEMES:
            raise ValueError(
                "must start with kafka://, file:, synthetic: or adult:"
            )
        return url

    @model_validator(mode="after")
    def _dead_letter_needs_kafka(self) -> SourceConfig:
        if self.dead_letter_topic is not None and scheme_of(self.url) != "kafka":
            raise ValueError("dead_letter_topic needs a kafka:// source (it is produced to the same cluster)")
        return self


class RecordsConfig(_Section):
    """What a record looks like and what a valid one is."""

    format: RecordFormat | None = Field(default=None, description="None: inferred from the source")
    x_field: str = "x"
    y_field: str = "y"
    csv_label_column: int = Field(default=-1, description="index of the label among a CSV row's fields")
    csv_header: bool = Field(default=False, description="the first line of a CSV file is a header (column names)")
    schema_file: Path | None = Field(
        default=None, description="a JSON or TOML file mapping named fields to features (panpriv.protocols.schema); sets 'fields'"
    )
    fields: dict[str, Any] | None = Field(
        default=None,
        description="named fields (JSON objects, CSV with a header) mapped to features: 'features', 'label', 'id', "
        "'ignore', 'unknown' (panpriv.protocols.schema); sets dim, and feature_bound when every number has bounds",
    )
    dim: int | None = Field(default=None, ge=1, le=1_000_000)
    feature_bound: float | None = Field(default=None, gt=0, description="records are clipped to ‖x‖₂ ≤ feature_bound")
    label_values: tuple[float, ...] | None = Field(
        default=(-1.0, 1.0), description="allowed labels; [] (or None) = any label in [label_min, label_max]"
    )
    label_min: float = -math.inf
    label_max: float = math.inf
    guard_records: int = Field(
        default=1000, ge=0, description="stop if the first this-many records are nearly all rejected (0: off; panpriv.streamer.runtime.reject_guard)"
    )
    guard_ratio: float = Field(default=0.99, gt=0, le=1, description="the rejected share that stops the run")

    @field_validator("feature_bound", "label_min", "label_max")
    @classmethod
    def _not_nan(cls, value: float | None) -> float | None:
        if value is not None and math.isnan(value):
            raise ValueError("must not be NaN")
        return value

    @field_validator("label_values")
    @classmethod
    def _finite_labels(cls, values: tuple[float, ...] | None) -> tuple[float, ...] | None:
        if not values:  # TOML has no null: an empty list means "no fixed set"
            return None
        if not all(math.isfinite(v) for v in values):
            raise ValueError("must be a list of finite numbers ([] for any label in [label_min, label_max])")
        return values

    @model_validator(mode="after")
    def _label_range(self) -> RecordsConfig:
        if not self.label_min <= self.label_max:
            raise ValueError(f"label_min ({self.label_min}) must be <= label_max ({self.label_max})")
        return self

    @model_validator(mode="after")
    def _resolve_schema(self) -> RecordsConfig:
        """Read ``schema_file`` into ``fields`` and take ``dim`` (and, when every number has
        public bounds, ``feature_bound``) from the schema."""
        if self.schema_file is not None:
            if self.fields is not None:
                raise ValueError("give records.schema_file or records.fields, not both")
            object.__setattr__(self, "fields", FeatureSchema.load(self.schema_file).to_dict())
        if self.fields is None:
            return self
        schema = FeatureSchema.from_dict(self.fields)
        if self.dim not in (None, schema.dim):
            raise ValueError(f"records.dim is {self.dim} but the schema's features take {schema.dim} positions")
        object.__setattr__(self, "dim", schema.dim)
        object.__setattr__(self, "fields", schema.to_dict())
        if self.feature_bound is None:
            object.__setattr__(self, "feature_bound", schema.natural_bound())
        return self


class LearnerConfig(_Section):
    """The learner and its privacy target."""

    name: str = "pan-acsa"
    epsilon: float = Field(default=DEFAULT_EPSILON, gt=0, allow_inf_nan=False)
    delta: float = Field(default=DEFAULT_DELTA, gt=0, lt=1)
    n: int | None = Field(default=None, ge=1, description="public stream length; None = from a finite source")
    max_epsilon: float | None = Field(
        default=None, gt=0, allow_inf_nan=False,
        description="stop before the ε of the output guarantee, or of a claimed intrusion guarantee, would exceed this",
    )
    max_records_per_user: int | None = Field(
        default=None, ge=1, description="DECLARED, NOT ENFORCED: records per user, for the group-privacy figures"
    )
    accept_larger_delta: bool = Field(
        default=False,
        description="let a learner whose guarantee can exceed 'delta' (PNSGD, shuffle-gd's intrusion) run; "
        "otherwise it is refused at start (panpriv.streamer.runtime.delta_target)",
    )
    seed: int | None = Field(default=None, ge=0, description="TEST/REPLAY ONLY: seeded noise is not pan-private")
    options: Options = Field(default_factory=dict, description="learner-specific constructor arguments")

    @field_validator("name")
    @classmethod
    def _catalogued(cls, name: str) -> str:
        if name not in LEARNER_NAMES:
            raise ValueError(f"unknown learner {name!r}; choose one of {', '.join(LEARNER_NAMES)}")
        return name


class CheckpointConfig(_Section):
    every_records: int = Field(default=10_000, ge=1)
    every_seconds: float = Field(default=10.0, gt=0)


class SnapshotConfig(_Section):
    every_records: int = Field(default=10_000, ge=1, description="a snapshot follows a checkpoint at most this often")
    jsonl: bool = True
    kafka_topic: str | None = None
    kafka_bootstrap: str | None = Field(default=None, description="default: the kafka source's brokers")
    holdout: Path | None = Field(
        default=None, description="a PUBLIC labelled file (same format as the source) each snapshot is scored on"
    )


class MetricsConfig(_Section):
    port: int | None = Field(default=9477, ge=1, le=65535, description="None: no HTTP endpoint")
    addr: str = "127.0.0.1"
    lag_interval_s: float = Field(
        default=2.0, gt=0, le=3600, description="Kafka: refresh the consumer lag this often between checkpoints"
    )
    textfile: Path | None = Field(
        default=None, description="also write every series to this file at the end of the run (node_exporter textfile collector)"
    )


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
KAFKA_ENV_PREFIX = "PANPRIV_KAFKA__"
"""``PANPRIV_KAFKA__SASL_PASSWORD=…`` sets ``[kafka] sasl_password`` (any scalar setting of the
section, upper-cased), over the file: secrets stay out of files and command lines."""


class KafkaConfig(_Section):
    """How every Kafka client of the process reaches the cluster (TLS, SASL, client options).

    Secrets (``sasl_password``, ``ssl_password``) are :class:`pydantic.SecretStr`: their ``repr``
    and ``str`` are ``**********``, and nothing that leaves the process (logs, metrics,
    checkpoints, the privacy hash) contains this section. Give them through the environment
    (:data:`KAFKA_ENV_PREFIX`) or name the variable holding them (``sasl_password_env``).
    ``consumer`` and ``producer`` are passed to the client unchanged (kafka-python's option names,
    e.g. ``fetch_max_bytes``, ``compression_type``); the options that decide correctness
    (offsets, group, security) are set by panpriv or by the fields above and refused there.
    """

    client: Literal["kafka-python", "confluent"] = Field(
        default="kafka-python", description="the source's client library; confluent: confluent-kafka (librdkafka), pip install confluent-kafka"
    )
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = Field(default=None, description="prefer PANPRIV_KAFKA__SASL_PASSWORD or sasl_password_env")
    sasl_password_env: str | None = Field(default=None, description="name of the environment variable holding the SASL password")
    ssl_cafile: Path | None = Field(default=None, description="CA bundle (PEM) that signed the brokers' certificates; None: the system's")
    ssl_certfile: Path | None = Field(default=None, description="client certificate (PEM), for mutual TLS")
    ssl_keyfile: Path | None = Field(default=None, description="client private key (PEM), for mutual TLS")
    ssl_password: SecretStr | None = Field(default=None, description="password of ssl_keyfile")
    ssl_check_hostname: bool = True
    connect_timeout_s: float = Field(default=30.0, gt=0, le=3600, description="start-up: wait this long for a broker to answer")
    consumer: dict[str, OptionValue] = Field(default_factory=dict, description="extra kafka-python consumer options")
    producer: dict[str, OptionValue] = Field(default_factory=dict, description="extra kafka-python producer options")
    librdkafka: dict[str, OptionValue] = Field(
        default_factory=dict, description="client = confluent: extra librdkafka properties of the source's consumer"
    )

    @model_validator(mode="after")
    def _consistent(self) -> KafkaConfig:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl:
            if self.sasl_mechanism is None:
                raise ValueError(f"security_protocol {self.security_protocol} needs sasl_mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)")
            if not self.sasl_username:
                raise ValueError(f"security_protocol {self.security_protocol} needs sasl_username")
            if self.password() is None:
                where = f"the environment variable {self.sasl_password_env}" if self.sasl_password_env else f"{KAFKA_ENV_PREFIX}SASL_PASSWORD"
                raise ValueError(f"security_protocol {self.security_protocol} needs a SASL password: set {where}")
        elif self.sasl_mechanism is not None or self.sasl_username is not None:
            raise ValueError(f"sasl_mechanism/sasl_username are set but security_protocol is {self.security_protocol}; use SASL_SSL (or SASL_PLAINTEXT)")
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None:
                if not self.security_protocol.endswith("SSL"):
                    raise ValueError(f"{name} is set but security_protocol is {self.security_protocol}; use SSL or SASL_SSL")
                if not Path(path).is_file():
                    raise ValueError(f"{name}: file {path} does not exist")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together (mutual TLS needs both)")
        return self

    def password(self) -> str | None:
        """The SASL password: ``sasl_password``, else the variable named by ``sasl_password_env``."""
        if self.sasl_password is not None:
            return self.sasl_password.get_secret_value()
        if self.sasl_password_env:
            return os.environ.get(self.sasl_password_env) or None
        return None


class BudgetConfig(_Section):
    """Where the privacy budget shared by every run lives (:mod:`panpriv.streamer.budget.store`)."""

    state_dir: Path | None = Field(
        default=None,
        description="directory of the budget store; None: $PANPRIV_STATE_DIR, else $XDG_STATE_HOME/panpriv, "
        "else ~/.local/state/panpriv",
    )
    kafka_topic: str | None = Field(
        default=None, description="keep the budget store on this compacted Kafka topic instead (several machines)"
    )
    kafka_bootstrap: str | None = Field(default=None, description="default: the kafka source's brokers")


class ServiceConfig(_Section):
    """The whole configuration of one ``panpriv run``."""

    out: Path | None = Field(default=None, description="checkpoints and snapshots; None: out/<learner>-<time>")
    progress: Literal["auto", "on", "off"] = "auto"
    status_interval_s: float = Field(
        default=30.0, ge=0, le=86_400, description="without the progress bar, log a status line this often (0: never; panpriv.streamer.runtime.status)"
    )
    source: SourceConfig = SourceConfig()
    records: RecordsConfig = RecordsConfig()
    learner: LearnerConfig = LearnerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    snapshots: SnapshotConfig = SnapshotConfig()
    metrics: MetricsConfig = MetricsConfig()
    budget: BudgetConfig = BudgetConfig()
    kafka: KafkaConfig = KafkaConfig()

    @model_validator(mode="after")
    def _resolve_records(self) -> ServiceConfig:
        """Infer the record format from the source and fill the Adult schema's public constants."""
        records = self.records
        fmt = records.format or _infer_format(self.source.url)
        updates: dict[str, Any] = {"format": fmt}
        if fmt == "adult":
            if records.dim not in (None, adult.DIM):
                raise ValueError(f"records.dim must be {adult.DIM} for format 'adult' (got {records.dim})")
            updates["dim"] = adult.DIM
            if records.feature_bound is None:
                updates["feature_bound"] = adult.FEATURE_BOUND
            if records.label_values not in (None, (-1.0, 1.0)):
                raise ValueError("records.label_values must be [-1, 1] for format 'adult'")
            updates["label_values"] = (-1.0, 1.0)
        else:
            if records.dim is None:
                raise ValueError(f"records.dim is required for format {fmt!r} (the feature dimension)")
            if records.feature_bound is None:
                raise ValueError(
                    f"records.feature_bound is required for format {fmt!r} "
                    "(a PUBLIC bound on ‖x‖₂; records are clipped to it, and it must not be computed from the data)"
                )
        if records.fields is not None and fmt not in ("json", "csv", "json-batch", "ndjson"):
            raise ValueError(f"records.fields (a schema of named fields) reads JSON objects or CSV rows, not format {fmt!r}"
                             + (" (a csv-batch message carries no header line to name its columns)" if fmt == "csv-batch" else ""))
        if records.fields is not None and fmt == "csv":  # named columns: the header names them
            if "csv_header" in records.model_fields_set and not records.csv_header:
                raise ValueError("a CSV source read with a schema needs its header line (records.csv_header = true)")
            updates["csv_header"] = True
        if scheme_of(self.source.url) == "adult" and fmt != "adult":
            raise ValueError("records.format must be 'adult' for an adult: source")
        object.__setattr__(self, "records", records.model_copy(update=updates))
        return self


def _infer_format(url: str) -> RecordFormat:
    scheme = scheme_of(url)
    if scheme == "adult":
        return "adult"
    if scheme == "file" and url.split("?")[0].removesuffix(".gz").endswith(".csv"):
        return "csv"
    return "json"


# -- loading ------------------------------------------------------------------------------------


ADULT_RADIUS = math.sqrt(adult.DIM)
"""Radius of Θ for the Adult demo, by a public rule: r = √p makes Θ contain every weight vector with
|θ_j| ≤ 1 for all p = 105 features (each in [0, 1], one-hot or a scaled range) — at most one
e-fold change of the odds per feature. Chosen before looking at the data's accuracy; radii 4, 16
and 32 are compared in ``benchmarks/utility_pan_acsa.py`` only to show the sensitivity."""

ADULT_DEMO: dict[str, Any] = {
    "source": {"url": ADULT_TRAIN_URL, "rate": 2000.0},
    "learner": {"name": "pan-acsa", "epsilon": 1.0, "delta": 1e-6, "options": {"radius": ADULT_RADIUS}},
    "checkpoint": {"every_records": 4096, "every_seconds": 5.0},
    "snapshots": {"every_records": 8192, "holdout": str(adult.TEST_PATH)},
}
"""The embedded default of ``panpriv run`` with neither ``--config`` nor ``--source``: replay the
UCI Adult training set through pan-private AC-SA at ε = 1, δ = 1e-6, radius :data:`ADULT_RADIUS`,
each snapshot scored on the public test split (``--holdout``, :mod:`panpriv.streamer.serving.holdout`).

The replay is paced at 2,000 records/s (about 16 s for 32,561 records) so that the progress line
and the live metrics can be watched; ``--rate 0`` replays as fast as possible.
"""


def load_config(
    path: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    base: Mapping[str, Any] | None = None,
) -> ServiceConfig:
    """Start from ``base`` (nested dict, e.g. :data:`ADULT_DEMO`), read ``path`` (TOML) over it if
    given, apply ``overrides`` (dotted keys such as ``"learner.epsilon"``, from CLI flags; ``None``
    values are ignored), and validate.

    Raises :class:`ConfigError` whose message lists every invalid setting by its dotted name,
    the constraint, and the value received.
    """
    data: dict[str, Any] = copy.deepcopy(dict(base or {}))
    if path is not None:
        try:
            data = _merge(data, tomllib.loads(Path(path).read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    _apply_kafka_environment(data)
    try:
        return ServiceConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, path)) from None


def _apply_kafka_environment(data: dict[str, Any]) -> None:
    """Set ``data["kafka"][name]`` from every ``PANPRIV_KAFKA__NAME`` variable (:data:`KAFKA_ENV_PREFIX`)."""
    # Kept by hand rather than pydantic-settings (issue 36): only the [kafka] section may come from
    # the environment (secrets), and it must win over the file. pydantic-settings reads the
    # environment for a whole BaseSettings model — the top one here, since a nested section is
    # validated, not constructed — so PANPRIV_LEARNER__EPSILON would change a privacy parameter
    # from outside the file and the flags; and its init values (the file) outrank the environment
    # unless its sources are reordered. Those two rules would take more code than these lines.
    for variable, value in os.environ.items():
        if variable.startswith(KAFKA_ENV_PREFIX):
            data.setdefault("kafka", {})[variable.removeprefix(KAFKA_ENV_PREFIX).lower()] = value


def load_kafka_config(path: Path | None = None) -> KafkaConfig:
    """The ``[kafka]`` section of ``path`` (other sections ignored) with the environment over it,
    for the commands that only talk to Kafka (``produce``, ``record``, ``budget --budget-kafka``)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = {"kafka": tomllib.loads(Path(path).read_text(encoding="utf-8")).get("kafka", {})}
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    _apply_kafka_environment(data)
    try:
        return KafkaConfig.model_validate(data.get("kafka", {}))
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, path).replace("\n  ", "\n  kafka.")) from None


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, table by table."""
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _format_errors(exc: ValidationError, path: Path | None) -> str:
    where = f" in {path}" if path is not None else ""
    lines = [f"invalid configuration{where}:"]
    for error in exc.errors():
        name = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown setting (check the spelling; see README 'Configuring')"
        value = error.get("input")
        secret = "password" in name  # never echo a secret, even a malformed one
        shown = "" if isinstance(value, dict) or secret else f" (got {redact(repr(value))})"
        lines.append(f"  {name}: {message}{shown}" if name else f"  {message}")
    return "\n".join(lines)


# -- privacy-relevant settings ------------------------------------------------------------------


def privacy_relevant(config: ServiceConfig, learner_arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that define the mechanism and its accounting, flat and JSON-ready.

    ``learner_arguments`` are the learner's effective constructor arguments (defaults included,
    :func:`panpriv.streamer.runtime.learners.constructor_arguments`), so a changed default is caught too. Keys are
    dotted names (``"learner.epsilon"``, ``"learner.loss.ridge"``, ``"records.feature_bound"``) so
    that a change is named precisely.
    """
    learner = config.learner
    records = config.records
    flat: dict[str, Any] = {
        "learner.name": learner.name,
        "learner.max_records_per_user": learner.max_records_per_user,
        "learner.seed": learner.seed,
        "records.format": records.format,
        "records.dim": records.dim,
        "records.feature_bound": records.feature_bound,
        "records.label_values": None if records.label_values is None else list(records.label_values),
        "records.label_min": _json_float(records.label_min),
        "records.label_max": _json_float(records.label_max),
    }
    if records.fields is not None:  # only when set: checkpoints written without a schema keep their hash
        flat["records.fields"] = records.fields
    for key, value in sorted(learner_arguments.items()):
        if isinstance(value, Mapping):
            flat.update({f"learner.{key}.{k}": v for k, v in sorted(value.items())})
        else:
            flat[f"learner.{key}"] = value
    return flat


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def privacy_hash(relevant: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of :func:`privacy_relevant`'s output."""
    canonical = json.dumps(dict(relevant), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def describe_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``["learner.epsilon: 1.0 in the checkpoint, 2.0 now", …]`` for every differing setting."""
    changes = []
    for key in sorted(set(saved) | set(current)):
        before, after = saved.get(key, "(unset)"), current.get(key, "(unset)")
        if before != after:
            changes.append(f"{key}: {before!r} in the checkpoint, {after!r} now")
    return changes
