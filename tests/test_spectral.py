"""``tape.linalg.eigh`` / ``qr`` beyond the registry-driven cases (tests/cases_spectral.py):
the sign conventions, repeated eigenvalues, and the error paths."""

import numpy as np
import pytest

import tape as tp
import tape.frontend.linalg as la
from tape.layout.columns import E_ATTR
from tape.ops.validate import check_tape


def _sym(a):
    return np.tril(a) + np.tril(a, -1).T


def test_eigh_signs_are_deterministic_and_reconstruct():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 5, 5))
    w, v = la.eigh(a)
    w, v = w.numpy(), v.numpy()
    for b in range(3):
        np.testing.assert_allclose(v[b] @ np.diag(w[b]) @ v[b].T, _sym(a[b]), atol=1e-12)
        k = np.argmax(np.abs(v[b]), axis=0)
        assert (v[b][k, np.arange(5)] > 0).all()
    # the same matrix in another batch, replayed, and its upper-triangle twin: the same bits
    t = tp.record(lambda x: la.eigh(x)[1], a)
    np.testing.assert_array_equal(t.forward(a), v)
    np.testing.assert_array_equal(la.eigh(a[1]).eigenvectors.numpy(), v[1])
    np.testing.assert_array_equal(la.eigh(np.swapaxes(a, -1, -2), UPLO="U")[1].numpy(), v)


def test_qr_diagonal_positive_and_reconstructs():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((2, 6, 4))
    q, r = la.qr(a)
    q, r = q.numpy(), r.numpy()
    assert (np.diagonal(r, axis1=-2, axis2=-1) > 0).all()
    np.testing.assert_allclose(q @ r, a, atol=1e-12)
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(4), (2, 4, 4)),
                               atol=1e-12)  # fmt: skip
    assert np.array_equal(r, np.triu(r))


def test_repeated_eigenvalues():
    # eigenvalues stay differentiable; an eigenvector of a repeated eigenvalue does not
    a = np.diag([1.0, 1.0, 3.0])
    x = tp.tensor(a, requires_grad=True)
    (la.eigvalsh(x) * np.array([1.0, 2.0, 3.0])).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.diag([1.0, 2.0, 3.0]), atol=1e-15)
    x = tp.tensor(a, requires_grad=True)
    la.eigh(x)[1][:, 2].sum().backward()  # the simple eigenvalue's eigenvector: defined
    assert np.isfinite(x.grad.numpy()).all()
    t = tp.record(lambda x: la.eigh(x)[1][:, 0].sum(), a)
    g = t.gradient(a)
    assert np.isnan(np.tril(g)[np.tril_indices(3)]).all() and (np.triu(g, 1) == 0).all()
    with tp.detect_anomaly(), pytest.raises(tp.AnomalyError, match="eigh"):
        t.gradient(a)
    assert np.isfinite(t.gradient(np.diag([1.0, 2.0, 3.0]))).all()  # distinct: defined again


def test_error_paths():
    with pytest.raises(ValueError, match="more columns than rows"):
        la.qr(np.ones((2, 3)))
    with pytest.raises(ValueError, match="only mode='reduced'"):
        la.qr(np.eye(3), mode="complete")
    with pytest.raises(ValueError, match="square"):
        la.eigh(np.ones((2, 3)))
    with pytest.raises(ValueError, match="UPLO"):
        la.eigh(np.eye(2), UPLO="X")
    rank1 = np.outer(np.arange(1.0, 5.0), [1.0, 2.0, 3.0])
    with pytest.raises(la.LinAlgError, match=r"\(qr\).*rank deficient"):
        la.qr(rank1)
    t = tp.record(lambda x: la.qr(x).R.sum(), np.eye(4, 3) + 0.1)
    with pytest.raises(la.LinAlgError, match="rank deficient"):
        t.gradient(rank1)
    bad = np.eye(3)
    bad[2, 0] = np.nan
    with pytest.raises(la.LinAlgError, match=r"\(eigh\)"):
        la.eigh(bad)
    la.eigh(np.where(np.isnan(bad), 0.0, bad))  # the upper triangle is never read
    bad_u = np.eye(3)
    bad_u[0, 2] = np.inf
    la.eigh(bad_u)


def test_loaded_qr_entry_needs_m_at_least_n():
    t = tp.record(lambda x: la.qr(x).R.sum(), np.eye(4, 3) + 0.1)
    p = int(t.entries[0, E_ATTR])
    t.ipool[p + 1], t.ipool[p + 2] = 3, 4  # m = 3 < n = 4, sizes unchanged (12)
    with pytest.raises(ValueError, match=r"\(qr\): n = 4 exceeds m = 3"):
        check_tape(t)
