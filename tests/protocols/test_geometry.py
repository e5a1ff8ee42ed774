"""Tests of panpriv.protocols.geometry.L2Ball."""

from __future__ import annotations

import numpy as np
import pytest

from panpriv.protocols.errors import InvalidInputError
from panpriv.protocols.geometry import L2Ball


def test_projection_scales_outside_points_onto_the_sphere():
    ball = L2Ball(2.0)
    theta = np.array([3.0, 4.0])
    np.testing.assert_allclose(ball.project(theta), [1.2, 1.6])
    np.testing.assert_array_equal(theta, [3.0, 4.0])  # input unchanged


def test_projection_keeps_inside_points_and_is_idempotent():
    ball = L2Ball(1.0)
    rng = np.random.default_rng(0)
    for theta in rng.normal(size=(50, 5)) * 2:
        p = ball.project(theta)
        assert ball.contains(p)
        np.testing.assert_allclose(ball.project(p), p, rtol=1e-15)
        if np.linalg.norm(theta) <= 1.0:
            np.testing.assert_array_equal(p, theta)
        else:  # the projection is the nearest point: θ − p is normal to the sphere at p
            np.testing.assert_allclose(np.linalg.norm(p), 1.0)
            np.testing.assert_allclose((theta - p) / np.linalg.norm(theta - p), p, atol=1e-12)


def test_diameter_and_contains():
    ball = L2Ball(1.5)
    assert ball.diameter == 3.0
    assert ball.contains(np.array([1.5, 0.0]))
    assert not ball.contains(np.array([1.5, 1e-3]))


@pytest.mark.parametrize("radius", [0.0, -1.0, float("inf"), float("nan"), None])
def test_invalid_radius(radius):
    with pytest.raises(InvalidInputError, match="'radius' parameter of L2Ball"):
        L2Ball(radius)


def test_in_place_projection_is_the_projection_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    ball = L2Ball(1.3)
    for theta in rng.normal(size=(500, 7)) * rng.choice([0.1, 0.5, 1.0, 3.0], size=(500, 1)):
        expected = ball.project(theta)
        ball.project_in_place(theta)
        np.testing.assert_array_equal(theta, expected)
