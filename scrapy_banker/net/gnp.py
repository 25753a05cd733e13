"""GNP network coordinates: predict crawler-to-site latency from a few measurements.

Global Network Positioning (Ng & Zhang, 2002) embeds hosts in a Euclidean
space so that the distance between two points predicts the round-trip time
between the hosts.  The GNP crawler-scheduling paper uses it so that a
scheduler can rank every crawler node for a site after measuring the site
from a handful of *landmark* nodes only, instead of from every node.

Two phases, as in the paper:

1. :func:`fit_landmarks` -- the landmarks measure each other; their
   coordinates minimise the sum of squared *relative* errors
   ``((d_pred - d_meas) / d_meas) ** 2`` over landmark pairs.
2. :func:`embed` -- any other host (crawler node or web site) measures the
   landmarks (or is measured by them) and gets the coordinates that minimise
   the same error against the fixed landmark coordinates.

A crawler fleet cannot measure node-to-node latency at the application
level (nodes serve no HTTP), so :func:`fit_bipartite` fits two sets jointly
from one-way measurements (landmark nodes x reference sites); phase 2 is then
unchanged.  :func:`select_landmarks` picks landmarks as the medoids of a
partition of the hosts by network distance -- the paper's "ideal scheme" --
which predicts better than a random choice (see ``benchmarks/gnp_accuracy.py``).

Everything here is deterministic for a given ``seed``; only numpy and scipy
are imported.
"""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

__all__ = [
    "Embedding",
    "distances",
    "embed",
    "fit_bipartite",
    "fit_landmarks",
    "read_rtt_matrix",
    "relative_errors",
    "select_landmarks",
]

#: Measurements below this many ms are clamped: a relative error against 0 is undefined.
MIN_RTT_MS = 0.1

#: Landmark fit: gradient norm at which a Newton run has converged.  Tight
#: enough that two runs reaching the same minimum agree to ~1e-8 in every
#: predicted distance.
FIT_GTOL = 1e-8
#: Landmark fit: a cap on Newton steps.  15 PlanetLab landmarks in 7
#: dimensions converge in ~50 steps from MDS and 30 in ~370, well inside it;
#: with 60 the cap is reached first, and such a fit, like the quasi-Newton
#: fit before it, stops short of the minimum (about 10 s for 8 restarts).
FIT_MAXITER = 1000
#: Relative objective difference below which two fits count as the same minimum.
FIT_TIE = 1e-9
#: Landmark frame: principal axes with a singular value below this (relative
#: to the largest) are rounding noise, and set to exactly zero.
FRAME_RTOL = 1e-7
#: Host placement (:func:`embed`): gradient norm at which a host has converged.
EMBED_GTOL = 1e-9
#: Host placement: a safety cap on Newton steps, not a stopping rule.
EMBED_MAXITER = 500

#: Validated selection: no two landmarks closer than this (ms) when avoidable.
#: Co-located nodes (same site or city) add no independent reference point,
#: and their tiny RTT gets a huge relative-error weight in the fit.
MIN_LANDMARK_SEPARATION_MS = 5.0
#: Validated selection: a candidate must beat the best score (median + p90
#: of the held-out relative error) by this much to replace it.  Smaller
#: differences are below what the held-out sample can resolve, and letting
#: them count would let rounding steer the search.
SELECTION_MARGIN = 1e-3


def _minimize() -> Any:
    """scipy's optimizer, imported on first use.

    ``scipy.optimize`` costs ~0.45 s of CPU to import, and every worker
    imports this module (through the placement strategies, which name the
    allowed ``BANKER_PLACEMENT`` modes) while only a placement plan fits
    coordinates.
    """
    from scipy.optimize import minimize

    return minimize


@dataclass(frozen=True)
class Embedding:
    """Coordinates plus the residual of the fit that produced them."""

    coords: FloatArray
    #: Per point: root of the mean squared relative error of its own measurements.
    error: FloatArray


