"""Streaming the fused operators over a row-chunked Dask array, on one device.

:class:`StreamedMatrix` wraps a ``dask.array`` whose chunks are dense (numpy) or scipy CSR row
blocks and implements the duck-typed hooks that :func:`fusedml.mmchain`, :func:`fusedml.matvec`,
:func:`fusedml.gmm_estep` and :func:`fusedml.gmm_score` delegate to. Every call runs the fused
kernel on each row block with the block's row slice of the N-vectors and reduces the partial
results (``w``, GMM statistics) on the compute device, so an iterative solver written for
in-memory data runs unchanged on out-of-core data.

Memory plan (``max_gpu_bytes``)::

    all of X fits        -> every chunk resident on the device (sent once)
    otherwise            -> chunks in order resident while they fit in
                            max_gpu_bytes - n_buffers * block capacity,
                            the rest streamed every call through n_buffers device slots

Streamed chunks come from pinned host memory (``host_cache``: materialised from Dask once) or
are re-read from the Dask graph on every call (out-of-core, e.g. a memory-mapped ``.npy``), by a
reader thread one chunk ahead of the device. Large chunks are cut into row blocks of at most
``block_bytes`` so a transfer never waits on a whole chunk.

The resident chunks form a row prefix and live in ONE device matrix (dense ``[R, D]``, or one
CSR matrix with merged row pointers), so a call launches one kernel for all of them, like an
in-memory call. The CUDA pipeline for the streamed blocks (``n_buffers=2``: double buffering)::

    copy stream:    H2D(b0) H2D(b1) [wait done(b0)] H2D(b2) [wait done(b1)] H2D(b3) ...
    compute stream: K(resident) [wait h2d(b0)] K(b0) [wait h2d(b1)] K(b1) [wait h2d(b2)] ...

Block ``i`` uses slot ``i % n_buffers``; its copy waits on the event recorded after the kernel
that last read the slot, its kernel waits on the event recorded after its copy. Copies are
enqueued ``n_buffers`` blocks ahead of the kernels (the first ones before the resident kernel),
so the copy engine always has the next copy queued, whatever the host does in between. The
compute stream is the caller's current stream, so the caller's vectors need no extra
synchronisation. A streamed call costs at least ``streamed bytes / H2D bandwidth``; with the
copies overlapped, the kernels (a few % of that time) hide under the transfers.

The operator hooks validate their arguments once per call and then call the operators'
implementations on each block directly (no per-block checks, no per-block host sync from the
wrappers; CSR row statistics of streamed blocks are computed once on the host). X's chunks are
validated (shape, format, finiteness) once, when they are read from Dask.

On a host without CUDA (``device="cpu"``) the same engine runs without pinned memory or streams;
the tests cover the plan, the block cutting, the re-reads and the reductions this way.
"""
from __future__ import annotations

import copy
import importlib
import math
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ._dispatch import resolve_backend
from ._validation import CSRMatrix, as_csr, check_finite as _check_finite_tensor, torch_viewable
from .mmchain.dense import padded_width, pads_rows

__all__ = ["StreamedMatrix", "is_dask_array", "options"]

# Defaults for StreamedMatrix keyword arguments left unset (estimators build StreamedMatrix
# themselves; ``options`` lets a caller choose the memory plan for them).
_DEFAULTS = {"max_gpu_bytes": None, "host_cache": "auto", "n_buffers": 2, "block_bytes": 64 << 20, "align_rows": "auto"}


class options:
    """Context manager setting StreamedMatrix defaults (e.g. for estimators given dask input).

    Parameters
    ----------
    **kwargs
        Any of ``max_gpu_bytes``, ``host_cache``, ``n_buffers``, ``block_bytes``, ``align_rows``.

    Examples
    --------
    >>> with fusedml.streaming.options(max_gpu_bytes=8 << 30):      # doctest: +SKIP
    ...     LogisticRegression().fit(X_dask, y)
    """

    def __init__(self, **kwargs):
        bad = set(kwargs) - set(_DEFAULTS)
        if bad:
            raise TypeError(f"unknown streaming option(s) {sorted(bad)}; known: {sorted(_DEFAULTS)}")
        self._new, self._old = kwargs, None

    def __enter__(self):
        self._old = dict(_DEFAULTS)
        _DEFAULTS.update(self._new)
        return self

    def __exit__(self, *exc):
        _DEFAULTS.clear()
        _DEFAULTS.update(self._old)
        return False


_UNSET = object()

_NP_FLOATS = (np.float16, np.float32, np.float64)
_TORCH_FROM_NP = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
                  np.dtype(np.float64): torch.float64}
# A column-chunked array is merged into one column block only when the merged chunk stays small.
_MAX_MERGED_CHUNK_BYTES = 1 << 30


def is_dask_array(X) -> bool:
    """Return True when ``X`` is a ``dask.array.Array`` (without importing dask otherwise).

    Parameters
    ----------
    X : object

    Returns
    -------
    bool
    """
    if "dask.array" not in sys.modules:
        return False
    import dask.array as da

    return isinstance(X, da.Array)


def _host_rows(a: np.ndarray) -> torch.Tensor:
    """A torch view of the host array ``a``, read-only arrays too (only ever read); a copy where
    torch cannot view it (:func:`fusedml._validation.torch_viewable`)."""
    a = torch_viewable(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's "not writable" warning
        return torch.from_numpy(a)


def _is_sparse_meta(meta) -> bool:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover
        return False
    return sp.issparse(meta)


@dataclass
class _HostBlock:
    """One row block on the host: dense ``val`` [n, D], or CSR ``crow`` [n+1] (rebased to 0),
    ``col`` [nnz], ``val`` [nnz]."""

    rows: int
    parts: dict  # name -> torch tensor (contiguous; pinned when staged for CUDA)
    csr_stats: object = None  # CSR: the fused kernels' row statistics, computed on the host once

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parts.values())


@dataclass
class _Chunk:
    index: int          # position in the Dask chunk list
    row0: int           # first global row
    rows: int
    nbytes: int         # bytes of the chunk in its storage format (-1: not known yet)
    nnz: int = 0        # stored entries (CSR chunks)
    resident: bool = False
    host_blocks: list = None         # host cache: list of _HostBlock (pinned on CUDA)
    checked: bool = False            # finiteness verified


@dataclass
class StreamStats:
    """Counters of the last streamed call (read by the benchmark).

    Attributes
    ----------
    calls : int
        Calls since creation.
    blocks : int
        Blocks processed in the last call (operator calls: the resident prefix counts one).
    h2d_bytes : int
        Bytes copied host to device in the last call.
    reread_chunks : int
        Chunks re-read from the Dask graph in the last call.
    seconds : float
        Wall time of the last call (host side, device synchronised only when ``sync_timing``).
    """

    calls: int = 0
    blocks: int = 0
    h2d_bytes: int = 0
    reread_chunks: int = 0
    seconds: float = 0.0


