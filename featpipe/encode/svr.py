"""The rank-pooling SVR, solved exactly and in batches in the dual (representer) space.

Rank pooling (Fernando et al., "Modeling video evolution for action recognition", CVPR'15,
eq. 4; VideoDarwin's code) represents a sequence v_1..v_T by

    u* = argmin_u  ½‖u‖² + C Σ_{t=1..T} max(0, |t − uᵀv_t| − ε)²,

which is exactly liblinear's L2-regularised L2-loss ε-SVR in the primal, ``-s 11 -c C -p ε``
with no bias term (``-B -1``); VideoDarwin calls liblinear this way with C = 1 and liblinear's
default ε = 0.1.  (The HRP paper writes C/2 in front of the loss; featpipe uses liblinear's C.)

**Dual / representer form.**  The optimality condition u = 2C Σ_t s_t v_t with
s_t = sign(r_t)·max(0, |r_t| − ε), r_t = t − uᵀv_t, shows u = Σ_t α_t v_t, so each window is a
T×T problem on its Gram matrix G = V Vᵀ (T ≪ D): with r = y − Gα, y = (1..T),

    f(α) = ½ αᵀGα + C Σ_t max(0, |r_t| − ε)²     (= the primal objective at u = Vᵀα).

**Solver: semismooth (active-set) Newton.**  Let A = {t : |r_t| > ε} be the active constraints
and σ_t = sign(r_t).  The generalised Newton step of the primal (Hessian I + 2C Σ_{t∈A} v_t v_tᵀ)
lands, in representer coordinates, on

    (I + 2C G_AA) α_A = 2C (y_A − ε σ_A),   α_t = 0 for t ∉ A,

a masked T×T linear system.  Each step is damped by an Armijo backtracking line search on f, which
makes the iteration globally convergent; the full step is taken near the optimum and the active
set settles after a handful of steps, at which point α is the exact optimum (the objective is
quadratic on that piece).  All windows of equal length are solved together as a (B, T, T)
batch: the masked systems have identity rows for inactive t, so every system has the same shape.

The code uses only the array API (``featpipe.backend.namespace``), so it runs unchanged on
numpy, torch (CPU or CUDA), CuPy and ``array_api_strict``.  The Gram matrix is formed in the
input's precision and the T×T solves run in float64 where the namespace has it.

Entry points: :func:`rank_svr_dual` (Gram matrices in, coefficients and active sets out),
:func:`rank_svr` (normalised vectors in, u out), :func:`rank_svr_unit` /
:func:`rank_svr_unit_gram` (the same on unnormalised rows, L2-normalising in Gram space), and
:func:`rank_svr_primal` for windows too long for a T×T Gram matrix (matrix-free Newton-CG in
the primal, same objective and stopping rule as liblinear).

The windows of a numpy ``hrp`` layer are solved by a compiled copy of :func:`rank_svr_dual` for
one window (:func:`featpipe.encode._window_loop._dual`, the same steps, fused with the window's
Gram matrix and pooling); tests compare it with this array-API solver.

``rank_svr_liblinear`` is the reference path: one liblinear ``-s 11 -B -1`` call per window.
liblinear's ``-e`` for ``-s 11`` stops its trust-region Newton when
‖∇f(w)‖₂ ≤ e·‖∇f(w₀)‖₂ (default e = 0.001); tests run it with e = 1e-8 and check that this solver
reaches the same objective to a relative 1e-6.
"""

from __future__ import annotations

import numpy as np

from featpipe.backend import namespace, refuse_grad, solve_spd
from featpipe.errors import InputError

#: Newton iterations before giving up (the active set typically settles in 3–10).
MAX_NEWTON_ITER = 100
#: Backtracking halvings per line search.
MAX_BACKTRACK = 60
#: Armijo sufficient-decrease constant.
ARMIJO = 1e-4


