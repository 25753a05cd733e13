from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import BENCH, PLANETLAB, run_python

from scrapy_banker.net import gnp


def euclidean_world(n: int, dims: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pts = rng.uniform(0, 200, size=(n, dims))
    return gnp.distances(pts) + 1.0  # +1 ms: no zero RTT between distinct hosts


def test_recovers_a_euclidean_world() -> None:
    m = euclidean_world(60, 3)
    lm = np.arange(8)
    fit = gnp.fit_landmarks(m[np.ix_(lm, lm)], 3, seed=1)
    rest = np.arange(8, 60)
    hosts = gnp.embed(m[np.ix_(rest, lm)], fit.coords, seed=1)
    iu = np.triu_indices(rest.size, k=1)
    err = gnp.relative_errors(gnp.distances(hosts.coords)[iu], m[np.ix_(rest, rest)][iu])
    assert np.median(err) < 0.02
    assert np.percentile(err, 90) < 0.1
    assert fit.error.max() < 0.05


def test_deterministic_for_a_seed() -> None:
    m = euclidean_world(30, 4, seed=3)
    lm = np.arange(6)
    a = gnp.fit_landmarks(m[np.ix_(lm, lm)], 4, seed=7)
    b = gnp.fit_landmarks(m[np.ix_(lm, lm)], 4, seed=7)
    np.testing.assert_array_equal(a.coords, b.coords)
    ha = gnp.embed(m[6:, :6], a.coords, seed=2)
    hb = gnp.embed(m[6:, :6], b.coords, seed=2)
    np.testing.assert_array_equal(ha.coords, hb.coords)


def test_unmeasured_entries_are_skipped_and_unknown_hosts_are_nan() -> None:
    m = euclidean_world(20, 2, seed=5)
    lm = np.arange(5)
    fit = gnp.fit_landmarks(m[np.ix_(lm, lm)], 2, seed=0)
    d = m[5:, :5].copy()
    d[0, 1] = np.nan  # one missing measurement: still placed from the other four
    d[1, :] = np.nan  # a host that measured nothing
    hosts = gnp.embed(d, fit.coords)
    assert np.isnan(hosts.coords[1]).all()
    assert np.isfinite(hosts.coords[0]).all()
    pred = gnp.distances(hosts.coords[[0]], fit.coords)[0]
    assert gnp.relative_errors(pred, m[5, :5]).max() < 0.1


def test_bipartite_fit_predicts_unmeasured_pairs() -> None:
    # Nodes measure sites one way only; a new node measuring a few reference
    # sites is placed and predicts its RTT to sites it never measured.
    rng = np.random.default_rng(4)
    nodes = rng.uniform(0, 200, size=(6, 2))
    sites = rng.uniform(0, 200, size=(40, 2))
    d = gnp.distances(nodes, sites) + 1.0
    a, b = gnp.fit_bipartite(d[:5], dims=2, seed=0)
    assert np.median(gnp.relative_errors(gnp.distances(a.coords, b.coords), d[:5])) < 0.05
    new = gnp.embed(d[5:, :8], b.coords[:8])
    pred = gnp.distances(new.coords, b.coords[8:])
    assert np.median(gnp.relative_errors(pred, d[5:, 8:])) < 0.1


def test_validated_selection_beats_random_on_a_noisy_world() -> None:
    m = euclidean_world(90, 3, seed=2)
    rng = np.random.default_rng(0)
    noisy = m * rng.lognormal(0, 0.15, size=m.shape)
    # A few hosts whose RTTs violate the triangle inequality: bad landmarks.
    noisy[:10, :] *= rng.uniform(1.5, 3.0, size=(10, 1))
    noisy[:, :10] = noisy[:10, :].T
    noisy = (noisy + noisy.T) / 2
    np.fill_diagonal(noisy, 0)

    def score(lm: np.ndarray) -> float:
        fit = gnp.fit_landmarks(noisy[np.ix_(lm, lm)], 3, seed=0)
        rest = np.setdiff1d(np.arange(90), lm)
        hosts = gnp.embed(noisy[np.ix_(rest, lm)], fit.coords)
        iu = np.triu_indices(rest.size, k=1)
        err = gnp.relative_errors(gnp.distances(hosts.coords)[iu], noisy[np.ix_(rest, rest)][iu])
        return float(np.percentile(err, 90))

    chosen = gnp.select_landmarks(noisy, 6, dims=3, seed=0, candidates=6, swaps=10)
    randoms = [score(gnp.select_landmarks(noisy, 6, method="random", seed=s)) for s in range(4)]
    assert score(chosen) < float(np.mean(randoms))


def test_medoids_and_random_selection_return_distinct_indices() -> None:
    m = euclidean_world(40, 2)
    for method in ("medoids", "random"):
        lm = gnp.select_landmarks(m, 7, method=method, seed=1)
        assert lm.size == 7 and np.unique(lm).size == 7
        assert lm.min() >= 0 and lm.max() < 40


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: gnp.fit_landmarks([[0, 1], [1, 0]], 0), "dims must be an integer >= 1"),
        (lambda: gnp.fit_landmarks([[0, -1], [-1, 0]], 2), "negative RTTs"),
        (lambda: gnp.fit_landmarks([[0, 1, 2], [1, 0, 3]], 2), "must be square"),
        (lambda: gnp.fit_landmarks([[0, np.inf], [1, 0]], 2), "infinite"),
        (lambda: gnp.embed([[1.0, 2.0]], [[0.0, 0.0]]), "2 columns but there are 1 references"),
        (lambda: gnp.select_landmarks(np.ones((3, 3)), 5), r"k must be an integer in \[1, 3\]"),
        (lambda: gnp.select_landmarks(np.ones((3, 3)), 2, method="kmeans"), "unknown landmark"),
        (lambda: gnp.relative_errors([1.0], [1.0, 2.0]), "shape mismatch"),
    ],
)
def test_bad_input_is_refused_with_a_specific_message(call, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


def test_read_rtt_matrix_marks_missing_entries(tmp_path: Path) -> None:
    path = tmp_path / "m.tsv.gz"
    path.write_bytes(gzip.compress(b"# comment\n0 12.5 NA\n12 0 0\n-1 7 0\n"))
    m = gnp.read_rtt_matrix(path)
    assert m[0, 1] == 12.5 and m[1, 0] == 12
    assert np.isnan(m[0, 2]) and np.isnan(m[1, 2]) and np.isnan(m[2, 0])
    assert m[0, 0] == 0 and m[2, 2] == 0
    (tmp_path / "bad.tsv").write_text("0 1\n1\n")
    with pytest.raises(ValueError, match="not square"):
        gnp.read_rtt_matrix(tmp_path / "bad.tsv")


def test_planetlab_matrix_is_shipped_with_its_licence() -> None:
    m = gnp.read_rtt_matrix(PLANETLAB)
    assert m.shape == (490, 490)
    licence = (PLANETLAB.parent / "LICENSE-NetLatency-Data").read_text()
    assert "MIT License" in licence


@pytest.mark.slow
def test_gnp_accuracy_benchmark_runs(tmp_path: Path) -> None:
    # A small noisy world keeps this fast; the PlanetLab figures are in the docs.
    m = euclidean_world(70, 3, seed=9) * np.random.default_rng(1).lognormal(0, 0.05, (70, 70))
    m = (m + m.T) / 2
    np.fill_diagonal(m, 0)
    path = tmp_path / "world.tsv"
    np.savetxt(path, m, fmt="%.3f", delimiter="\t")
    out = run_python(
        BENCH / "gnp_accuracy.py",
        *("--matrix", path, "--landmarks", "6", "--dims", "3", "--baseline-seeds", "1"),
        timeout=300,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["pairs"] == 64 * 63 // 2
    assert 0 <= result["median_rel_err"] < 0.1
    assert result["median_rel_err"] <= result["p90_rel_err"]
    assert result["fit_seconds"] > 0


def _noisy_landmarks(n: int, dims: int, seed: int) -> np.ndarray:
    """Mutual RTTs of ``n`` hosts that no Euclidean space fits exactly."""
    m = euclidean_world(n, dims, seed=seed)
    noisy = m * np.random.default_rng(seed).lognormal(0, 0.2, size=m.shape)
    noisy = (noisy + noisy.T) / 2
    np.fill_diagonal(noisy, 0)
    return noisy


def test_pair_hessian_matches_finite_differences_of_the_gradient() -> None:
    n, dims = 6, 3
    m = _noisy_landmarks(n, dims, seed=11)
    i, j = (a.astype(np.int64) for a in np.triu_indices(n, k=1))
    d = m[i, j]
    x = np.random.default_rng(0).uniform(-100, 100, size=n * dims)
    h = gnp._pair_hessian(x, n, dims, i, j, d)
    assert h.shape == (n * dims, n * dims)
    np.testing.assert_allclose(h, h.T, rtol=0, atol=1e-15)
    step = 1e-5
    numeric = np.empty_like(h)
    for k in range(n * dims):
        e = np.zeros_like(x)
        e[k] = step
        plus = gnp._pair_objective(x + e, n, dims, i, j, d)[1]
        minus = gnp._pair_objective(x - e, n, dims, i, j, d)[1]
        numeric[:, k] = (plus - minus) / (2 * step)
    np.testing.assert_allclose(h, numeric, rtol=1e-5, atol=1e-7 * np.abs(h).max())


def test_host_hessian_matches_finite_differences_of_the_gradient() -> None:
    m = _noisy_landmarks(9, 3, seed=4)
    refs = np.random.default_rng(1).uniform(-100, 100, size=(5, 3))
    d = m[5:, :5].copy()
    d[0, 2] = np.nan  # an unmeasured pair contributes nothing
    mask = np.isfinite(d)
    x = np.random.default_rng(2).uniform(-100, 100, size=(4, 3))
    _, g, h = gnp._host_terms(x, refs, d, mask)
    step = 1e-5
    for k in range(3):
        e = np.zeros_like(x)
        e[:, k] = step
        numeric = (
            gnp._host_terms(x + e, refs, d, mask)[1] - gnp._host_terms(x - e, refs, d, mask)[1]
        )
        np.testing.assert_allclose(h[:, :, k], numeric / (2 * step), rtol=1e-5, atol=1e-9)
        cost = gnp._host_terms(x + e, refs, d, mask)[0] - gnp._host_terms(x - e, refs, d, mask)[0]
        np.testing.assert_allclose(g[:, k], cost / (2 * step), rtol=1e-5, atol=1e-9)


def test_landmark_fit_reaches_the_same_minimum_for_a_relabelled_input() -> None:
    # The fit runs Newton to convergence, so the predicted distances are a
    # property of the measurements, not of the landmarks' order (nor of the
    # last bits of the arithmetic, which a permutation reshuffles).
    n, dims = 12, 3
    m = _noisy_landmarks(n, dims, seed=5)
    perm = np.random.default_rng(1).permutation(n)
    a = gnp.fit_landmarks(m, dims, restarts=1, seed=0)
    b = gnp.fit_landmarks(m[np.ix_(perm, perm)], dims, restarts=1, seed=0)
    np.testing.assert_allclose(
        gnp.distances(b.coords), gnp.distances(a.coords)[np.ix_(perm, perm)], rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(b.error, a.error[perm], rtol=1e-6, atol=1e-9)
    # The frame is fixed too (principal axes, signs set): the same coordinates.
    np.testing.assert_allclose(b.coords, a.coords[perm], rtol=0, atol=1e-6)
    np.testing.assert_allclose(a.coords.mean(axis=0), 0.0, atol=1e-9)
    gram = a.coords.T @ a.coords
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-6)


def test_hosts_are_placed_at_a_minimum_against_a_canonical_frame() -> None:
    # embed runs every host until its gradient vanishes (not until a step
    # rule stops it), and the landmark frame is a function of the distances
    # alone: a rotated and shifted copy maps back onto the same coordinates,
    # so start points -- hence results -- do not depend on rounding.
    n, dims = 10, 3
    m = _noisy_landmarks(n + 30, dims, seed=8)
    lm = np.arange(n)
    fit = gnp.fit_landmarks(m[np.ix_(lm, lm)], dims, restarts=2, seed=0)
    d = m[n:, :n]
    a = gnp.embed(d, fit.coords, restarts=1, seed=3)
    assert np.isfinite(a.coords).all()
    _, g, _ = gnp._host_terms(a.coords, fit.coords, d, np.isfinite(d))
    assert np.sqrt((g * g).sum(axis=1)).max() <= 1e-8
    # Same references after a round trip through another frame: canonical again.
    q, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(dims, dims)))
    back = gnp._canonical_frame(fit.coords @ q + 50.0)
    np.testing.assert_allclose(back, fit.coords, atol=1e-9)
