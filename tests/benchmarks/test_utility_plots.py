"""The utility benchmarks' pictures: drawn from the tables' own numbers, one panel per stream."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from benchmarks import utility_pan_acsa, utility_shapes  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_the_shapes_table_is_drawn_with_one_panel_per_stream(tmp_path: Path) -> None:
    scores = {column: 0.6 for column in utility_shapes.PLOTTED} | {"steps glm/worst": 1.0}
    results = [(stream, epsilon, scores) for stream in ("a (AUC)", "b (AUC)", "c (AUC)") for epsilon in (0.5, 1.0, 4.0)]
    path = tmp_path / "real.png"
    utility_shapes.plot(results, 3, path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_the_curves_need_every_method_at_epsilon_one(tmp_path: Path) -> None:
    methods = ("pan-acsa", "noiseless twin", "central AC-SA", "central DP-SGD", "non-private SGD")
    curves = {("logistic", method, epsilon): {10**3: 0.1, 10**4: 0.01} for method in methods for epsilon in (0.5, 1.0, 4.0)}
    path = tmp_path / "curves.png"
    utility_pan_acsa.plot_curves(curves, path)
    assert path.read_bytes().startswith(PNG_SIGNATURE)
    del curves[("logistic", "central AC-SA", 1.0)]
    with pytest.raises(KeyError):
        utility_pan_acsa.plot_curves(curves, tmp_path / "incomplete.png")