def check_svr_params(C, epsilon) -> tuple[float, float]:
    """Validate the SVR parameters: C > 0 and ε ≥ 0, both finite."""
    try:
        C, epsilon = float(C), float(epsilon)
    except (TypeError, ValueError) as err:
        raise InputError(f"C and epsilon must be numbers, got C={C!r}, epsilon={epsilon!r}") \
            from err
    if not np.isfinite(C) or C <= 0:
        raise InputError(f"C must be a finite number > 0, got C={C}")
    if not np.isfinite(epsilon) or epsilon < 0:
        raise InputError(f"epsilon must be a finite number >= 0, got epsilon={epsilon}")
    return C, epsilon


def _work_dtype(xp, array):
    """float64 where the namespace/device offers it (always on CPU), else the input dtype."""
    try:
        return xp.float64 if xp.isdtype(xp.float64, "real floating") else array.dtype
    except AttributeError:
        return array.dtype


def _matvec(G, a):
    return (G @ a[..., None])[..., 0]


def _soft_threshold(xp, r, epsilon):
    """s = sign(r)·max(0, |r| − ε) = r − clip(r, −ε, ε): the scaled loss gradient."""
    return r - xp.clip(r, -epsilon, epsilon)


def rank_svr_dual(G, C: float = 1.0, epsilon: float = 0.1, lengths=None):
    """Solve the rank-pooling SVR for a batch of windows given their Gram matrices.

    Parameters
    ----------
    G : array (B, T, T)
        Gram matrices V_b V_bᵀ of the (already mapped, smoothed and L2-normalised) window
        vectors; the targets are t = 1..T.  Any array-API namespace.
    C, epsilon : float
        liblinear's ``-c`` (> 0) and ``-p`` (≥ 0).
    lengths : sequence of int (B,), optional
        Windows shorter than T, zero-padded at the end: only t < lengths[b] count (their
        alpha and active entries beyond the length are zero/False).

    Returns
    -------
    alpha : array (B, T)
        Representer coefficients, u_b = Σ_t alpha[b, t] v_{b,t}; dtype of ``G``.
    active : bool array (B, T)
        The active constraints at the optimum, |t − u_bᵀv_{b,t}| > ε.

    With s = sign(r)·max(0, |r| − ε) (r = y − Gα) the active rows are those with s ≠ 0 and
    y_A − ε σ_A = (Gα + s)_A, so a Newton step costs one batched solve and two batched
    matrix-vector products; the line search reuses Gα and G d.  Differentiable under torch
    autograd: at the optimum the last (full) step is the solve of the final active set, whose
    derivative is the implicit one.
    """
    C, epsilon = check_svr_params(C, epsilon)
    xp = namespace(G)
    if G.ndim != 3 or G.shape[1] != G.shape[2]:
        raise InputError(f"G must have shape (B, T, T), got {tuple(G.shape)}")
    if not xp.isdtype(G.dtype, "real floating"):
        raise InputError(f"G must be a real floating array, got dtype {G.dtype}")
    out_dtype = G.dtype
    B, T = G.shape[0], G.shape[1]
    dtype = _work_dtype(xp, G)
    device = getattr(G, "device", None)
    G = xp.astype(G, dtype)
    y = xp.astype(xp.arange(1, T + 1, device=device), dtype)
    eye = xp.eye(T, dtype=dtype, device=device)
    if lengths is None:
        valid = None
    else:
        lengths = xp.asarray([int(n) for n in lengths], device=device)
        if lengths.shape != (B,):
            raise InputError(f"lengths must have {B} entries, got {lengths.shape[0]}")
        valid = xp.astype(xp.arange(T, device=device)[None, :] < lengths[:, None], dtype)

    def loss_gradient(Ga):
        s = _soft_threshold(xp, y - Ga, epsilon)
        return s if valid is None else s * valid

    two_c = 2.0 * C
    a = xp.zeros((B, T), dtype=dtype, device=device)
    Ga = xp.zeros((B, T), dtype=dtype, device=device)
    s = loss_gradient(Ga)
    f = C * xp.sum(s * s, axis=-1)
    done = xp.zeros((B,), dtype=xp.bool, device=device)
    for _iteration in range(MAX_NEWTON_ITER):
        active = s != 0.0
        m = xp.astype(active, dtype)
        M = eye + two_c * (m[:, :, None] * m[:, None, :]) * G
        a_newton = solve_spd(M, (two_c * m * (Ga + s))[..., None])[..., 0]
        d = a_newton - a
        Gd = _matvec(G, d)
        # directional derivative of f along d: (α − 2C s)ᵀ G d
        slope = xp.sum((a - two_c * s) * Gd, axis=-1)
        slack = 1e-13 * xp.abs(f)
        step = xp.ones_like(f)
        for _ in range(MAX_BACKTRACK):
            a_try = a + step[:, None] * d
            Ga_try = Ga + step[:, None] * Gd
            s_try = loss_gradient(Ga_try)
            f_try = 0.5 * xp.sum(a_try * Ga_try, axis=-1) + C * xp.sum(s_try * s_try, axis=-1)
            ok = f_try <= f + ARMIJO * step * slope + slack
            if bool(xp.all(ok)):
                break
            step = xp.where(ok, step, 0.5 * step)
        Ga_try = _matvec(G, a_try)
        s_new = loss_gradient(Ga_try)
        f_new = 0.5 * xp.sum(a_try * Ga_try, axis=-1) + C * xp.sum(s_new * s_new, axis=-1)
        same = (s_new != 0.0) == active
        same = same & (((s_new > 0.0) == (s > 0.0)) | ~active)
        # a window that settled keeps the coefficients it settled at, so that its result
        # does not depend on the windows it shares a batch with
        frozen = done[:, None]
        a = xp.where(frozen, a, a_try)
        Ga = xp.where(frozen, Ga, Ga_try)
        s = xp.where(frozen, s, s_new)
        f = xp.where(done, f, f_new)
        done = done | (xp.all(same, axis=-1) & (step == 1.0))
        if bool(xp.all(done)):
            break
    else:
        raise RuntimeError(f"rank_svr_dual: active-set Newton did not settle in "
                           f"{MAX_NEWTON_ITER} iterations for {int(xp.sum(~done))} windows")
    return xp.astype(a, out_dtype), s != 0.0