class StreamedMatrix:
    """A row-chunked Dask array streamed through the fused operators on one device.

    Parameters
    ----------
    dask_array : dask.array.Array
        ``[N, D]`` with dense (numpy float16/32/64) or scipy CSR chunks, chunked by rows. An
        array chunked along columns is merged into one column block when the merged chunks stay
        below 1 GiB; otherwise a ValueError asks for a row chunking. Unknown chunk sizes (NaN)
        are computed once (one pass over the data).
    device : str or torch.device, optional
        The compute device; default CUDA when available, else the CPU.
    Keyword arguments left unset take the defaults of :class:`options` (shown values otherwise).

    max_gpu_bytes : int, optional
        Device memory the engine may use for X (resident chunks plus the streaming slots).
        None: everything resident (on CUDA capped at 80 % of the free memory), and a CSR
        resident matrix may get the fused operator's cached transposed copy (2x its bytes) as
        an in-memory matrix would; with a budget it gets it only when the copy fits too.
    host_cache : bool or "auto"
        True: chunks that are not resident are materialised once into (pinned) host memory;
        False: they are re-read from the Dask graph on every call (out-of-core); "auto": cache
        when the streamed bytes take less than half of the available host memory.
    n_buffers : int
        Device slots for streamed blocks (2 = double buffering).
    block_bytes : int
        Largest row block moved in one copy; larger chunks are cut into blocks.
    align_rows : bool or "auto"
        Dense X whose rows are not whole 16-byte vectors (e.g. 55 float32 values): True keeps the
        resident rows padded to whole vectors (``resident_matrix`` is then an ``[R, D]`` view with
        row stride :func:`fusedml.mmchain.dense.padded_width`, as :func:`fusedml.aligned_rows`
        gives), which the fused kernels read in 16-byte loads instead of scalar ones, for
        ``D_pad / D`` of the memory (counted in the budget) and one device copy of the rows at the
        upload (they travel unpadded and are padded on the device). "auto":
        :func:`fusedml.mmchain.dense.pads_rows` (CUDA devices, rows over 64 bytes and up to 64 KB,
        unless ``FUSEDML_ALIGN_ROWS=0``; any device and width with ``1``). Streamed blocks keep
        their rows as they are (bound by the transfer).
    dtype : torch.dtype, optional
        Storage dtype on the device (e.g. ``torch.float16`` halves the bytes); default the chunks'
        (float64 for integer or boolean chunks).
    scheduler : str, optional
        Dask scheduler used to materialise chunks (None: dask's default / the active client).
    check_finite : bool
        Reject NaN/inf in X (each chunk checked once, on its first read).

    Attributes
    ----------
    shape : tuple of int
        ``(N, D)``.
    dtype : torch.dtype
        Storage dtype.
    device : torch.device
        Compute device; results of every hook live there.
    is_sparse : bool
        True for CSR chunks.
    stats : StreamStats
        Counters of the last call.
    resident_matrix : torch.Tensor or CSRMatrix or None
        The resident row prefix as one device matrix (``resident_rows`` rows).
    resident_rows, resident_chunks, resident_bytes, streamed_bytes : int
        The memory plan.

    Examples
    --------
    >>> import dask.array as da, fusedml
    >>> X = da.random.default_rng(0).normal(size=(10_000, 8), chunks=(2_500, 8)).astype("f4")
    >>> S = fusedml.streaming.StreamedMatrix(X, device="cpu", max_gpu_bytes=80_000)
    >>> w = fusedml.mmchain(S, torch.ones(8))          # X^T (X 1), two chunks streamed
    """

    def __init__(self, dask_array, *, device=None, max_gpu_bytes=_UNSET, host_cache=_UNSET,
                 n_buffers=_UNSET, block_bytes=_UNSET, dtype=None, scheduler=None,
                 check_finite=True, align_rows=_UNSET):
        max_gpu_bytes = _DEFAULTS["max_gpu_bytes"] if max_gpu_bytes is _UNSET else max_gpu_bytes
        host_cache = _DEFAULTS["host_cache"] if host_cache is _UNSET else host_cache
        n_buffers = _DEFAULTS["n_buffers"] if n_buffers is _UNSET else n_buffers
        block_bytes = _DEFAULTS["block_bytes"] if block_bytes is _UNSET else block_bytes
        align_rows = _DEFAULTS["align_rows"] if align_rows is _UNSET else align_rows
        if not is_dask_array(dask_array):
            raise TypeError(f"StreamedMatrix needs a dask.array.Array, got {type(dask_array).__name__}")
        X = dask_array
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D [N, D], got shape {X.shape}")
        if host_cache not in (True, False, "auto"):
            raise ValueError(f"host_cache must be True, False or 'auto', got {host_cache!r}")
        if align_rows not in (True, False, "auto"):
            raise ValueError(f"align_rows must be True, False or 'auto', got {align_rows!r}")
        if int(n_buffers) < 1:
            raise ValueError(f"n_buffers must be >= 1, got {n_buffers}")
        if int(block_bytes) < 1:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        if max_gpu_bytes is not None and int(max_gpu_bytes) < 0:
            raise ValueError(f"max_gpu_bytes must be >= 0, got {max_gpu_bytes}")
        self.device = torch.device(device) if device is not None else torch.device(
            "cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be a CPU or CUDA device, got {self.device}")
        self.is_sparse = _is_sparse_meta(X._meta)
        np_dtype = np.dtype(X.dtype).newbyteorder("=")  # byte-swapped chunks are converted as they are read
        if np_dtype.kind in "biu" and not self.is_sparse:
            default = torch.float64  # integer / boolean chunks, converted as read (as the estimators take them)
        elif np_dtype in _TORCH_FROM_NP:
            default = _TORCH_FROM_NP[np_dtype]
        else:
            raise TypeError(f"X must hold float16/float32/float64 values (or integers / booleans in dense "
                            f"chunks), got dtype {np_dtype}")
        self.dtype = dtype if dtype is not None else default
        if self.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"dtype must be a floating torch dtype, got {self.dtype}")
        if any(math.isnan(c) for c in X.chunks[0]) or any(math.isnan(c) for c in X.chunks[1]):
            X = X.compute_chunk_sizes()
        n, d = (int(s) for s in X.shape)
        if n == 0 or d == 0:
            raise ValueError(f"X is empty: shape {(n, d)}")
        if len(X.chunks[1]) > 1:
            merged = max(X.chunks[0]) * d * np_dtype.itemsize
            if merged > _MAX_MERGED_CHUNK_BYTES and not self.is_sparse:
                raise ValueError(
                    f"X is chunked along columns ({len(X.chunks[1])} column blocks) and merging them "
                    f"would make {merged / 2**20:.0f} MiB chunks; rechunk it by rows only, e.g. "
                    f"X.rechunk({{0: rows, 1: -1}}) with fewer rows per chunk")
            X = X.rechunk({1: -1})
        self._dask = X
        self.shape = (n, d)
        self.ndim = 2
        self.scheduler = scheduler
        self.check_finite = bool(check_finite)
        self.n_buffers = int(n_buffers)
        self.block_bytes = int(block_bytes)
        self.stats = StreamStats()
        self._delayed = list(X.to_delayed().ravel())
        self._idx_bytes = 4  # streamed CSR blocks carry int32 indices (rebased row pointers)
        self._val_bytes = torch.empty((), dtype=self.dtype).element_size()
        self._pin = self.device.type == "cuda"
        self._lock = threading.Lock()
        self._resident = None       # the resident row prefix as ONE device matrix (see _plan)
        self._resident_rows = 0
        self._upload = None         # pinned staging of the one-off resident upload (CUDA)
        self._central = None        # central_point(), computed on first use

        # Chunk table and sizes in the storage format.
        chunks, row0 = [], 0
        for i, r in enumerate(X.chunks[0]):
            nbytes = int(r) * d * self._val_bytes if not self.is_sparse else -1
            chunks.append(_Chunk(i, row0, int(r), nbytes))
            row0 += int(r)
        self._chunks = chunks
        # the resident rows' length in elements: padded to whole 16-byte vectors where aligned
        self._row_width = d
        if not self.is_sparse and pads_rows(self.device, d * self._val_bytes, align_rows):
            self._row_width = padded_width(d, self._val_bytes)
        if self.is_sparse:
            nnz = self._chunk_nnz()
            for c, z in zip(chunks, nnz):
                c.nnz = z
                c.nbytes = z * (self._val_bytes + self._idx_bytes) + (c.rows + 1) * self._idx_bytes
        self.nbytes = sum(c.nbytes for c in chunks)
        self._plan(max_gpu_bytes, host_cache)
        self._slots = None
        self._staging = None
        self._reader = None

    # ------------------------------------------------------------------ set-up
    def _compute(self, *delayeds):
        import dask

        return dask.compute(*delayeds, scheduler=self.scheduler)

    def _chunk_nnz(self):
        """Stored entries per chunk (one read of the data; needed to plan sparse memory)."""
        counts = self._dask.map_blocks(
            lambda b: np.array([[b.nnz]], dtype=np.int64), dtype=np.int64, chunks=(1, 1),
            meta=np.empty((0, 0), dtype=np.int64))
        return [int(z) for z in np.asarray(counts.compute(scheduler=self.scheduler)).ravel()]

    def _resident_nbytes(self, c) -> int:
        """Device bytes of chunk ``c`` when resident (its rows padded where they are aligned)."""
        return c.nbytes if self.is_sparse else c.rows * self._row_width * self._val_bytes

    def _plan(self, max_gpu_bytes, host_cache):
        total = sum(self._resident_nbytes(c) for c in self._chunks)
        if max_gpu_bytes is None:
            budget = total
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = min(total, int(0.8 * free))
        else:
            budget = int(max_gpu_bytes)
        self.max_gpu_bytes = budget
        if total > budget >= self.nbytes:  # the padding alone would stream rows: keep them all, unpadded
            self._row_width, total = self.shape[1], self.nbytes
        if total <= budget:
            reserve, room = 0, budget
        else:
            # Slots for streamed blocks come out of the budget first.
            cap = min(self.block_bytes, max(c.nbytes for c in self._chunks))
            reserve = self.n_buffers * cap
            if reserve > budget:
                raise ValueError(
                    f"max_gpu_bytes={budget} cannot hold {self.n_buffers} streaming buffers of "
                    f"{cap} bytes; raise max_gpu_bytes or lower block_bytes")
            room = budget - reserve
        used = 0
        for c in self._chunks:
            if used + self._resident_nbytes(c) <= room:
                c.resident = True
                used += self._resident_nbytes(c)
            else:
                break  # resident chunks form a prefix: a simple, predictable plan
        self.resident_bytes = used
        self.streamed_bytes = sum(c.nbytes for c in self._chunks if not c.resident)
        self._resident_rows = sum(c.rows for c in self._chunks if c.resident)
        # CSR: the fused operator's "gather" strategy caches a transposed copy of its matrix (2x
        # its bytes). The resident matrix may use it (as an in-memory matrix would) when the
        # caller set no budget (the operator then checks the free memory itself) or when the
        # copy fits in the budget; otherwise, and for every streamed block, the copy-free scatter.
        self._resident_copy_ok = max_gpu_bytes is None or 2 * used + reserve <= budget
        streamed = [c for c in self._chunks if not c.resident]
        if host_cache == "auto":
            try:
                import psutil

                avail = psutil.virtual_memory().available
            except ImportError:  # pragma: no cover
                avail = 0
            host_cache = self.streamed_bytes < avail // 2
        self.host_cache = bool(host_cache) and bool(streamed)
        # Materialise resident and cached chunks once, a few at a time (bounded host memory).
        todo = [c for c in self._chunks if c.resident or self.host_cache]
        if self._resident_rows:
            self._alloc_resident()
        batch, batch_bytes = [], 0
        try:
            for c in todo:
                batch.append(c)
                batch_bytes += max(c.nbytes, 0)
                if batch_bytes >= (256 << 20):
                    self._materialise(batch)
                    batch, batch_bytes = [], 0
            if batch:
                self._materialise(batch)
        finally:
            self._finish_upload()
        if self.is_sparse and self._resident_rows and self._resident_filled != self._resident.nnz:
            raise RuntimeError("internal error: the resident CSR prefix was not completely written")

    def _materialise(self, batch):
        arrays = self._compute(*[self._delayed[c.index] for c in batch])
        for c, a in zip(batch, arrays):
            if c.resident:
                self._upload_resident(c, a)
            else:
                c.host_blocks = self._to_host_blocks(c, a, pin=self._pin)

    # ------------------------------------------------------------------ the resident prefix
    def _alloc_resident(self):
        """Preallocate the resident prefix as ONE device matrix (chunks are copied into it).

        Dense: ``[R, D]``. CSR: row pointers ``[R + 1]`` and ``[nnz]`` columns/values, int32
        indices while nnz and D stay below 2^31, int64 otherwise.
        """
        R, d = self._resident_rows, self.shape[1]
        if not self.is_sparse:
            # [R, W] rows (W = D, or D padded to whole vectors: the resident matrix is its [R, D] view)
            self._resident_store = torch.empty((R, self._row_width), dtype=self.dtype, device=self.device)
            self._resident = self._resident_store[:, :d]
            return
        nnz = sum(c.nnz for c in self._chunks if c.resident)
        idx = torch.int32 if nnz < 2**31 and d < 2**31 else torch.int64
        crow = torch.empty(R + 1, dtype=idx, device=self.device)
        self._resident = CSRMatrix(crow, torch.empty(nnz, dtype=idx, device=self.device),
                                   torch.empty(nnz, dtype=self.dtype, device=self.device), (R, d))
        self._resident_filled = 0  # nnz written so far

    def _upload_resident(self, c, a):
        """Copy one resident chunk (validated once, here, on the host) into the resident matrix."""
        if c.rows == 0:  # nothing to copy (and no storage when every resident chunk is empty)
            return
        r0, r1 = c.row0, c.row0 + c.rows  # resident chunks are the prefix: global rows = local rows
        if self.is_sparse:
            if not _is_sparse_meta(a):
                raise TypeError(f"chunk {c.index} of X is {type(a).__name__}, expected scipy CSR")
            M = as_csr(a, f"X chunk {c.index}")  # rejects COO/CSC/..., unsorted indices
            self._check_chunk(c, a)
            R = self._resident
            s = self._resident_filled
            if M.nnz != c.nnz or s + M.nnz > R.nnz:
                raise ValueError(f"chunk {c.index} of X has {M.nnz} stored entries, {c.nnz} when first counted "
                                 "(the Dask graph must give the same chunks on every compute)")
            crow = (M.crow.to(torch.int64) + s).to(R.crow.dtype)
            self._h2d(R.crow[r0:r1 + 1], crow)
            self._h2d(R.col[s:s + M.nnz], M.col)
            self._h2d(R.val[s:s + M.nnz], M.val)
            self._resident_filled = s + M.nnz
            return
        if _is_sparse_meta(a):
            raise TypeError(f"chunk {c.index} of X is a scipy {a.format!r} sparse matrix but X's meta is dense; "
                            "build X with CSR chunks and a sparse meta (only CSR is supported)")
        a = np.asarray(a)
        self._check_chunk(c, a)
        self._h2d(self._resident_store[r0:r1], _host_rows(a))

    # Pieces of the one-off resident upload: pinned staging keeps it at the pinned bandwidth.
    _UPLOAD_PIECE_BYTES = 32 << 20

    def _h2d(self, dst, src):
        """``dst[:, :D] = src`` and zeros in ``dst[:, D:]``, for contiguous device rows ``dst`` [r, W]
        (or a 1-D slice) and host rows ``src`` [r, D] of any strides and dtype.

        On CUDA through two pinned staging buffers (the host fills one while the other copies), the
        dtype conversion in that one host pass. Padded rows (W > D) are staged and copied unpadded
        and padded on the device (torch's copy into the strided destination goes through a
        contiguous device temporary, then a device copy, in stream order): the host's
        strided pass into padded rows cost more than the padded reads saved (H100, Dask input,
        whole fits 4-6 ms slower at 2M x 55 and 4M x 13, ``env_ab_align_dask-H100-*-s45``); padded
        on the device, no fit lost beyond its noise and logistic fits gained 5-11 ms (H200, 2M x 55
        and 1M x 101, ``env_ab_align_dask-H200-*-s45b``, timed with an explicit device temporary that
        made the same two copies; the CUDA tests passed on this form, H100 ``-s46``).
        ``_finish_upload`` waits for the last copy.
        """
        if dst.ndim == 1:
            dst, src = dst.view(-1, 1), src.reshape(-1, 1)
        D, W = src.shape[1], dst.shape[1]
        if self.device.type != "cuda":
            dst[:, :D].copy_(src)
            dst[:, D:].zero_()
            return
        if self._upload is None:
            self._upload = {"bufs": [None, None], "events": [torch.cuda.Event(), torch.cuda.Event()], "i": 0}
        up = self._upload
        esz = dst.element_size()
        per = max(1, self._UPLOAD_PIECE_BYTES // (D * esz))  # rows per piece
        if W > D:
            dst[:, D:].zero_()
        for lo in range(0, src.shape[0], per):
            piece = src[lo:lo + per]
            r = piece.shape[0]
            k = up["i"] % 2
            up["i"] += 1
            up["events"][k].synchronize()  # the staging buffer's previous copy is done
            nbytes = r * D * esz
            buf = up["bufs"][k]
            if buf is None or buf.numel() < nbytes:
                buf = torch.empty(max(nbytes, min(self._UPLOAD_PIECE_BYTES, self.resident_bytes)),
                                  dtype=torch.uint8, pin_memory=True)
                up["bufs"][k] = buf
            stage = buf[:nbytes].view(dst.dtype).view(r, D)
            stage.copy_(piece)
            dst[lo:lo + r, :D].copy_(stage, non_blocking=True)
            up["events"][k].record(torch.cuda.current_stream(self.device))

    def _finish_upload(self):
        """Wait for the resident upload's last copies and release the staging buffers."""
        if self._upload is not None:
            for ev in self._upload["events"]:
                ev.synchronize()
            self._upload = None

    @property
    def resident_matrix(self):
        """The resident row prefix as ONE device matrix, or None when no chunk is resident.

        Returns
        -------
        torch.Tensor or CSRMatrix or None
            Dense ``[R, D]`` tensor or :class:`fusedml.CSRMatrix` of the first ``R`` rows
            (``R = resident_rows``), in the storage dtype on ``device``. Every operator call runs
            ONE kernel launch over it (plus one per streamed block).
        """
        return self._resident

    @property
    def resident_rows(self) -> int:
        """Rows of X kept on the device (a prefix)."""
        return self._resident_rows

    # ------------------------------------------------------------------ conversion
    def _check_chunk(self, c, a):
        if a.shape != (c.rows, self.shape[1]):
            raise ValueError(f"chunk {c.index} of X has shape {a.shape}, expected {(c.rows, self.shape[1])}")
        if self.check_finite and not c.checked:
            data = a.data if self.is_sparse else a
            if not np.isfinite(data).all():
                raise ValueError(f"X contains NaN or infinite values (chunk {c.index}, rows "
                                 f"{c.row0}..{c.row0 + c.rows - 1})")
            c.checked = True

    def _block_cuts(self, c, a):
        """Row cuts of a chunk into blocks of at most ``block_bytes`` (deterministic)."""
        n = c.rows
        if not self.is_sparse:
            per = max(1, self.block_bytes // (self.shape[1] * self._val_bytes))
            return list(range(0, n, per)) + [n]
        indptr = np.asarray(a.indptr, dtype=np.int64)
        row_bytes = np.diff(indptr) * (self._val_bytes + self._idx_bytes) + self._idx_bytes
        cum = np.concatenate([[0], np.cumsum(row_bytes)])
        cuts, start = [0], 0
        while start < n:
            stop = int(np.searchsorted(cum, cum[start] + self.block_bytes, side="right")) - 1
            stop = max(stop, start + 1)  # a single row larger than a block still moves alone
            cuts.append(min(stop, n))
            start = cuts[-1]
        return cuts

    def _to_host_blocks(self, c, a, *, pin):
        """Convert one materialised chunk to host row blocks (torch, storage dtype)."""
        if self.is_sparse:
            if not _is_sparse_meta(a):
                raise TypeError(f"chunk {c.index} of X is {type(a).__name__}, expected scipy CSR")
            M = as_csr(a, f"X chunk {c.index}")  # rejects COO/CSC/..., unsorted indices
            a_ = a
        else:
            if _is_sparse_meta(a):
                raise TypeError(f"chunk {c.index} of X is a scipy {a.format!r} sparse matrix but X's meta is dense; "
                            "build X with CSR chunks and a sparse meta (only CSR is supported)")
            a_ = np.asarray(a)
        self._check_chunk(c, a_)
        cuts = self._block_cuts(c, a_)
        blocks = []
        if self.is_sparse:
            crow = M.crow.to(torch.int64)
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                s, e = int(crow[lo]), int(crow[hi])
                parts = {"crow": (crow[lo:hi + 1] - s).to(torch.int32),
                         "col": M.col[s:e].to(torch.int32),
                         "val": M.val[s:e].to(self.dtype)}
                blocks.append(_HostBlock(hi - lo, self._stage(parts, pin),
                                         _host_csr_stats(parts["crow"].numpy(), self.shape[1])))
        else:
            t = _host_rows(a_)
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                blocks.append(_HostBlock(hi - lo, self._stage({"val": t[lo:hi].to(self.dtype)}, pin)))
        return blocks

    @staticmethod
    def _stage(parts, pin):
        if not pin:
            return {k: v.contiguous() for k, v in parts.items()}
        out = {}
        for k, v in parts.items():
            p = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
            p.copy_(v)
            out[k] = p
        return out

    def _block_operand(self, parts, b):
        """The operand of a streamed block; CSR: with its row statistics known to the kernels.

        The fused CSR operator derives launch parameters from row-length statistics that it
        computes on the device and reads back (a host sync) the first time it meets a matrix;
        a streamed block is a new matrix on every call, so the statistics are computed once per
        host block, on the host (``_host_csr_stats``, when the block is cut), and registered in
        the operator's per-matrix cache for the block's device tensors.
        """
        M = self._matrix(parts, b.rows)
        if self.is_sparse:
            _seed_csr_structure(M, b)
        return M

    def _matrix(self, parts, rows):
        """A device/host block as the operand the kernels take (fresh tensor objects)."""
        if self.is_sparse:
            return CSRMatrix(parts["crow"], parts["col"], parts["val"], (rows, self.shape[1]))
        return parts["val"].view(rows, self.shape[1])

    # ------------------------------------------------------------------ the pipeline
    def _read_chunk(self, c):
        """Re-read one chunk from the Dask graph (reader thread): host blocks, unpinned."""
        (a,) = self._compute(self._delayed[c.index])
        return self._to_host_blocks(c, a, pin=False)

    def _ensure_slots(self, block):
        """Device slots (and pinned staging for re-read blocks) sized to the block capacity."""
        if self._slots is None:
            self._slots, self._staging = [], []
            self._copy_stream = torch.cuda.Stream(device=self.device)
            self._h2d_done = [torch.cuda.Event() for _ in range(self.n_buffers)]
            self._compute_done = [torch.cuda.Event() for _ in range(self.n_buffers)]
            for _ in range(self.n_buffers):
                self._slots.append({})
                self._staging.append({})
        for j in range(self.n_buffers):
            for k, v in block.parts.items():
                need = v.numel()
                cur = self._slots[j].get(k)
                if cur is None or cur.numel() < need or cur.dtype != v.dtype:
                    # Grow: wait until the slot's last user is done before dropping it.
                    self._compute_done[j].synchronize()
                    cap = max(need, self._capacity(k, v.dtype))
                    slot = torch.empty(cap, dtype=v.dtype, device=self.device)
                    slot.record_stream(self._copy_stream)  # written there, read on the compute stream
                    self._slots[j][k] = slot
                    # The allocation is ordered on the compute stream only: copies into it must
                    # also come after the compute work already enqueued (it may reuse freed memory).
                    self._copy_stream.wait_stream(torch.cuda.current_stream(self.device))

    def _capacity(self, name, dtype):
        esz = torch.empty((), dtype=dtype).element_size()
        if not self.is_sparse:
            return min(self.block_bytes, max(c.nbytes for c in self._chunks)) // esz
        if name == "crow":
            return 1
        return self.block_bytes // (self._val_bytes + self._idx_bytes)

    def _host_blocks(self):
        """Yield ``(host block, global row0, cached)`` for every streamed block, in row order.

        Re-read chunks come from the reader thread, one chunk ahead of the consumer.
        """
        st = self.stats
        streamed = [c for c in self._chunks if not c.resident]
        reread = [c for c in streamed if c.host_blocks is None]
        pending = {}
        if reread:
            if self._reader is None:
                self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fusedml-reader")
            pending[reread[0].index] = self._reader.submit(self._read_chunk, reread[0])
        nxt = {a.index: b for a, b in zip(reread[:-1], reread[1:])}
        for c in streamed:
            if c.host_blocks is not None:
                blocks, cached = c.host_blocks, True
            else:
                blocks = pending.pop(c.index).result()
                st.reread_chunks += 1
                cached = False
                if c.index in nxt:  # read ahead while this chunk streams
                    pending[nxt[c.index].index] = self._reader.submit(self._read_chunk, nxt[c.index])
            r = c.row0
            for b in blocks:
                yield b, r, cached
                r += b.rows

    def _blocks(self):
        """Yield (operand on the device, global row0, row1) for every block, in a fixed order.

        The resident prefix first, as ONE matrix (its kernel overlaps the first copies), then the
        streamed blocks. On CUDA the copies run ``n_buffers`` blocks ahead of the consumer: the
        copy of block ``i + 1`` is already queued on the copy stream when block ``i`` is handed
        out, so the copy engine never waits for the host (even if the consumer synchronises).
        The consumer must enqueue all its work on ``Xb`` on the current stream before asking for
        the next block; the slot is recycled only after an event recorded at that point.
        """
        st = self.stats
        st.calls += 1
        st.blocks = st.h2d_bytes = st.reread_chunks = 0
        streams = not all(c.resident for c in self._chunks)
        if self.device.type != "cuda":
            if self._resident is not None:
                st.blocks += 1
                yield self._resident, 0, self._resident_rows
            if streams:
                for b, r, _ in self._host_blocks():
                    st.blocks += 1
                    yield self._block_operand(b.parts, b), r, r + b.rows
            return
        cur = torch.cuda.current_stream(self.device)
        nb = self.n_buffers
        src = self._host_blocks() if streams else iter(())
        queue = deque()  # (device operand, row0, rows, slot) whose copies are enqueued
        issued = 0
        exhausted = False

        def fill():
            nonlocal issued, exhausted
            while not exhausted and len(queue) < nb:
                item = next(src, None)
                if item is None:
                    exhausted = True
                    return
                b, r, cached = item
                queue.append((self._stream_block(b, issued, cached), r, b.rows, issued % nb))
                st.h2d_bytes += b.nbytes
                issued += 1

        fill()  # the first copies run under the resident prefix's kernel
        if self._resident is not None:
            st.blocks += 1
            yield self._resident, 0, self._resident_rows
        while queue:
            M, r, rows, j = queue.popleft()
            cur.wait_event(self._h2d_done[j])
            st.blocks += 1
            try:
                yield M, r, r + rows
            finally:
                # The consumer has enqueued its kernels on the current stream (or stopped): the
                # slot is free for a new copy once they are done.
                self._compute_done[j].record(cur)
            del M
            fill()

    def _stream_block(self, b, i, cached):
        """Enqueue the copy of host block ``b`` into slot ``i % n_buffers`` on the copy stream.

        The copy waits for the event recorded after the last kernel that read the slot, and
        records ``_h2d_done[slot]``; the caller makes the compute stream wait on that event.
        """
        j = i % self.n_buffers
        self._ensure_slots(b)
        src = b.parts
        if not cached:
            # Pinned staging slot j was last read by the copy of block i - n_buffers.
            self._h2d_done[j].synchronize()
            stage = self._staging[j]
            src = {}
            for k, v in b.parts.items():
                buf = stage.get(k)
                if buf is None or buf.numel() < v.numel() or buf.dtype != v.dtype:
                    buf = torch.empty(max(v.numel(), self._capacity(k, v.dtype)), dtype=v.dtype, pin_memory=True)
                    stage[k] = buf
                src[k] = buf[:v.numel()].view(v.shape).copy_(v)
        cs = self._copy_stream
        cs.wait_event(self._compute_done[j])
        dst = {}
        with torch.cuda.stream(cs):
            for k, v in src.items():  # pinned source: asynchronous DMA copies
                d = self._slots[j][k][:v.numel()].view(v.shape)
                d.copy_(v, non_blocking=True)
                dst[k] = d
        self._h2d_done[j].record(cs)
        return self._block_operand(dst, b)

    def map_blocks(self, fn, reduce="sum"):
        """Run ``fn`` on every row block (on the device) and reduce the results.

        Parameters
        ----------
        fn : callable
            ``fn(Xb, rows)`` with ``Xb`` the block (dense ``[n, D]`` tensor or
            :class:`fusedml.CSRMatrix`) and ``rows`` its global ``slice``; returns a tensor or a
            tuple of tensors. It must enqueue its work on the current stream and must not keep
            ``Xb`` (its memory is reused by later blocks).
        reduce : {"sum", "concat", None}
            "sum": elementwise sums of the results (in block order: deterministic);
            "concat": concatenation along dim 0 (per-row results in row order); None: the list.

        Returns
        -------
        tensor, tuple of tensors, or list
        """
        if reduce not in ("sum", "concat", None):
            raise ValueError(f"reduce must be 'sum', 'concat' or None, got {reduce!r}")
        t0 = time.perf_counter()
        results, acc = [], None
        with self._lock:
            for Xb, r0, r1 in self._blocks():
                out = fn(Xb, slice(r0, r1))
                if reduce == "sum":
                    if acc is None:
                        acc = tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()
                    elif isinstance(out, tuple):
                        for a, o in zip(acc, out):
                            a.add_(o)
                    else:
                        acc.add_(out)
                else:
                    results.append(out)
        self.stats.seconds = time.perf_counter() - t0
        if reduce == "sum":
            return acc
        if reduce == "concat":
            if isinstance(results[0], tuple):
                return tuple(torch.cat(parts, 0) for parts in zip(*results))
            return torch.cat(results, 0)
        return results

    # ------------------------------------------------------------------ operator hooks
    # Every hook validates its arguments ONCE per call (against a zero-stride stand-in of X of
    # the full shape), resolves the backend once, then calls the operator's implementation on
    # each block with the validated problem re-pointed at the block: no per-block validation,
    # no per-block host synchronisation from the wrappers. X's chunks were validated when they
    # were materialised.
    def _vec(self, a, name, dtype):
        if a is None:
            return None
        if isinstance(a, torch.Tensor) and a.device == self.device and a.dtype == dtype and a.layout == torch.strided:
            return a  # already there (the solvers' case): shapes are checked by the caller
        from ._validation import to_tensor

        t = to_tensor(a, name, ndim=(1, 2))
        return t.to(device=self.device, dtype=dtype)

    def _param(self, a, name):
        """A parameter tensor on the device (moved once per call, not once per block)."""
        from ._validation import to_tensor

        t = to_tensor(a, name)
        return t.to(device=self.device, dtype=self.acc_dtype if t.is_floating_point() else t.dtype)

    def _standin(self):
        """``[N, D]`` zero-stride view of one zero (storage dtype, device): validates shapes only."""
        t = getattr(self, "_standin_t", None)
        if t is None:
            t = self._standin_t = torch.zeros((1, 1), dtype=self.dtype, device=self.device).expand(*self.shape)
        return t

    @property
    def acc_dtype(self) -> torch.dtype:
        """Accumulation dtype of the fused operators on this matrix (fp64 for fp64 storage)."""
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    def _csr_config(self, Xb, config):
        """CSR blocks: the copy-free scatter (``memory="low"``) unless the caller's config says
        otherwise; the resident matrix as in memory when its transposed copy is allowed."""
        if not self.is_sparse or (Xb is self._resident and self._resident_copy_ok):
            return config
        return {"memory": "low", **(config or {})}

    def _fusedml_mmchain(self, y, v=None, z=None, alpha=1.0, beta=0.0, *, intercept=False, v_op="mul",
                         backend="auto", deterministic=False, check_finite=False, config=None):
        """``w = alpha X^T (v ⊙ (X y)) + beta z`` summed over blocks (hook of fusedml.mmchain).

        Parameters
        ----------
        y : array-like or None
            ``[D(+1)]`` or ``[D(+1), m]``; None computes ``alpha X^T v + beta z``.
        v : array-like or None
            ``[N]`` or ``[N, m]``; sliced per block.
        z : array-like or None
            ``[D(+1)]`` or ``[D(+1), m]``.
        alpha, beta : float
        intercept : bool
            X treated as ``[X, 1]``.
        v_op, backend, deterministic, config
            As :func:`fusedml.mmchain` (config applies to every block; CSR blocks default to
            the copy-free scatter, see ``max_gpu_bytes``).
        check_finite : bool
            Reject NaN/inf in y, v, z (X is checked when its chunks are read).

        Returns
        -------
        torch.Tensor
            ``[D(+1)]`` or ``[D(+1), m]`` on ``self.device``.
        """
        mm = _mmchain_module()
        n, d = self.shape
        dd = d + int(bool(intercept))
        acc = self.acc_dtype
        y, v, z = self._vec(y, "y", acc), self._vec(v, "v", acc), self._vec(z, "z", acc)
        if y is None and v is None:
            raise ValueError("mmchain with y=None computes X^T v: v is required")
        if y is not None and y.shape[0] != dd:
            raise ValueError(f"y must have {dd} rows (D={d}{' + intercept' if intercept else ''}), got shape {tuple(y.shape)}")
        if v is not None and v.shape[0] != n:
            raise ValueError(f"v must have N={n} rows, got shape {tuple(v.shape)}")
        if check_finite:
            for t, name in ((y, "y"), (v, "v"), (z, "z")):
                if t is not None:
                    _check_finite_tensor(t, name)
        P0 = mm._checks.prepare_mmchain(self._standin(), y, v, z, alpha, beta, intercept=intercept, v_op=v_op,
                                        check_finite=False)
        be = resolve_backend(backend, self.device)
        det = bool(deterministic)

        def block(Xb, rows):
            P = _problem_for(P0, Xb, rows, slice_v=True)
            return mm._run_mmchain(P, be, key=Xb, deterministic=det, config=self._csr_config(Xb, config))

        w = _sum(self.map_blocks(block, None))  # fresh per-block results: summed in place
        if P0.z is not None and P0.beta != 0.0:
            w = w + P0.beta * P0.z
        return P0.finish(w)

    def _fusedml_matvec(self, y, *, intercept=False, backend="auto", config=None):
        """``X y`` (+ ``y[D]`` with intercept) as a full ``[N]`` / ``[N, m]`` tensor on the device.

        Parameters
        ----------
        y : array-like
            ``[D(+1)]`` or ``[D(+1), m]``.
        intercept : bool
        backend : {"auto", "fused", "ops", "cpu"}
        config : dict, optional
            Fused launch overrides, as :func:`fusedml.matvec`.

        Returns
        -------
        torch.Tensor
        """
        mm = _mmchain_module()
        d = self.shape[1] + int(bool(intercept))
        y = self._vec(y, "y", self.acc_dtype)
        if y is None or y.shape[0] != d:
            raise ValueError(f"y must have {d} rows, got {None if y is None else tuple(y.shape)}")
        P0 = mm._checks.prepare_matvec(self._standin(), y, intercept=intercept)
        be = resolve_backend(backend, self.device)

        def block(Xb, rows):
            P = _problem_for(P0, Xb, rows, slice_v=False)
            if be == "ops":
                from .mmchain.ops import matvec_ops

                return matvec_ops(P)
            if be == "cpu":
                from .mmchain.cpu import matvec_cpu

                return matvec_cpu(P)
            if P.is_csr:
                return mm._csr_module().csr_matvec_fused(Xb, P.y, intercept=P.intercept, config=config)
            from .mmchain.dense import dense_matvec_fused

            return dense_matvec_fused(P, config=config)

        return P0.finish(self.map_blocks(block, "concat"))

    def _gmm_prepare(self, weights, means, precisions_cholesky, covariance_type, sample_weight, center,
                     check_params=True):
        """Validate the GMM parameters once (one host sync, as one in-memory call)."""
        from .gmm._prep import validate

        if self.is_sparse:
            raise TypeError("the GMM operators need dense data; X streams scipy CSR chunks")
        return validate(self._standin(), weights, means, precisions_cholesky, covariance_type,
                        sample_weight=sample_weight, center=center, check_finite=False, check_params=check_params)

    def _fusedml_gmm_estep(self, weights, means, precisions_cholesky, covariance_type, *,
                           sample_weight=None, center=None, return_log_prob=False, backend="auto",
                           path="auto", precision="auto", check_finite=True, check_params=True):
        """GMM sufficient statistics summed over blocks (hook of fusedml.gmm_estep).

        All blocks accumulate about the same centre (``center`` or the current means), so their
        statistics add up. Returns a ``GMMStats`` with the total log-likelihood and, when asked,
        the per-sample log-likelihood concatenated in row order.

        Parameters
        ----------
        weights, means, precisions_cholesky, covariance_type
            As :func:`fusedml.gmm_estep`.
        sample_weight : array-like, optional
            ``[N]``; sliced per block.
        center : array-like, optional
            ``[K, D]``.
        return_log_prob : bool
        backend, path, precision
            As :func:`fusedml.gmm_estep`.
        check_finite : bool
            Accepted for the signature: X's chunks are checked once, when read (``check_finite``
            of the StreamedMatrix), never per call.
        check_params : bool
            As :func:`fusedml.gmm_estep` (False: parameters from an EM loop's own M-step).

        Returns
        -------
        fusedml.gmm.GMMStats
        """
        from .gmm import GMMStats, _check_options, _resolve_precision, _sums_cancelled

        _check_options(path, precision)
        prep0 = self._gmm_prepare(weights, means, precisions_cholesky, covariance_type, sample_weight, center,
                                  check_params)
        be = resolve_backend(backend, self.device)
        if precision == "fp64":  # any backend: the blocked float64 pass on each chunk's device
            from .gmm.cpu import estep_cpu

            run = lambda p: estep_cpu(p, return_log_prob)  # noqa: E731
        elif be == "fused":
            from .gmm.fused import _operands, estep_fused

            prec = _resolve_precision(precision, self.device)
            ops = _operands(prep0)  # the kernels' parameter tensors, built once per call
            run = lambda p: estep_fused(p, return_log_prob, path=path, precision=prec, ops=ops)  # noqa: E731
        elif be == "ops":
            from .gmm.ops import estep_ops

            run = lambda p: estep_ops(p, return_log_prob)  # noqa: E731
        else:
            from .gmm.cpu import estep_cpu

            run = lambda p: estep_cpu(p, return_log_prob)  # noqa: E731
        sw = prep0.sample_weight

        def block(Xb, rows):
            p = copy.copy(prep0)
            p.X, p.N, p.sample_weight = Xb, rows.stop - rows.start, None if sw is None else sw[rows]
            return run(p)

        parts = self.map_blocks(block, None)
        lp = None
        if return_log_prob:
            lp = torch.cat([p[0] for p in parts], 0).to(torch.float64 if self.dtype == torch.float64 else torch.float32)
        ll, nk, s1, s2 = (_sum([p[i] for p in parts]) for i in range(1, 5))
        if check_params and precision != "fp64" and _sums_cancelled(prep0, be, nk, s2):  # as gmm_estep: float64
            return self._fusedml_gmm_estep(weights, means, precisions_cholesky, covariance_type,
                                           sample_weight=sample_weight, center=center, return_log_prob=return_log_prob,
                                           backend=backend, path=path, precision="fp64", check_params=check_params)
        return GMMStats(covariance_type=covariance_type, log_likelihood=ll, log_prob=lp, nk=nk,
                        center=prep0.center, s1=s1, s2=s2)

    def _fusedml_gmm_score(self, weights, means, precisions_cholesky, covariance_type, *, backend="auto",
                           path="auto"):
        """Per-sample log-likelihood ``[N]`` and labels ``[N]`` (hook of fusedml.gmm_score)."""
        from .gmm import _check_options

        _check_options(path, "fp32")
        prep0 = self._gmm_prepare(weights, means, precisions_cholesky, covariance_type, None, None)
        be = resolve_backend(backend, self.device)
        if be == "fused":
            from .gmm.fused import score_fused as run
        elif be == "ops":
            from .gmm.ops import score_ops as run
        else:
            from .gmm.cpu import score_cpu as run
        def block(Xb, rows):
            p = copy.copy(prep0)
            p.X, p.N = Xb, rows.stop - rows.start
            return tuple(run(p))

        lp, labels = self.map_blocks(block, "concat")
        return lp.to(torch.float64 if self.dtype == torch.float64 else torch.float32), labels

    # ------------------------------------------------------------------ helpers
    def take_rows(self, index):
        """Rows of X as a dense ``[len(index), D]`` tensor on the device (e.g. for initialisation).

        Parameters
        ----------
        index : array-like of int
            Row indices (any order, repeats allowed).

        Returns
        -------
        torch.Tensor
        """
        idx = np.asarray(index, dtype=np.int64).ravel()
        if idx.size and (idx.min() < -self.shape[0] or idx.max() >= self.shape[0]):
            raise IndexError(f"row index out of range for N={self.shape[0]}")
        idx = np.where(idx < 0, idx + self.shape[0], idx)
        uniq, inv = np.unique(idx, return_inverse=True)
        rows = self._dask[uniq].compute(scheduler=self.scheduler)
        if _is_sparse_meta(rows):
            rows = rows.toarray()
        t = torch.from_numpy(torch_viewable(np.asarray(rows)[inv])).to(self.device)
        return t.to(self.acc_dtype)

    def central_point(self) -> torch.Tensor:
        """The float64 mean ``[D]`` of the rows :func:`fusedml.kmeans.central_rows` picks: the
        default shift of :func:`fusedml.lloyd_step` on the same data in memory. Computed once (one
        small compute of those rows through the Dask graph) and kept.

        Returns
        -------
        torch.Tensor
        """
        if self._central is None:
            from .kmeans import central_rows

            self._central = self.take_rows(np.asarray(central_rows(self.shape[0]))).to(torch.float64).mean(0)
        return self._central

    def to_dask(self):
        """The (row-chunked) Dask array this engine streams.

        Returns
        -------
        dask.array.Array
            ``[N, D]``, the array the engine was built from (after any rechunking), not a copy.
        """
        return self._dask

    @property
    def n_chunks(self) -> int:
        """Number of Dask row chunks."""
        return len(self._chunks)

    @property
    def resident_chunks(self) -> int:
        """Chunks kept on the device across calls."""
        return sum(c.resident for c in self._chunks)

    def close(self):
        """Stop the reader thread (also done at garbage collection)."""
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        kind = "CSR" if self.is_sparse else "dense"
        return (f"StreamedMatrix({kind} {self.shape[0]}x{self.shape[1]} {self.dtype}, {self.n_chunks} chunks, "
                f"{self.resident_chunks} resident, device={self.device}, "
                f"{'host-cached' if self.host_cache else 're-read'} streaming)")


def _mmchain_module():
    """The ``fusedml.mmchain`` package (``fusedml.mmchain`` the attribute is the function)."""
    return importlib.import_module("fusedml.mmchain")


def _problem_for(P0, Xb, rows, *, slice_v):
    """The validated mmchain/matvec problem ``P0`` re-pointed at block ``Xb`` (rows ``rows``):
    the block's slice of v, no ``beta z`` (added once to the sum)."""
    P = copy.copy(P0)
    P.X, P.N = Xb, rows.stop - rows.start
    if slice_v:
        P.v = None if P0.v is None else P0.v[rows]
        P.z, P.beta = None, 0.0
    return P


def _host_csr_stats(crow, n_cols):
    """The CSR operator's row statistics (``fusedml.mmchain.csr.CSRStats``) of a host block.

    Same definition as the operator's ``_compute_stats`` (checked against it by the tests), in
    numpy: row lengths, their maximum and sum, and the histogram of ``0`` (empty row) or
    ``1 + ceil(log2(len))``; ``ceil(log2(L)) = bit_length(L - 1)`` = the exponent of ``frexp``
    (exact below 2^53). None when the CSR module's private API is not there.

    Parameters
    ----------
    crow : numpy.ndarray
        ``[n + 1]`` int32 row pointers, rebased to 0 (the block's device index dtype).
    n_cols : int

    Returns
    -------
    CSRStats or None
    """
    try:
        from .mmchain.csr import CSRStats

        lengths = np.diff(crow.astype(np.int64))
        bins = np.zeros(lengths.shape, dtype=np.int64)
        nz = lengths > 0
        bins[nz] = 1 + np.frexp((lengths[nz] - 1).astype(np.float64))[1]
        hist = np.bincount(bins, minlength=1)
        return CSRStats(int(lengths.size), int(n_cols), int(lengths.sum()), int(lengths.max()) if lengths.size else 0,
                        tuple(int(h) for h in hist), crow.itemsize)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - private API moved
        return None


def _seed_csr_structure(M, b):
    """Register host-computed row statistics of block ``b`` for its device operand ``M``.

    Uses the CSR module's private cache (``_CACHE``, ``_Structure``): when those change shape,
    this does nothing and the operator computes the statistics itself (one host sync per block).
    """
    try:
        from .mmchain import csr as _csr

        if b.csr_stats is None:
            return
        key = id(M.crow)
        ent = _csr._CACHE.get(key)
        if ent is not None and ent.valid_for(M):  # the same tensors as last call (host blocks)
            return
        _csr._CACHE[key] = _csr._Structure(M, b.csr_stats)
        weakref.finalize(M.crow, _csr._CACHE.pop, key, None)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - private API moved
        pass


def _sum(parts):
    """Elementwise sum of FRESH per-block tensors (the first is summed into), in block order."""
    acc = parts[0]
    for t in parts[1:]:
        acc.add_(t)
    return acc