#: Tokens that mean "no measurement" in RTT matrices found in the wild.
MISSING_TOKENS: Final = frozenset(
    {"", "-", "--", "?", "x", "*", "na", "n/a", "nan", "none", "null", "inf", "-inf"}
)


def read_rtt_matrix(path: str | os.PathLike[str]) -> FloatArray:
    """Read a square, whitespace-separated RTT matrix (ms), NaN where not measured.

    Files may be gzip-compressed (detected by magic bytes, not by name) and
    may contain ``#`` comment lines.  Missing measurements -- tokens such as
    ``NA``/``nan``/``-``/``?``, negative numbers, or a ``0`` off the diagonal
    (an RTT of exactly zero between two distinct machines is a placeholder
    in published data sets, not a measurement) -- become NaN so that fits
    skip them instead of learning from them.
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    rows: list[list[float]] = []
    for lineno, line in enumerate(raw.decode("utf-8", "replace").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        values: list[float] = []
        for token in stripped.split():
            if token.lower() in MISSING_TOKENS:
                values.append(math.nan)
                continue
            try:
                value = float(token)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not a number: {token!r}") from exc
            values.append(value if math.isfinite(value) and value >= 0 else math.nan)
        rows.append(values)
    n = len(rows)
    if n == 0:
        raise ValueError(f"{path}: empty RTT matrix")
    bad = [i for i, r in enumerate(rows) if len(r) != n]
    if bad:
        raise ValueError(
            f"{path}: RTT matrix is not square: {n} rows, row {bad[0]} has {len(rows[bad[0]])}"
        )
    m = np.array(rows, dtype=np.float64)
    m[(m == 0) & ~np.eye(n, dtype=bool)] = math.nan
    return m


def _check_dims(dims: int, restarts: int) -> None:
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise ValueError(f"dims must be an integer >= 1, got {dims!r}")
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 1:
        raise ValueError(f"restarts must be an integer >= 1, got {restarts!r}")


def _as_rtt(rtt: npt.ArrayLike, name: str) -> FloatArray:
    """Float matrix with NaN for "not measured"; negative or infinite values are errors."""
    m = np.array(rtt, dtype=np.float64, copy=True)
    if m.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {m.shape}")
    finite = np.isfinite(m)
    if np.isinf(m).any():
        raise ValueError(f"{name} contains infinite values (use NaN for 'not measured')")
    if (m[finite] < 0).any():
        raise ValueError(f"{name} contains negative RTTs")
    m[finite] = np.maximum(m[finite], MIN_RTT_MS)
    return m


def distances(a: npt.ArrayLike, b: npt.ArrayLike | None = None) -> FloatArray:
    """Predicted RTTs: Euclidean distances between every row of ``a`` and of ``b``."""
    x = np.asarray(a, dtype=np.float64)
    y = x if b is None else np.asarray(b, dtype=np.float64)
    diff = x[:, None, :] - y[None, :, :]
    return np.asarray(np.sqrt(np.einsum("ijk,ijk->ij", diff, diff)), dtype=np.float64)


def relative_errors(predicted: npt.ArrayLike, measured: npt.ArrayLike) -> FloatArray:
    """GNP's accuracy metric ``|pred - meas| / min(pred, meas)`` for finite measured pairs."""
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape:
        raise ValueError(f"shape mismatch: predicted {p.shape} vs measured {m.shape}")
    ok = np.isfinite(m) & np.isfinite(p)
    p, m = np.maximum(p[ok], MIN_RTT_MS), np.maximum(m[ok], MIN_RTT_MS)
    return np.asarray(np.abs(p - m) / np.minimum(p, m), dtype=np.float64)


# ------------------------------------------------------------------ objectives