def gram(V):
    """Batched Gram matrices V Vᵀ of (B, T, D) window vectors.

    numpy: one 2-D product per window (BLAS's symmetric kernel), so that a window's Gram
    matrix has the same bits alone or in a batch; other namespaces: one batched product."""
    xp = namespace(V)
    if V.shape[0] == 0:
        return xp.zeros((0, V.shape[1], V.shape[1]), dtype=V.dtype)
    if isinstance(V, np.ndarray) or V.shape[0] == 1:
        return xp.stack([V[b, ...] @ xp.permute_dims(V[b, ...], (1, 0))
                         for b in range(V.shape[0])], axis=0)
    return V @ xp.permute_dims(V, (0, 2, 1))


def rank_svr(V, C: float = 1.0, epsilon: float = 0.1, lengths=None):
    """Rank-pool a batch of equal-length windows: V (B, T, D) -> U (B, D), u_b = V_bᵀ α_b.

    With ``lengths``, window b is V[b, :lengths[b]] (zero-padded beyond).

    ``V`` holds the mapped, smoothed and L2-normalised vectors (see :mod:`featpipe.encode.maps`);
    the SVR is solved exactly by :func:`rank_svr_dual`.
    """
    xp = namespace(V)
    if V.ndim != 3:
        raise InputError(f"V must have shape (B, T, D), got {tuple(V.shape)}")
    alpha, _ = rank_svr_dual(gram(V), C, epsilon, lengths)
    return (alpha[:, None, :] @ V)[:, 0, :] if V.shape[0] else xp.zeros(
        (0, V.shape[2]), dtype=V.dtype)


def rank_svr_unit(W, C: float = 1.0, epsilon: float = 0.1, lengths=None):
    """:func:`rank_svr` on the L2-normalised rows of W (B, T, D), normalising in Gram space.

    See :func:`rank_svr_unit_gram`; the normalised rows are never formed (two passes over the
    (B, T, D) array fewer).  Zero rows stay zero.
    """
    xp = namespace(W)
    if W.ndim != 3:
        raise InputError(f"W must have shape (B, T, D), got {tuple(W.shape)}")
    if W.shape[0] == 0:
        return xp.zeros((0, W.shape[2]), dtype=W.dtype)
    beta = rank_svr_unit_gram(gram(W), C, epsilon, lengths)
    return (xp.astype(beta, W.dtype)[:, None, :] @ W)[:, 0, :]


