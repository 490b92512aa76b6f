"""The mmchain pattern ``w = alpha * X^T (v ⊙ (X y)) + beta * z`` and ``matvec`` (``X y``).

One public function per operator; :func:`fusedml.resolve_backend` picks the implementation:

* ``"fused"`` -- Triton kernels reading X once (dense: :mod:`.dense`; CSR: :mod:`.csr`);
* ``"ops"``   -- the operator-level torch baseline (:mod:`.ops`);
* ``"cpu"``   -- the cache-blocked one-pass host path (:mod:`.cpu`);
* ``"auto"``  -- fused on CUDA, cpu otherwise.

:mod:`.reference` holds the float64 literal formula used by the tests. See README.md beside this
file for the math and the kernel design.
"""
from __future__ import annotations

import torch

from .._dispatch import resolve_backend
from ._checks import Problem, check_bindable, check_config, prepare_matvec, prepare_mmchain
from .reference import matvec_reference, mmchain_reference

__all__ = ["aligned_rows", "mmchain", "bind_mmchain", "BoundMMChain", "matvec", "loss_gradient", "bind_loss_gradient",
           "LossGradient", "BoundLossGradient", "mmchain_reference", "matvec_reference"]


def _csr_module():
    try:
        from . import csr
    except ImportError as e:  # the CSR kernels live in their own module
        raise NotImplementedError(
            f"the fused CSR kernels (fusedml/mmchain/csr.py) are not available: {e}; "
            "use backend='ops' or backend='cpu'"
        ) from e
    return csr


def _run_mmchain(P: Problem, backend: str, *, key, deterministic, config) -> torch.Tensor:
    if backend == "ops":
        from .ops import mmchain_ops

        return mmchain_ops(P, key=key, config=config)
    if backend == "cpu":
        from .cpu import mmchain_cpu

        return mmchain_cpu(P)
    if P.is_csr:
        csr = _csr_module()
        return csr.csr_mmchain_fused(
            P.X, P.y, P.v, P.z, P.alpha, P.beta, intercept=P.intercept, v_op=P.v_op,
            deterministic=deterministic, config=config,
        )
    from .dense import dense_mmchain_fused

    return dense_mmchain_fused(P, deterministic=deterministic, config=config)


def mmchain(X, y, v=None, z=None, alpha=1.0, beta=0.0, *, intercept=False, v_op="mul",
            backend="auto", deterministic=False, check_finite=False, config=None) -> torch.Tensor:
    """``w = alpha * X^T (v ⊙ (X y)) + beta * z`` with one read of X (fused backend).

    Parameters
    ----------
    X : array-like [N, D] or sparse CSR
        Dense torch tensor (any strides) or numpy array; or CSR as a scipy ``csr_matrix``, a torch
        sparse CSR tensor or a :class:`fusedml.CSRMatrix`. Storage float32/float64/bfloat16/
        float16. An object with a ``_fusedml_mmchain`` method (e.g. a streamed Dask matrix) is
        delegated to.
    y : array-like [D] or [D, m] (m <= 16), or None
        None skips ``X y``: then ``w = alpha * X^T v + beta * z`` and ``v`` is required.
    v : array-like [N] or [N, m], optional
        Row weights; None means ones. ``[N]`` with a matrix y broadcasts over the columns.
    z : array-like [D] or [D, m], optional
        Added as ``beta * z``.
    alpha, beta : float
    intercept : bool
        Treat X as ``[X, 1]`` (an implicit trailing column of ones, never materialised): y, z and
        the result then have ``D + 1`` rows.
    v_op : {"mul", "softmax"}
        ``"mul"``: ``p = v ⊙ t``. ``"softmax"`` (matrix y only, multinomial Hessian):
        ``p_nj = v_nj (t_nj - sum_l v_nl t_nl)``.
    backend : {"auto", "fused", "ops", "cpu"}
    deterministic : bool
        Fused backend: bitwise identical results on every run (no float atomics; per-program
        partials reduced in a fixed order).
    check_finite : bool
        Raise ``ValueError`` naming the argument if X, y, v or z hold NaN or infinity.
    config : dict, optional
        Expert overrides: dense fused launch parameters (keys of
        :class:`fusedml.mmchain.launch.DenseConfig`; for CSR X those of
        :class:`fusedml.mmchain.csr.CSRConfig` and ``"memory"``), ``{"ops_transpose": "cached" |
        "on_the_fly"}`` for the CSR ops baseline. Other keys raise ``ValueError``.

    Returns
    -------
    torch.Tensor
        New tensor ``[D(+1)]`` or ``[D(+1), m]`` on X's device, float32 (float64 for float64 X).
        numpy inputs give CPU torch tensors.

    Examples
    --------
    >>> import torch, fusedml
    >>> X = torch.randn(100, 8); y = torch.randn(8); v = torch.rand(100)
    >>> w = fusedml.mmchain(X, y, v, backend="cpu")
    >>> torch.allclose(w, X.T @ (v * (X @ y)), rtol=1e-4, atol=1e-4)
    True
    """
    if hasattr(X, "_fusedml_mmchain") and not isinstance(X, torch.Tensor):
        return X._fusedml_mmchain(y, v, z, alpha, beta, intercept=intercept, v_op=v_op, backend=backend,
                                  deterministic=deterministic, check_finite=check_finite, config=config)
    P = prepare_mmchain(X, y, v, z, alpha, beta, intercept=intercept, v_op=v_op, check_finite=check_finite)
    check_config(config, P.is_csr)
    be = resolve_backend(backend, P.device)
    w = _run_mmchain(P, be, key=X, deterministic=bool(deterministic), config=config)
    return P.finish(w)


