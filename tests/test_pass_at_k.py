"""pass@k (Chen et al. 2021) against exact enumeration and exact rational arithmetic."""
import itertools
import math
import random
from fractions import Fraction

import numpy as np
import pytest

from pacs_fast.algorithms import pass_at_k


def enumerated_pass_at_k(n, c, k):
    """Fraction of the k-subsets of n samples (the first c correct) that contain a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(1 for s in subsets if min(s) < c) / len(subsets)


def test_matches_enumeration_small_n():
    for n in range(1, 9):
        for c in range(0, n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(enumerated_pass_at_k(n, c, k), abs=1e-13), (n, c, k)


def test_matches_exact_rational_n512(seed):
    rng = random.Random(seed)
    n = 512
    cs = [0, 1, 2, 511, 512] + rng.sample(range(3, 511), 8)
    ks = np.arange(1, n + 1)
    for c in cs:
        got = pass_at_k(n, c, ks)
        assert got.shape == (n,) and got.dtype == np.float64
        for k in ks.tolist():
            exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
            assert abs(got[k - 1] - float(exact)) <= 1e-12 * max(float(exact), 1e-300) + 1e-300, (c, k)
            if 0 < float(exact) < 1e-3:  # tiny values keep their relative accuracy
                assert got[k - 1] == pytest.approx(float(exact), rel=1e-11)


def test_broadcasting_and_edges():
    out = pass_at_k(np.array([10, 10, 10]), np.array([0, 10, 3]), 1)
    np.testing.assert_allclose(out, [0.0, 1.0, 0.3], rtol=1e-14, atol=0)
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k: every k-subset has a correct sample
    assert np.asarray(pass_at_k(5, 2, 1)).shape == ()
    assert not np.signbit(pass_at_k(8, 0, 4)).any()  # no correct sample: 0.0, printed "0.0", not "-0.0"


@pytest.mark.parametrize("n,c,k,match", [
    (0, 0, 1, "n must be"), (4, 5, 1, "c must"), (4, -1, 1, "c must"), (4, 2, 0, "k must"),
    (4, 2, 5, "k must"), (4.0, 2, 1, "integers"),
])
def test_bad_input(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)
