"""Host path (the ``"cpu"`` backend): row blocks, torch CPU kernels on each block, float64.

Never materialises N x K for the whole data: each block of ``rows`` rows produces its
responsibilities ``[rows, K]``, folds them into float64 partial statistics and is discarded.
Blocks are computed in float64 (the host has no fp32 speed cliff worth the accuracy loss here).
The same blocked float64 pass runs on X's own device where fp32 would not be accurate
(:func:`fusedml.gmm._prep.fp32_unsafe`: the fused and operator-level backends fall back to it).
"""
from __future__ import annotations

import torch

from ._prep import Prepared
from .ops import _shifted, block_stats, finish, weighted_log_prob

# Elements of the largest per-block temporary ([rows, max(K, D)]): ~8 MiB of float64, cache-friendly.
_BLOCK_ELEMS = 1 << 20


def block_rows(prep: Prepared) -> int:
    """Rows per host block: bounded temporaries whatever K and D."""
    return max(64, _BLOCK_ELEMS // max(prep.K, prep.D, 1))


def estep_cpu(prep: Prepared, return_log_prob: bool):
    """Blocked float64 E-step on X's device; see :func:`fusedml.gmm_estep`."""
    f64, dev = torch.float64, prep.X.device
    N, K, D = prep.N, prep.K, prep.D
    rows = block_rows(prep)
    lp = torch.empty(N, dtype=f64, device=dev) if return_log_prob else None
    ll = torch.zeros((), dtype=f64, device=dev)
    nk = torch.zeros(K, dtype=f64, device=dev)
    full_like = prep.covariance_type in ("full", "tied")
    s1 = torch.zeros(K, D, dtype=f64, device=dev)
    s2 = torch.zeros((K, D, D) if full_like else (K, D), dtype=f64, device=dev)
    sw = prep.sample_weight
    for start in range(0, N, rows):
        stop = min(N, start + rows)
        out = block_stats(prep.X[start:stop], None if sw is None else sw[start:stop], prep, f64, return_log_prob)
        if return_log_prob:
            lp[start:stop] = out[0]
        ll += out[1]
        nk += out[2]
        s1 += out[3]
        s2 += out[4]
    return (lp,) + finish(prep, ll, nk, s1, s2)


def score_cpu(prep: Prepared):
    """Blocked float64 ``(log_prob [N] float64, labels [N] int64)`` on X's device."""
    rows = block_rows(prep)
    lp = torch.empty(prep.N, dtype=torch.float64, device=prep.X.device)
    labels = torch.empty(prep.N, dtype=torch.int64, device=prep.X.device)
    for start in range(0, prep.N, rows):
        stop = min(prep.N, start + rows)
        wlp = weighted_log_prob(_shifted(prep.X[start:stop], prep, torch.float64), prep, torch.float64)
        lp[start:stop] = torch.logsumexp(wlp, dim=1)
        labels[start:stop] = wlp.argmax(1)
    return lp, labels