class BoundMMChain:
    """:func:`mmchain` over fixed operands, validated once and re-run on their current contents.

    Made by :func:`bind_mmchain`. Calling it (no arguments) computes ``alpha * [X,1]^T (v ⊙
    ([X,1] y)) + beta * z`` from what ``y``, ``v`` and ``z`` hold at that moment. On the fused
    dense path the result is ONE persistent buffer, overwritten by the next call (read it, or
    copy it, before calling again), and the launch repeats Triton's compiled kernel with the
    same arguments (:func:`fusedml._launch.launch`); elsewhere each call returns a new tensor.

    Attributes
    ----------
    backend : str
        The resolved backend.
    calls : int
        Calls so far.
    """

    def __init__(self, X, P, backend, deterministic, config):
        self.X, self.P, self.backend = X, P, backend
        self.deterministic, self.config = deterministic, config
        self.calls = 0
        self._out = self._run = None
        if backend == "fused" and not P.is_csr and not deterministic:
            from .._launch import bound_enabled
            from .dense import dense_mmchain_fused

            self._out = torch.empty((P.Dx, P.m), dtype=P.acc_dtype, device=P.device)
            self._view = P.finish(self._out)
            if bound_enabled():
                self._run = dense_mmchain_fused(P, config=config, out=self._out, bind=True)
            else:  # the pass set up at each call (A/B benchmarks)
                self._run = lambda: dense_mmchain_fused(P, config=config, out=self._out)

    @property
    def persistent(self) -> bool:
        """Whether every call returns the same buffer (the fused dense path)."""
        return self._out is not None

    def launch_only(self):
        """The product without its first step, for a caller that writes that step itself.

        A call of the bound product first writes ``beta * z`` (zero without ``z``) into its
        result buffer, one launch, then accumulates ``alpha * [X,1]^T (v ⊙ ([X,1] y))`` onto it.
        The callable returned here runs the accumulation alone: whoever calls it must have left
        ``beta * z`` in :attr:`out` since the previous call (a CG update kernel that forms the next
        direction can write it in the same sweep: :func:`fusedml.cg.cg_update`'s ``prefill``).

        Returns
        -------
        callable or None
            ``() -> torch.Tensor`` (the same view a call returns); None off the bound fused dense
            path (there each call makes its own result).
        """
        go = getattr(self._run, "launch_only", None)
        if go is None:
            return None
        view = self._view

        def run():
            self.calls += 1
            go()
            return view
        return run

    @property
    def out(self):
        """The persistent ``[Dx, m]`` result buffer (None where :attr:`persistent` is False)."""
        return self._out

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        if self._run is not None:
            self._run()
            return self._view
        return self.P.finish(_run_mmchain(self.P, self.backend, key=self.X, deterministic=self.deterministic,
                                          config=self.config))