def _pair_objective(
    flat: FloatArray, n: int, dims: int, i: IntArray, j: IntArray, d: FloatArray
) -> tuple[float, FloatArray]:
    x = flat.reshape(n, dims)
    diff = x[i] - x[j]
    dhat = np.sqrt(np.einsum("ij,ij->i", diff, diff)) + 1e-12
    r = (dhat - d) / d
    g = (2.0 * r / d / dhat)[:, None] * diff
    grad = np.zeros_like(x)
    np.add.at(grad, i, g)
    np.add.at(grad, j, -g)
    return float(np.dot(r, r)), grad.ravel()


def _pair_hessian(
    flat: FloatArray, n: int, dims: int, i: IntArray, j: IntArray, d: FloatArray
) -> FloatArray:
    """Exact Hessian of :func:`_pair_objective`, for a Newton trust-region fit.

    Landmark pairs span four orders of magnitude (co-located nodes 0.2 ms
    apart, antipodes 300 ms), so the relative-error weights ``1 / d**2``
    make the problem badly conditioned: a quasi-Newton method needs
    thousands of steps there and, stopped at an iteration cap, returns a
    point that depends on rounding.  Newton steps with the true curvature
    converge in tens.
    """
    x = flat.reshape(n, dims)
    diff = x[i] - x[j]
    dhat = np.sqrt(np.einsum("ij,ij->i", diff, diff)) + 1e-12
    u = diff / dhat[:, None]
    r = (dhat - d) / d
    uu = u[:, :, None] * u[:, None, :]
    # Per pair: 2 (grad r grad r^T + r hess r), one dims x dims block.
    block = 2.0 * (
        uu / (d * d)[:, None, None] + (r / (d * dhat))[:, None, None] * (np.eye(dims) - uu)
    )
    # Pairs are distinct, so each off-diagonal block is set once; a diagonal
    # block is minus the sum of its row's off-diagonal ones.
    h = np.zeros((n, n, dims, dims))
    h[i, j] = -block
    h[j, i] = -block
    h[np.arange(n), np.arange(n)] = -h.sum(axis=1)
    return np.asarray(h.transpose(0, 2, 1, 3).reshape(n * dims, n * dims), dtype=np.float64)