def rank_svr_unit_gram(G, C: float = 1.0, epsilon: float = 0.1, lengths=None):
    """Coefficients β (B, T) with u = Σ_t β_t w_t for the SVR on v_t = w_t / ‖w_t‖, given the
    Gram matrices G = W Wᵀ of the unnormalised rows.

    With n_t = ‖w_t‖ = √G_tt, the Gram matrix of the v_t is diag(1/n) G diag(1/n) and
    u = Σ_t α_t v_t = Σ_t (α_t / n_t) w_t.  Rows with n_t = 0 get β_t = 0.
    """
    xp = namespace(G)
    dtype = _work_dtype(xp, G)
    G = xp.astype(G, dtype)
    norms = xp.sqrt(xp.linalg.diagonal(G))
    inverse = xp.where(norms > 0, 1.0 / xp.where(norms > 0, norms, 1.0), 0.0)
    alpha, _ = rank_svr_dual(G * inverse[:, :, None] * inverse[:, None, :], C, epsilon, lengths)
    return alpha * inverse


def rank_svr_objective(V, U, C: float = 1.0, epsilon: float = 0.1):
    """The primal objective ½‖u‖² + C Σ_t max(0, |t − uᵀv_t| − ε)² per window, numpy float64."""
    V = np.asarray(V, dtype=np.float64)
    U = np.asarray(U, dtype=np.float64)
    y = np.arange(1, V.shape[1] + 1, dtype=np.float64)
    excess = np.maximum(np.abs(y - np.einsum("btd,bd->bt", V, U)) - epsilon, 0.0)
    return 0.5 * np.sum(U * U, axis=-1) + C * np.sum(excess * excess, axis=-1)


def rank_svr_liblinear(V, C: float = 1.0, epsilon: float = 0.1, tol: float | None = None):
    """Reference path: one liblinear ``-s 11 -c C -p ε -B -1`` call per window (numpy only).

    ``tol`` is liblinear's ``-e`` (None: liblinear's default 0.001, as VideoDarwin runs it).
    Returns U (B, D) float64.
    """
    from liblinear import liblinearutil

    C, epsilon = check_svr_params(C, epsilon)
    refuse_grad(V, what="rank_svr_liblinear")
    V = np.asarray(V, dtype=np.float64)
    if V.ndim != 3:
        raise InputError(f"V must have shape (B, T, D), got {V.shape}")
    options = f"-s 11 -c {C!r} -p {epsilon!r} -B -1 -q"
    if tol is not None:
        options += f" -e {float(tol)!r}"
    y = np.arange(1, V.shape[1] + 1, dtype=np.float64)
    U = np.zeros((V.shape[0], V.shape[2]))
    for b in range(V.shape[0]):
        model = liblinearutil.train(y, V[b], options)
        w, _ = model.get_decfun()
        # liblinear sizes w by the largest feature index present; trailing zero columns drop
        U[b, : len(w)] = w
    return U


def _chunks_matvec(xp, chunks, u):
    return xp.concat([c.matvec(u) if hasattr(c, "matvec") else c @ u for c in chunks], axis=0)


def _chunks_rmatvec(xp, chunks, s):
    out, start = None, 0
    for c in chunks:
        block = s[start: start + c.shape[0]]
        part = c.rmatvec(block) if hasattr(c, "rmatvec") else \
            xp.permute_dims(c, (1, 0)) @ block
        out = part if out is None else out + part
        start += c.shape[0]
    return out