def bind_mmchain(X, y, v=None, z=None, alpha=1.0, beta=0.0, *, intercept=False, v_op="mul", backend="auto",
                 deterministic=False, config=None) -> BoundMMChain:
    """:func:`mmchain` for repeated calls on the same operands (an iterative solver's products).

    The arguments are checked once, here; each call of the returned object recomputes the
    product from the operands' current contents, without the per-call validation, dispatch and
    launch set-up (~0.1 ms of host time per :func:`mmchain` call on the H200 host, as much as the
    product itself at a million rows). The caller may change the contents of ``y``, ``v`` and
    ``z`` between calls, in place; not their shapes or storage. X is taken as it is now: a numpy X
    that must be converted is copied, and after a numpy write into a CSR X's arrays call
    :func:`fusedml.clear_csr_caches` (copies derived from them are cached).

    Parameters
    ----------
    X, y, v, z, alpha, beta, intercept, v_op, backend, deterministic, config
        As for :func:`mmchain`, except that ``y``, ``v`` and ``z`` must be torch tensors already
        on X's device in the accumulation dtype (float64 for float64 X, else float32): a
        conversion would copy them, and the bound product would not see later changes.

    Returns
    -------
    BoundMMChain
        Call it to compute; on the fused dense path each call overwrites one result buffer.

    Examples
    --------
    >>> import torch, fusedml
    >>> X = torch.randn(100, 8); y = torch.zeros(8); v = torch.rand(100)
    >>> op = fusedml.bind_mmchain(X, y, v, backend="cpu")
    >>> y.copy_(torch.randn(8))  # doctest: +ELLIPSIS
    tensor(...)
    >>> torch.allclose(op(), X.T @ (v * (X @ y)), rtol=1e-4, atol=1e-4)
    True
    """
    if hasattr(X, "_fusedml_mmchain") and not isinstance(X, torch.Tensor):
        raise TypeError(f"bind_mmchain needs a dense tensor or CSR matrix X, got {type(X).__name__} "
                        "(call mmchain for streamed matrices)")
    P = prepare_mmchain(X, y, v, z, alpha, beta, intercept=intercept, v_op=v_op, check_finite=False)
    check_config(config, P.is_csr)
    check_bindable("bind_mmchain", P, ((y, "y"), (v, "v"), (z, "z")))
    be = resolve_backend(backend, P.device)
    return BoundMMChain(X, P, be, bool(deterministic), config)


def matvec(X, y, *, intercept=False, backend="auto", config=None) -> torch.Tensor:
    """``t = X y`` (``[X, 1] y`` with intercept), reading X once.

    Parameters
    ----------
    X : array-like [N, D] or sparse CSR
        As for :func:`mmchain`; objects with ``_fusedml_matvec`` are delegated to.
    y : array-like [D(+1)] or [D(+1), m] (m <= 16)
    intercept : bool
        Treat X as ``[X, 1]``.
    backend : {"auto", "fused", "ops", "cpu"}
    config : dict, optional
        Fused launch overrides (dense or CSR; see :func:`mmchain`).

    Returns
    -------
    torch.Tensor
        ``[N]`` or ``[N, m]`` on X's device, float32 (float64 for float64 X).
    """
    if hasattr(X, "_fusedml_matvec") and not isinstance(X, torch.Tensor):
        return X._fusedml_matvec(y, intercept=intercept, backend=backend)
    P = prepare_matvec(X, y, intercept=intercept)
    check_config(config, P.is_csr)
    be = resolve_backend(backend, P.device)
    if be == "ops":
        from .ops import matvec_ops

        t = matvec_ops(P)
    elif be == "cpu":
        from .cpu import matvec_cpu

        t = matvec_cpu(P)
    elif P.is_csr:
        t = _csr_module().csr_matvec_fused(P.X, P.y, intercept=P.intercept, config=config)
    else:
        from .dense import dense_matvec_fused

        t = dense_matvec_fused(P, config=config)
    return P.finish(t)


from .lossgrad import BoundLossGradient, LossGradient, bind_loss_gradient, loss_gradient  # noqa: E402  (uses matvec and mmchain above)
from .dense import aligned_rows  # noqa: E402
