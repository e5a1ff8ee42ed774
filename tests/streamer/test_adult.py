"""panpriv.streamer.datasets.adult: the public schema, the encoding, and the shipped files."""

from __future__ import annotations

import gzip
import hashlib
import math

import numpy as np

from panpriv.streamer.datasets import adult


def test_schema_is_parsed_from_adult_names() -> None:
    schema = adult.schema()
    assert len(schema.attributes) == 14
    sizes = {name: len(values) for name, values in schema.categories.items()}
    assert sizes == {"workclass": 8, "education": 16, "marital-status": 7, "occupation": 14,
                     "relationship": 6, "race": 5, "sex": 2, "native-country": 41}
    assert adult.DIM == 1 + 5 + sum(sizes.values()) == 105
    assert len(adult.FEATURE_NAMES) == adult.DIM
    assert adult.FEATURE_BOUND == math.sqrt(14)


def test_shipped_files_match_their_checksums() -> None:
    sums = dict(line.split()[::-1] for line in (adult.DATA_DIR / "SHA256SUMS").read_text().splitlines() if line.strip())
    for name in ("adult.data", "adult.test"):
        digest = hashlib.sha256(gzip.decompress((adult.DATA_DIR / f"{name}.gz").read_bytes())).hexdigest()
        assert sums[name] == digest


def test_encoded_sets_sizes_labels_and_bound() -> None:
    X, y = adult.load("train")
    X_test, y_test = adult.load("test")
    assert X.shape == (adult.TRAIN_RECORDS, 105) and X_test.shape == (adult.TEST_RECORDS, 105)
    # Label counts of the original files (7,841 of 32,561 and 3,846 of 16,281 earn >50K).
    assert int((y > 0).sum()) == 7841 and int((y_test > 0).sum()) == 3846
    assert set(np.unique(y)) == {-1.0, 1.0}
    assert X.min() >= 0.0 and X.max() <= 1.0
    assert np.linalg.norm(np.vstack([X, X_test]), axis=1).max() <= adult.FEATURE_BOUND
    assert np.all(X[:, 0] == 1.0)


def test_encoding_uses_fixed_public_maps_only() -> None:
    """A record's encoding depends on that record alone (no statistic of the data)."""
    out = np.empty(adult.DIM)
    line = "90, ?, 1, Doctorate, 16, Widowed, ?, Unmarried, Other, Female, 99999, 99999, 99, ?, >50K."
    assert adult.encode_line(line, out) == 1.0
    names = adult.FEATURE_NAMES
    value = dict(zip(names, out))
    assert value["age"] == 1.0 and value["education-num"] == 1.0 and value["hours-per-week"] == 1.0
    assert value["capital-gain"] == 1.0 and value["capital-loss"] == 1.0
    assert not any(value[n] for n in names if n.startswith(("workclass=", "occupation=", "native-country=")))  # "?"
    assert value["education=Doctorate"] == 1.0 and value["sex=Female"] == 1.0
    young = "17, Private, 5, HS-grad, 1, Never-married, Sales, Own-child, White, Male, 0, 0, 1, Cuba, <=50K"
    assert adult.encode_line(young, out) == -1.0
    value = dict(zip(names, out))
    assert value["age"] == 0.0 and value["education-num"] == 0.0 and value["hours-per-week"] == 0.0
    X, _ = adult.load("train")
    first = next(adult.iter_lines(adult.TRAIN_PATH))
    adult.encode_line(first, out)
    np.testing.assert_array_equal(out, X[0])