def rank_svr_primal(chunks, C: float = 1.0, epsilon: float = 0.1, rtol: float = 1e-10):
    """The same SVR for one long window, solved in the primal without forming its Gram matrix.

    ``chunks`` are consecutive row blocks of V (T, D) (their concatenation is never formed):
    arrays, or objects with ``shape``, ``array`` (any array of the block's namespace and dtype),
    ``matvec(u)`` and ``rmatvec(s)`` that represent a block implicitly.
    Semismooth Newton on u ∈ R^D: gradient u − 2C Vᵀs, generalised Hessian
    I + 2C V_Aᵀ V_A applied matrix-free inside conjugate gradients, Armijo line search; stops
    when ‖∇f(u)‖ ≤ rtol·‖∇f(0)‖ (liblinear's criterion for ``-s 11``, with rtol in place of
    ``-e``) and the active set no longer changes.  Memory: V plus a few vectors of length T
    and D.  Used for windows too long for the T×T dual (the final layer of long sequences).
    Returns u (D,) in V's dtype.  Not differentiable (host-side step sizes): torch tensors
    that require grad are refused; :func:`rank_svr` is the differentiable solver.
    """
    C, epsilon = check_svr_params(C, epsilon)
    arrays = [getattr(c, "array", c) for c in chunks]
    refuse_grad(*arrays, what="rank_svr_primal (the long-window SVR solver)")
    xp = namespace(*arrays)
    dtype = arrays[0].dtype
    device = getattr(arrays[0], "device", None)
    T = sum(c.shape[0] for c in chunks)
    D = chunks[0].shape[1]
    y = xp.astype(xp.arange(1, T + 1, device=device), dtype)
    u = xp.zeros((D,), dtype=dtype, device=device)
    p = xp.zeros((T,), dtype=dtype, device=device)

    def objective(u, p):
        excess = xp.clip(xp.abs(y - p) - epsilon, min=0.0)
        return float(0.5 * xp.sum(u * u) + C * xp.sum(excess * excess))

    f = f_previous = objective(u, p)
    g0 = None
    previous_active = None
    resolution = 8.0 * float(xp.finfo(dtype).eps)
    for _ in range(MAX_NEWTON_ITER):
        r = y - p
        s = _soft_threshold(xp, r, epsilon)
        active = s != 0.0
        g = u - (2.0 * C) * _chunks_rmatvec(xp, chunks, s)
        gnorm = float(xp.linalg.vector_norm(g))
        g0 = gnorm if g0 is None else g0
        settled = previous_active is not None and bool(xp.all(active == previous_active))
        # converged, or the active set is final and the dtype cannot resolve more progress
        if gnorm <= rtol * g0 or gnorm == 0.0 or (
                settled and f_previous - f <= resolution * abs(f)):
            break
        m = xp.astype(active, dtype)

        def hess(d, m=m):
            return d + (2.0 * C) * _chunks_rmatvec(xp, chunks, m * _chunks_matvec(xp, chunks, d))

        d = _conjugate_gradient(xp, hess, -g, min(0.1, gnorm / g0) * gnorm)
        q = _chunks_matvec(xp, chunks, d)
        slope = float(xp.sum(g * d))
        step = 1.0
        for _ in range(MAX_BACKTRACK):
            f_try = objective(u + step * d, p + step * q)
            if f_try <= f + ARMIJO * step * slope + 1e-13 * abs(f):
                break
            step *= 0.5
        u = u + step * d
        p = _chunks_matvec(xp, chunks, u)
        f_previous, f = f, objective(u, p)
        previous_active = active
    else:
        raise RuntimeError(f"rank_svr_primal: Newton did not converge in {MAX_NEWTON_ITER} "
                           "iterations")
    return u


def _conjugate_gradient(xp, apply, b, atol, max_iter=1000):
    """Solve apply(x) = b for a symmetric positive definite operator, ‖residual‖ ≤ atol."""
    x = xp.zeros_like(b)
    r = b
    d = r
    rr = float(xp.sum(r * r))
    for _ in range(max_iter):
        if rr ** 0.5 <= atol:
            break
        Ad = apply(d)
        step = rr / float(xp.sum(d * Ad))
        x = x + step * d
        r = r - step * Ad
        rr_new = float(xp.sum(r * r))
        d = r + (rr_new / rr) * d
        rr = rr_new
    return x
