"""benchmarks.real_data: nothing is used unless its pinned SHA-256 matches, and rows are bounded.

No network: each test puts a small archive where :func:`benchmarks.real_data.download` looks
for a verified copy first.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks import real_data
from benchmarks.real_data import Encoder, Member, Release, VerificationError, fetch

PAYLOAD = b"year,month\n2013,1\n"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wheel_with(path: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(path, data)
    return buffer.getvalue()


def sdist_with(path: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(path)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def placed(tmp_path: Path, filename: str, archive: bytes, member_path: str, member_hash: str) -> Member:
    (tmp_path / filename).write_bytes(archive)
    return Member(Release("demo", "1.0", filename, sha(archive), "CC0"), member_path, member_hash)


@pytest.mark.parametrize("filename, build", [("demo-1.0-py3-none-any.whl", wheel_with), ("demo-1.0.tar.gz", sdist_with)])
def test_a_verified_member_is_extracted_and_cached(tmp_path: Path, filename: str, build) -> None:
    member = placed(tmp_path, filename, build("demo/data/table.csv", PAYLOAD), "demo/data/table.csv", sha(PAYLOAD))
    cached = fetch(member, tmp_path)
    assert cached.read_bytes() == PAYLOAD
    assert fetch(member, tmp_path) == cached


def test_an_archive_with_another_hash_is_refused(tmp_path: Path) -> None:
    archive = wheel_with("demo/t.csv", PAYLOAD)
    (tmp_path / "demo-1.0-py3-none-any.whl").write_bytes(archive)
    member = Member(Release("demo", "1.0", "demo-1.0-py3-none-any.whl", sha(archive + b"x"), "CC0"), "demo/t.csv",
                    sha(PAYLOAD))
    with pytest.raises(VerificationError, match="is not the pinned"):
        fetch(member, tmp_path)


def test_a_member_with_another_hash_is_refused_and_not_kept(tmp_path: Path) -> None:
    member = placed(tmp_path, "demo-1.0-py3-none-any.whl", wheel_with("demo/t.csv", PAYLOAD), "demo/t.csv",
                    sha(PAYLOAD + b"x"))
    with pytest.raises(VerificationError):
        fetch(member, tmp_path)
    assert not (tmp_path / member.cached_name).exists()


def test_an_edited_cached_member_is_refused(tmp_path: Path) -> None:
    member = placed(tmp_path, "demo-1.0-py3-none-any.whl", wheel_with("demo/t.csv", PAYLOAD), "demo/t.csv", sha(PAYLOAD))
    fetch(member, tmp_path).write_bytes(PAYLOAD.replace(b"2013", b"2014"))
    with pytest.raises(VerificationError):
        fetch(member, tmp_path)


def test_encoded_rows_are_in_the_unit_ball_and_one_hot() -> None:
    encoder = Encoder(4)
    encoder.one_hot("carrier", ["AA", "UA", "AA", "B6"])
    encoder.indicator("night", np.array([True, False, False, True]))
    encoder.scaled("distance", np.array([200.0, 4983.0, 9000.0, 0.0]), real_data.FLIGHT_DISTANCE_MAX)
    X = encoder.matrix()
    assert X.shape == (4, 5)
    assert encoder.names[:3] == ["carrier=AA", "carrier=B6", "carrier=UA"]
    assert np.all(np.linalg.norm(X, axis=1) <= real_data.FEATURE_BOUND + 1e-12)
    np.testing.assert_allclose(X[:, :3].sum(axis=1), 1 / np.sqrt(3))
    assert X[2, 4] == pytest.approx(1 / np.sqrt(3))  # 9,000 miles is clipped to the public maximum


def test_every_pinned_data_set_names_a_licence_and_a_full_hash() -> None:
    for data_set in real_data.DATA_SETS:
        assert len(data_set.member.sha256) == 64 and len(data_set.member.release.sha256) == 64
        assert data_set.member.release.licence and data_set.source