def _residuals(
    x: FloatArray, y: FloatArray, d: FloatArray, mask: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """``(diff, dhat, dd, r)`` for every point of ``x`` against every point of ``y``.

    ``r`` is the relative error of each measured pair (0 where not
    measured) and ``dd`` the measurement with 1.0 in the gaps, so callers
    can divide by it without masking again.
    """
    diff = x[:, None, :] - y[None, :, :]
    dhat = np.sqrt(np.einsum("ijk,ijk->ij", diff, diff)) + 1e-12
    dd = np.where(mask, d, 1.0)
    r = np.where(mask, (dhat - dd) / dd, 0.0)
    return diff, dhat, dd, r


def _cross_terms(
    x: FloatArray, y: FloatArray, d: FloatArray, mask: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per-pair residuals and gradient factors for points ``x`` against ``y``."""
    diff, dhat, dd, r = _residuals(x, y, d, mask)
    factor = 2.0 * r / dd / dhat
    return r, factor, diff


def _classical_mds(d: FloatArray, dims: int) -> FloatArray:
    """Torgerson MDS: a deterministic, usually good starting point for the landmark fit."""
    n = d.shape[0]
    filled = np.where(np.isfinite(d), d, np.nanmedian(d) if np.isfinite(d).any() else 1.0)
    filled = (filled + filled.T) / 2.0
    np.fill_diagonal(filled, 0.0)
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ (filled**2) @ j
    vals, vecs = np.linalg.eigh(b)
    order = np.argsort(vals)[::-1][:dims]
    lam = np.sqrt(np.maximum(vals[order], 0.0))
    vecs = vecs[:, order]
    # An eigenvector's sign is LAPACK's choice (it differs between builds);
    # fix it so the start point, hence the fit, does not depend on the machine.
    pivot = vecs[np.argmax(np.abs(vecs), axis=0), np.arange(vecs.shape[1])]
    vecs = vecs * np.where(pivot < 0, -1.0, 1.0)
    out = np.zeros((n, dims))
    out[:, : len(order)] = vecs * lam
    return out


def _canonical_frame(x: FloatArray) -> FloatArray:
    """The same points, centred and rotated onto their principal axes, signs fixed.

    The landmark objective only sees distances, so a fit is defined up to a
    rotation, and a Newton run drifts along that flat direction by amounts
    that depend on rounding.  Hosts are then placed from start points in
    absolute coordinates, and where the landmarks span fewer dimensions than
    the space (a host's mirror image across their span is as good a fit as
    the host) which side a host ends on depends on that rotation.  Principal
    axes -- with axes the points do not extend along set exactly to zero --
    make the frame a property of the distances.
    """
    n, dims = x.shape
    c = x - x.mean(axis=0)
    _, sv, vt = np.linalg.svd(c, full_matrices=False)
    out = np.zeros((n, dims))
    k = vt.shape[0]
    out[:, :k] = c @ vt.T
    flat = np.flatnonzero(sv <= (sv[0] if sv.size else 0.0) * FRAME_RTOL)
    out[:, flat] = 0.0
    pivot = out[np.argmax(np.abs(out), axis=0), np.arange(dims)]
    return np.asarray(out * np.where(pivot < 0, -1.0, 1.0), dtype=np.float64)


# ------------------------------------------------------------------ phase 1


def fit_landmarks(
    rtt: npt.ArrayLike, dims: int = 7, *, restarts: int = 8, seed: int = 0
) -> Embedding:
    """Phase 1: coordinates of the landmarks from their mutual RTTs (ms).

    ``rtt[i, j]`` and ``rtt[j, i]`` are averaged when both were measured
    (the paper measures landmark pairs in both directions); NaN means not
    measured.  The paper fits by downhill search; here each of ``restarts``
    runs is a trust-region Newton method with the exact Hessian, run to
    convergence (gradient below :data:`FIT_GTOL`), so the coordinates are
    the objective's minimum -- a property of the measurements -- rather
    than wherever an iteration cap stopped (which moves with the last bits
    of the arithmetic, i.e. with the BLAS build and the machine).  The
    first run starts from classical MDS, the others from random points
    scaled to the data; the best is kept, and a later run replaces an
    earlier one only if it is better by more than :data:`FIT_TIE`
    (relative), so runs that reach the same minimum do not let rounding
    pick between them.  The coordinates are returned centred on the
    landmarks' principal axes with fixed signs (distances alone do not fix
    a rotation), so that :func:`embed`'s start points -- hence which side
    of the landmarks' span a host ends on -- do not depend on rounding
    either.
    """
    _check_dims(dims, restarts)
    m = _as_rtt(rtt, "rtt")
    n = m.shape[0]
    if m.shape[1] != n:
        raise ValueError(f"landmark RTT matrix must be square, got shape {m.shape}")
    if n < 2:
        raise ValueError("need at least 2 landmarks")
    sym = np.where(np.isfinite(m) & np.isfinite(m.T), (m + m.T) / 2.0, np.fmin(m, m.T))
    iu, ju = np.triu_indices(n, k=1)
    d = sym[iu, ju]
    ok = np.isfinite(d)
    if not ok.any():
        raise ValueError("no landmark pair was measured")
    i, j, d = iu[ok].astype(np.int64), ju[ok].astype(np.int64), d[ok]
    scale = float(np.median(d))
    rng = np.random.default_rng(seed)
    best: tuple[float, FloatArray] | None = None
    for attempt in range(restarts):
        if attempt == 0:
            x0 = _classical_mds(sym, dims)
        else:
            x0 = rng.uniform(-scale, scale, size=(n, dims))
        res = _minimize()(
            _pair_objective,
            x0.ravel(),
            args=(n, dims, i, j, d),
            jac=True,
            hess=_pair_hessian,
            method="trust-ncg",
            options={"maxiter": FIT_MAXITER, "gtol": FIT_GTOL},
        )
        value = float(res.fun)
        if best is None or value < best[0] * (1.0 - FIT_TIE):
            best = (value, np.asarray(res.x, dtype=np.float64))
    assert best is not None
    coords = _canonical_frame(best[1].reshape(n, dims))
    pred = distances(coords)[i, j]
    sq = ((pred - d) / d) ** 2
    per = np.zeros(n)
    cnt = np.zeros(n)
    np.add.at(per, i, sq)
    np.add.at(per, j, sq)
    np.add.at(cnt, i, 1)
    np.add.at(cnt, j, 1)
    error = np.sqrt(per / np.maximum(cnt, 1))
    return Embedding(coords, error)


def _host_terms(
    x: FloatArray, refs: FloatArray, d: FloatArray, mask: npt.NDArray[np.bool_]
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per host: objective, gradient and exact Hessian of its relative error to ``refs``."""
    diff, dhat, dd, r = _residuals(x, refs, d, mask)
    u = diff / dhat[:, :, None]
    cost = np.einsum("hl,hl->h", r, r)
    grad = np.einsum("hl,hlk->hk", 2.0 * r / dd, u)
    # Per measured reference: 2 (u u^T / d^2 + r / (d dhat) (I - u u^T)).
    a = np.where(mask, 2.0 / (dd * dd), 0.0)
    b = np.where(mask, 2.0 * r / (dd * dhat), 0.0)
    uu = np.einsum("hlk,hlm->hkm", u * (a - b)[:, :, None], u)
    hess = uu + b.sum(axis=1)[:, None, None] * np.eye(x.shape[1])
    return cost, grad, hess


def _newton_hosts(
    x0: FloatArray,
    refs: FloatArray,
    d: FloatArray,
    mask: npt.NDArray[np.bool_],
) -> tuple[FloatArray, FloatArray]:
    """Minimise every host's relative error at once, each run to convergence.

    Hosts are independent, small (``dims`` unknowns) problems, solved
    together: per host a damped Newton step with the exact Hessian, made
    positive definite through its eigenvalues (a trust-region step in
    disguise), accepted when it lowers the host's error, the damping
    shrinking after a success and growing after a failure.  A host stops
    when its gradient norm is below :data:`EMBED_GTOL` -- at its minimum,
    not where a step-size or iteration rule happened to stop it, which
    moves with the last bits of the arithmetic -- or when no step lowers
    its error any more (the minimum within rounding).
    """
    x = x0.copy()
    h = x.shape[0]
    lam = np.full(h, 1e-3)
    current, grad, hess = _host_terms(x, refs, d, mask)
    active = np.ones(h, dtype=bool)
    for _ in range(EMBED_MAXITER):
        active &= np.sqrt(np.einsum("hk,hk->h", grad, grad)) > EMBED_GTOL
        active &= lam < 1e16
        if not active.any():
            break
        idx = np.flatnonzero(active)
        w, v = np.linalg.eigh(hess[idx])
        scale = np.maximum(np.abs(w).max(axis=1), 1e-300)
        shift = np.maximum(-w[:, 0], 0.0) + lam[idx] * scale
        step = -np.einsum(
            "hkj,hj->hk", v, np.einsum("hkj,hk->hj", v, grad[idx]) / (w + shift[:, None])
        )
        trial = x[idx] + step
        cost, g, hs = _host_terms(trial, refs, d[idx], mask[idx])
        ok = cost < current[idx]
        acc = idx[ok]
        x[acc], current[acc], grad[acc], hess[acc] = trial[ok], cost[ok], g[ok], hs[ok]
        lam[acc] = np.maximum(lam[acc] / 4.0, 1e-12)
        lam[idx[~ok]] *= 8.0
    return x, current


# ------------------------------------------------------------------ phase 2


def embed(
    rtt_to_refs: npt.ArrayLike,
    ref_coords: npt.ArrayLike,
    *,
    restarts: int = 4,
    seed: int = 0,
) -> Embedding:
    """Phase 2: coordinates of hosts from their RTTs (ms) to fixed reference points.

    ``rtt_to_refs`` is ``(hosts, refs)`` with NaN for a reference the host
    did not measure.  A host needs ``dims + 1`` measurements for a unique
    position; with fewer it still gets a consistent (but ambiguous) one, and
    a host with none gets NaN coordinates, so a caller can tell "unknown"
    from "far".  Hosts are independent, so they are optimised together, each
    by damped Newton steps with its exact Hessian run to convergence
    (gradient below :data:`EMBED_GTOL`), and each keeps its best of
    ``restarts`` starts: the first near its closest reference, the others
    random around the references; a later start replaces an earlier one
    only if it is better by more than :data:`FIT_TIE` (relative).  With
    references from :func:`fit_landmarks` (whose frame is fixed, see there)
    the result depends on the measurements and ``seed``, not on the BLAS
    build or the machine, to about 1e-7 in every predicted distance.
    """
    refs = np.asarray(ref_coords, dtype=np.float64)
    if refs.ndim != 2:
        raise ValueError(f"ref_coords must be 2-D (refs, dims), got shape {refs.shape}")
    dims = refs.shape[1]
    _check_dims(dims, restarts)
    d = _as_rtt(rtt_to_refs, "rtt_to_refs")
    if d.shape[1] != refs.shape[0]:
        raise ValueError(
            f"rtt_to_refs has {d.shape[1]} columns but there are {refs.shape[0]} references"
        )
    hosts = d.shape[0]
    mask = np.isfinite(d)
    known = mask.any(axis=1)
    coords = np.full((hosts, dims), np.nan)
    error = np.full(hosts, np.nan)
    if hosts == 0 or not known.any():
        return Embedding(coords, error)
    dk, mk = d[known], mask[known]
    h = dk.shape[0]
    spread = float(np.std(refs)) or 1.0
    rng = np.random.default_rng(seed)

    nearest = np.nanargmin(np.where(mk, dk, np.inf), axis=1)
    best_err = np.full(h, np.inf)
    best = np.zeros((h, dims))
    for attempt in range(restarts):
        if attempt == 0:
            x0 = refs[nearest] + rng.normal(0.0, spread * 0.01, size=(h, dims))
        else:
            centre = refs[rng.integers(0, refs.shape[0], size=h)]
            x0 = centre + rng.normal(0.0, spread, size=(h, dims))
        x, err = _newton_hosts(x0, refs, dk, mk)
        better = err < best_err * (1.0 - FIT_TIE)
        best[better] = x[better]
        best_err[better] = err[better]
    coords[known] = best
    error[known] = np.sqrt(best_err / np.maximum(mk.sum(axis=1), 1))
    return Embedding(coords, error)


def fit_bipartite(
    rtt: npt.ArrayLike, dims: int = 3, *, restarts: int = 4, seed: int = 0
) -> tuple[Embedding, Embedding]:
    """Fit rows and columns of a one-way measurement matrix jointly.

    Crawler nodes can measure web sites but not each other at the
    application level, so a fleet's landmark phase has ``rtt[a, b]`` only
    between landmark nodes ``a`` and reference sites ``b``.  Both sets get
    coordinates from the same relative-error objective; afterwards other
    nodes and sites are placed with :func:`embed` against either set.
    """
    _check_dims(dims, restarts)
    d = _as_rtt(rtt, "rtt")
    na, nb = d.shape
    mask = np.isfinite(d)
    if not mask.any():
        raise ValueError("no pair was measured")
    scale = float(np.nanmedian(d))
    rng = np.random.default_rng(seed)

    def objective(flat: FloatArray) -> tuple[float, FloatArray]:
        x = flat[: na * dims].reshape(na, dims)
        y = flat[na * dims :].reshape(nb, dims)
        r, factor, diff = _cross_terms(x, y, d, mask)
        gx = np.einsum("ij,ijk->ik", factor, diff)
        gy = -np.einsum("ij,ijk->jk", factor, diff)
        return float(np.sum(r * r)), np.concatenate([gx.ravel(), gy.ravel()])

    best: tuple[float, FloatArray] | None = None
    for _ in range(restarts):
        x0 = rng.uniform(-scale, scale, size=(na + nb) * dims)
        res = _minimize()(objective, x0, jac=True, method="L-BFGS-B", options={"maxiter": 3000})
        if best is None or float(res.fun) < best[0]:
            best = (float(res.fun), np.asarray(res.x, dtype=np.float64))
    assert best is not None
    x = best[1][: na * dims].reshape(na, dims)
    y = best[1][na * dims :].reshape(nb, dims)
    r, _, _ = _cross_terms(x, y, d, mask)
    ea = np.sqrt(np.sum(r * r, axis=1) / np.maximum(mask.sum(axis=1), 1))
    eb = np.sqrt(np.sum(r * r, axis=0) / np.maximum(mask.sum(axis=0), 1))
    return Embedding(x, ea), Embedding(y, eb)


# ------------------------------------------------------------------ landmarks


def select_landmarks(
    rtt: npt.ArrayLike,
    k: int,
    *,
    method: str = "validated",
    seed: int = 0,
    dims: int = 7,
    candidates: int = 32,
    swaps: int = 120,
    validation: int = 240,
    min_separation: float = MIN_LANDMARK_SEPARATION_MS,
) -> IntArray:
    """Choose ``k`` landmark indices among the hosts of a square RTT matrix.

    The paper picks landmarks among the crawler nodes, which can measure
    each other, so the choice may use their mutual RTTs:

    * ``"validated"`` (default) holds out ``validation`` random hosts (at
      most half of them), draws ``candidates`` random landmark sets from the
      others, keeps the one whose coordinates predict the held-out pairs
      best (median + p90 of the relative error), then tries ``swaps``
      single-landmark replacements and keeps each that helps by more than
      :data:`SELECTION_MARGIN`.  It beats random choice because it rejects
      sets that leave a region unconstrained or that contain nodes whose
      RTTs violate the triangle inequality badly.  Draws and swaps keep
      landmarks at least ``min_separation`` ms apart where the pool allows
      (the paper spreads landmarks over cities and carriers).
      Why these defaults: the search keeps the set that looks best on the
      held-out sample, so its outcome is only as good as that sample: with
      80 held-out hosts (and an iteration-capped host placement), the
      PlanetLab p90 over selection seeds spans 0.27-0.32.  With 240
      held-out hosts, 32 sets and 120 swaps, seeds 0-4 gave median
      0.067-0.076 and p90 0.261-0.276, for 12-15 s on 490 nodes on a
      2-core machine (``benchmarks/gnp_accuracy.py``); seed 0 chose
      the same landmarks for any BLAS thread count or kernel, and for the
      matrix perturbed in its 15th digit.
    * ``"medoids"``: k-medoids on network distance, the paper's "ideal
      scheme" (cluster centres).  On PlanetLab it concentrates landmarks
      where most nodes are and predicts worse than random at the tail.
    * ``"random"``: the baseline.
    """
    m = _as_rtt(rtt, "rtt")
    n = m.shape[0]
    if m.shape[1] != n:
        raise ValueError(f"RTT matrix must be square, got shape {m.shape}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"k must be an integer in [1, {n}], got {k!r}")
    rng = np.random.default_rng(seed)
    if method == "random":
        return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
    if method == "validated":
        return _select_validated(m, k, rng, dims, candidates, swaps, validation, min_separation)
    if method != "medoids":
        raise ValueError(
            f"unknown landmark selection method {method!r}: use 'validated', 'medoids' or 'random'"
        )
    sym = np.where(np.isfinite(m) & np.isfinite(m.T), (m + m.T) / 2.0, np.fmin(m, m.T))
    fill = float(np.nanmedian(sym)) if np.isfinite(sym).any() else 1.0
    dist = np.where(np.isfinite(sym), sym, fill)
    np.fill_diagonal(dist, 0.0)
    # k-medoids++ seeding, then alternating assignment / medoid update until stable.
    medoids = [int(rng.integers(n))]
    for _ in range(1, k):
        near = dist[:, medoids].min(axis=1)
        weights = near**2
        total = float(weights.sum())
        if total <= 0:
            rest = np.setdiff1d(np.arange(n), medoids)
            medoids.append(int(rng.choice(rest)))
        else:
            medoids.append(int(rng.choice(n, p=weights / total)))
    current = np.array(medoids, dtype=np.int64)
    for _ in range(100):
        labels = np.argmin(dist[:, current], axis=1)
        updated = current.copy()
        for c in range(k):
            members = np.flatnonzero(labels == c)
            if members.size == 0:
                continue
            within = dist[np.ix_(members, members)].sum(axis=1)
            updated[c] = members[int(np.argmin(within))]
        if len(set(updated.tolist())) < k:  # two clusters collapsed onto one medoid
            break
        if np.array_equal(np.sort(updated), np.sort(current)):
            current = updated
            break
        current = updated
    return np.sort(current).astype(np.int64)


def _spread_draw(
    pool: IntArray, k: int, near: npt.NDArray[np.bool_], rng: np.random.Generator
) -> IntArray:
    """``k`` random pool members, none ``near`` another while the pool allows.

    One pass over a shuffled pool, skipping members near one already taken,
    then topping up from the skipped ones if fewer than ``k`` remain: it
    always terminates, and it only relaxes the spacing when it must.
    """
    order = pool[rng.permutation(pool.size)]
    taken: list[int] = []
    skipped: list[int] = []
    for host in order.tolist():
        if len(taken) == k:
            break
        (skipped if taken and near[host, taken].any() else taken).append(host)
    taken.extend(skipped[: k - len(taken)])
    return np.array(taken, dtype=np.int64)


def _select_validated(
    m: FloatArray,
    k: int,
    rng: np.random.Generator,
    dims: int,
    candidates: int,
    swaps: int,
    validation: int,
    min_separation: float,
) -> IntArray:
    n = m.shape[0]
    held = min(validation, n // 2, n - k)
    if held < 2 or candidates < 1:
        return np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64)
    hosts = rng.choice(n, size=held, replace=False)
    pool = np.setdiff1d(np.arange(n), hosts).astype(np.int64)
    iu = np.triu_indices(held, k=1)
    measured = m[np.ix_(hosts, hosts)][iu]
    sym = np.where(np.isfinite(m) & np.isfinite(m.T), (m + m.T) / 2.0, np.fmin(m, m.T))
    near = np.nan_to_num(sym, nan=np.inf) < min_separation
    np.fill_diagonal(near, False)

    def score(landmarks: IntArray) -> float:
        fit = fit_landmarks(m[np.ix_(landmarks, landmarks)], dims, restarts=2, seed=0)
        placed = embed(m[np.ix_(hosts, landmarks)], fit.coords, restarts=1, seed=0)
        err = relative_errors(distances(placed.coords)[iu], measured)
        if err.size == 0:
            return math.inf
        return float(np.median(err) + np.percentile(err, 90))

    best: tuple[float, IntArray] | None = None
    for _ in range(candidates):
        chosen = _spread_draw(pool, k, near, rng)
        value = score(chosen)
        if best is None or value < best[0] - SELECTION_MARGIN:
            best = (value, chosen)
    assert best is not None
    for _ in range(swaps):
        trial = best[1].copy()
        slot = int(rng.integers(k))
        kept = np.delete(trial, slot)
        others = np.setdiff1d(pool, trial)
        spaced = others[~near[np.ix_(others, kept)].any(axis=1)] if kept.size else others
        choices = spaced if spaced.size else others
        if choices.size == 0:
            break
        trial[slot] = choices[rng.integers(choices.size)]
        value = score(trial)
        if value < best[0] - SELECTION_MARGIN:
            best = (value, trial)
    return np.sort(best[1]).astype(np.int64)
