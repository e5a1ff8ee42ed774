"""Source URLs, parsed once into a tagged union instead of matched by prefix wherever they are used.

==================================  ===================================================
URL                                 parsed as
==================================  ===================================================
``kafka://host:port[,…]/topic[,…]``  :class:`KafkaUrl` (bootstrap servers, topics, ``?group=``)
``file:PATH`` / ``file://PATH``       :class:`FileUrl` (JSONL, CSV, or a panpriv recording)
``adult:train`` / ``adult:test``      :class:`AdultUrl` (the embedded UCI Adult splits)
``synthetic:n=N&dim=D[&seed=S]``      :class:`SyntheticUrl` (a generated test stream)
==================================  ===================================================

:func:`parse_source_url` is the one dispatch on the scheme; callers ``match`` on the result.
Errors are :class:`~panpriv.streamer.errors.SourceError` naming the URL (credentials redacted) and the
expected form.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from panpriv.streamer.errors import SourceError
from panpriv.streamer.io.urls import redact, refuse_credentials

SCHEMES = ("kafka", "file", "synthetic", "adult")
"""The source URL schemes panpriv reads."""


def scheme_of(url: str) -> str:
    """The scheme of ``url`` (the text before its first ``:``; empty if none)."""
    return url.split(":", 1)[0] if ":" in url else ""


@dataclass(frozen=True)
class FileUrl:
    """``file:PATH``: a file of records (JSONL, CSV) or a panpriv recording."""

    path: Path


@dataclass(frozen=True)
class AdultUrl:
    """``adult:train`` or ``adult:test``: a split of the embedded UCI Adult data set."""

    split: Literal["train", "test"]


@dataclass(frozen=True)
class SyntheticUrl:
    """``synthetic:n=N&dim=D[&seed=S]``: a generated stream (tests, benchmarks)."""

    n: int
    dim: int
    seed: int


@dataclass(frozen=True)
class KafkaUrl:
    """``kafka://host:port[,host:port]/topic[,topic]?group=name``."""

    bootstrap: list[str]
    topics: list[str]
    group: str

    def display(self) -> str:
        return f"kafka://{','.join(self.bootstrap)}/{','.join(self.topics)}?group={self.group}"


def parse_kafka_url(url: str) -> KafkaUrl:
    """``kafka://host:port[,host:port]/topic[,topic]?group=name`` (group defaults to ``panpriv``)."""
    try:
        refuse_credentials(url)
    except ValueError as exc:
        raise SourceError(str(exc)) from None
    parts = urllib.parse.urlsplit(url)
    hosts = [h for h in parts.netloc.rsplit("@", 1)[-1].split(",") if h]
    topics = [t for t in parts.path.lstrip("/").split(",") if t]
    query = urllib.parse.parse_qs(parts.query)
    unknown = set(query) - {"group"}
    if parts.scheme != "kafka" or not hosts or not topics or unknown:
        raise SourceError(
            f"bad Kafka source {redact(url)!r}: expected kafka://host:port[,host:port]/topic[,topic]?group=name"
            + (f" (unknown parameters {sorted(unknown)})" if unknown else "")
        )
    return KafkaUrl(hosts, topics, query.get("group", ["panpriv"])[0])


def file_path(url: str) -> Path:
    """The path of a ``file:PATH`` / ``file://PATH`` URL."""
    rest = url.removeprefix("file:")
    if rest.startswith("//"):
        rest = rest[2:]
    if not rest:
        raise SourceError(f"bad file source {url!r}: expected file:PATH")
    return Path(rest).expanduser()


def parse_synthetic_url(url: str) -> dict[str, int]:
    """``synthetic:n=100000&dim=20&seed=0`` → ``{"n": …, "dim": …, "seed": …}``."""
    rest = url.removeprefix("synthetic:").lstrip("?")
    params = urllib.parse.parse_qs(rest)
    unknown = set(params) - {"n", "dim", "seed"}
    try:
        values = {k: int(v[0]) for k, v in params.items() if k in ("n", "dim", "seed")}
    except ValueError:
        values = {}
    if unknown or "n" not in values or "dim" not in values or values["n"] < 1 or values["dim"] < 1:
        raise SourceError(f"bad synthetic source {url!r}: expected synthetic:n=N&dim=D[&seed=S] with N, D >= 1")
    values.setdefault("seed", 0)
    return values


SourceUrl = KafkaUrl | FileUrl | AdultUrl | SyntheticUrl


def parse_source_url(url: str) -> SourceUrl:
    """The parsed form of a source URL (module docstring); :class:`SourceError` if it is malformed."""
    scheme = scheme_of(url)
    if scheme == "kafka":
        return parse_kafka_url(url)
    if scheme == "file":
        return FileUrl(file_path(url))
    if scheme == "adult":
        split = url.removeprefix("adult:")
        if split == "train":
            return AdultUrl("train")
        if split == "test":
            return AdultUrl("test")
        raise SourceError(f"bad Adult source {url!r}: expected adult:train or adult:test")
    if scheme == "synthetic":
        values = parse_synthetic_url(url)
        return SyntheticUrl(values["n"], values["dim"], values["seed"])
    raise SourceError(f"unknown source {redact(url)!r}: it must start with kafka://, file:, synthetic: or adult:")
