"""Loaders for user files: svmlight/libsvm text, ``.npy`` (memory-mapped) and ``.npz`` CSR shards.

Each loader returns a :class:`Dataset` and, with ``chunks=`` (rows per chunk), a lazily chunked
Dask variant whose blocks are read from disk only when computed (the streaming module consumes
these). Missing files raise ``FileNotFoundError`` naming the path; malformed svmlight lines raise
``ValueError`` naming the 1-based line number.

The svmlight parser is our own and vectorised: one byte scan with numpy finds token starts and
colons, one C-level ``numpy.fromstring`` call converts every number; Python-level loops run only
to build an error message.
"""
from __future__ import annotations

import glob
import os
import re
import warnings
import zipfile

import numpy as np

from ._base import Dataset, infer_task

_COMMENT = re.compile(rb"#[^\n]*")
_QID = re.compile(rb"(?<=[ \t])qid:[^ \t\r\n]*")
_WS = np.zeros(256, dtype=bool)
_WS[[9, 10, 11, 12, 13, 32]] = True


def _check_file(path) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path}")
    if os.path.isdir(path):
        raise IsADirectoryError(f"expected a file, got a directory: {path}")
    return path


def _line_error(lineno, msg, path):
    where = f"{path}, " if path else ""
    return ValueError(f"{where}line {lineno}: {msg}")


def _parse_svmlight_bytes(data: bytes, *, first_line: int = 1, zero_based="auto", n_features=None,
                          dtype=np.float64, path: str = ""):
    """Parse svmlight text.

    Parameters
    ----------
    data : bytes
        Whole lines of an svmlight file.
    first_line : int
        1-based line number of the first line in ``data`` (for error messages).
    zero_based : bool or "auto"
        Whether feature indices start at 0; "auto" means zero-based iff an index 0 occurs here.
    n_features : int, optional
        Number of columns; indices must be below it.
    dtype : numpy dtype
        Value dtype.
    path : str
        File name for error messages.

    Returns
    -------
    tuple
        ``(indptr [R+1] int64, indices [nnz] int64 zero-based, values [nnz] dtype, y [R] float64,
        min_index, max_index)`` with raw (as written) minimum/maximum index, -1 when nnz = 0.
    """
    if data[:3] == b"\xef\xbb\xbf":  # a UTF-8 byte-order mark (files saved by some editors)
        data = data[3:]
    if b"#" in data:
        data = _COMMENT.sub(b"", data)
    if b"qid:" in data:
        data = _QID.sub(b"", data)
    a = np.frombuffer(data, dtype=np.uint8)
    ws = _WS[a]
    nl_pos = np.flatnonzero(a == 10)
    starts = np.flatnonzero(~ws & np.concatenate(([True], ws[:-1])))  # token starts
    cpos = np.flatnonzero(a == 58)  # ':'
    n_lines = nl_pos.size + 1
    tok_line = np.searchsorted(nl_pos, starts)  # 0-based line of each token
    n_tok = starts.size
    tok_per_line = np.bincount(tok_line, minlength=n_lines)
    nonempty = tok_per_line > 0
    first_tok = np.zeros(n_tok, dtype=bool)
    first_idx = np.concatenate(([0], np.cumsum(tok_per_line)[:-1]))[nonempty]
    first_tok[first_idx] = True

    # Structure: the first token of a line (label) holds no colon, every other exactly one,
    # with characters on both sides.
    colon_tok = np.searchsorted(starts, cpos, side="right") - 1
    colons_per_tok = np.bincount(colon_tok, minlength=n_tok) if n_tok else np.zeros(0, np.int64)
    bad_tok = np.flatnonzero((colons_per_tok != np.where(first_tok, 0, 1)))
    bad_colon = np.flatnonzero((colon_tok < 0) | (cpos == starts[np.maximum(colon_tok, 0)])
                               | (cpos + 1 >= a.size) | _WS[a[np.minimum(cpos + 1, a.size - 1)]])
    if bad_tok.size or bad_colon.size:
        lines = []
        if bad_tok.size:
            lines.append(int(tok_line[bad_tok[0]]))
        if bad_colon.size:
            lines.append(int(np.searchsorted(nl_pos, cpos[bad_colon[0]])))
        ln = min(lines)
        text = data.split(b"\n")[ln].strip().decode(errors="replace")[:80]
        raise _line_error(first_line + ln, f"malformed svmlight line (expected 'label index:value "
                          f"...'): {text!r}", path)

    # Convert every number at once: colons become spaces, so a line reads label i v i v ...
    b = a.copy()
    b[cpos] = 32
    n_expected = n_tok + cpos.size
    nums = np.zeros(0) if n_expected == 0 else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            if nums is None:
                nums = np.fromstring(b.tobytes(), dtype=np.float64, sep=" ")
    except ValueError:
        nums = None
    if nums is None or nums.size != n_expected:
        # Error path only: find the first token that is not a number.
        for t, s in enumerate(starts):
            e = starts[t + 1] if t + 1 < n_tok else a.size
            for part in bytes(b[s:e]).split():
                try:
                    float(part)
                except ValueError:
                    raise _line_error(first_line + int(tok_line[t]),
                                      f"not a number: {part.decode(errors='replace')!r}", path) from None
        raise _line_error(first_line, "could not parse the numbers", path)  # pragma: no cover

    width = np.where(first_tok, 1, 2)
    pos = np.concatenate(([0], np.cumsum(width)[:-1]))  # position of each token's first number
    y = nums[pos[first_tok]]
    feat = ~first_tok
    idx_f = nums[pos[feat]]
    vals = nums[pos[feat] + 1]
    feat_line = tok_line[feat]
    if idx_f.size:
        bad = np.flatnonzero((idx_f != np.floor(idx_f)) | (idx_f < 0) | ~np.isfinite(idx_f))
        if bad.size:
            raise _line_error(first_line + int(feat_line[bad[0]]),
                              f"feature index must be a non-negative integer, got {float(idx_f[bad[0]]):g}", path)
        big = np.flatnonzero(idx_f >= 2.0 ** 31)  # scipy's and the kernels' int32 column range
        if big.size:
            raise _line_error(first_line + int(feat_line[big[0]]),
                              f"feature index {float(idx_f[big[0]]):g} is too large (at most 2^31 - 1)", path)
        lo, hi = int(idx_f.min()), int(idx_f.max())
    else:
        lo = hi = -1
    idx = idx_f.astype(np.int64)
    if zero_based == "auto":
        zero_based = lo == 0
    if not zero_based:
        if idx.size and lo == 0:
            bad = int(np.flatnonzero(idx == 0)[0])
            raise _line_error(first_line + int(feat_line[bad]),
                              "feature index 0 in a one-based file (pass zero_based=True)", path)
        idx = idx - 1
    if n_features is not None and idx.size and idx.max() >= n_features:
        bad = int(np.flatnonzero(idx >= n_features)[0])
        raise _line_error(first_line + int(feat_line[bad]),
                          f"feature index {int(idx_f[bad])} out of range for n_features={n_features}", path)

    # Rows are the non-empty lines; row of each feature = rank of its line among them.
    line_to_row = np.cumsum(nonempty) - 1
    frow = line_to_row[feat_line]
    n_rows = int(nonempty.sum())
    if idx.size > 1:
        step = np.diff(idx)
        same = frow[1:] == frow[:-1]
        if bool(np.any(same & (step <= 0))):
            order = np.lexsort((idx, frow))
            frow, idx, vals, feat_line = frow[order], idx[order], vals[order], feat_line[order]
            dup = np.flatnonzero((frow[1:] == frow[:-1]) & (idx[1:] == idx[:-1]))
            if dup.size:
                raise _line_error(first_line + int(feat_line[dup[0]]),
                                  f"duplicate feature index {int(idx[dup[0]]) + (0 if zero_based else 1)}", path)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(frow, minlength=n_rows), out=indptr[1:])
    return indptr, idx, vals.astype(dtype, copy=False), y, lo, hi


def load_svmlight(path, n_features: int | None = None, chunks: int | None = None, *,
                  zero_based="auto", dtype=np.float64, task: str | None = None) -> Dataset:
    """Read an svmlight / libsvm text file (``label index:value index:value ... # comment``).

    ``qid:`` tokens and comments are ignored, blank lines skipped; indices within a line may come
    in any order (they are sorted) but not repeat. gzip, bz2 and xz files are decompressed (told by
    their first bytes, whatever their name) when read whole.

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    n_features : int, optional
        Number of columns; default ``max index + 1`` (after the zero-/one-based shift).
    chunks : int, optional
        Lines per chunk for a lazily chunked Dask variant: one streaming pass over the file
        learns each chunk's row count (and ``n_features`` if not given); the data itself is read
        again, chunk by chunk, only when blocks are computed. Each block of ``X`` is a
        ``scipy.sparse.csr_matrix``. (Chunks hold ``chunks`` physical lines: fewer rows where
        lines are blank or comments.)
    zero_based : bool or "auto"
        Whether indices start at 0. "auto": zero-based iff index 0 occurs anywhere in the file.
    dtype : numpy dtype
        Value dtype (float32 or float64).
    task : str, optional
        The Dataset's task; inferred from the labels when None.

    Returns
    -------
    Dataset
        ``X``: ``scipy.sparse.csr_matrix`` [N, D] (or a Dask array of CSR blocks);
        ``y``: float64 [N] (or a Dask array).

    Raises
    ------
    FileNotFoundError
        The file does not exist.
    ValueError
        A malformed line (the message names its line number), an index out of range; ``chunks``
        on a compressed file.
    """
    path = _check_file(path)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    if n_features is not None and (not isinstance(n_features, (int, np.integer)) or n_features < 1):
        raise ValueError(f"n_features must be a positive integer, got {n_features!r}")
    if zero_based not in ("auto", True, False):
        raise ValueError(f"zero_based must be True, False or 'auto', got {zero_based!r}")
    name = os.path.basename(path)
    if chunks is not None:
        return _svmlight_dask(path, n_features, int(chunks), zero_based, dtype, task, name)
    import scipy.sparse as sp

    data = _read_decompressed(path)
    indptr, idx, vals, y, lo, hi = _parse_svmlight_bytes(data, zero_based=zero_based,
                                                         n_features=n_features, dtype=dtype, path=path)
    if y.size == 0:
        raise ValueError(f"{path}: no data rows")
    if n_features is None:
        n_features = int(idx.max()) + 1 if idx.size else 1
    X = sp.csr_matrix((vals, idx, indptr), shape=(y.size, n_features))
    return Dataset(X, y, name, task or infer_task(y), f"svmlight file {path}")


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "lzma"}  # magic bytes -> module


def _compression(path):
    """The stdlib module that decompresses ``path`` (``"gzip"``, ``"bz2"``, ``"lzma"``), or None."""
    with open(path, "rb") as f:
        head = f.read(6)
    return next((m for magic, m in _COMPRESSED.items() if head.startswith(magic)), None)


def _read_decompressed(path) -> bytes:
    """The file's bytes, decompressed where it is gzip, bz2 or xz (told by its magic bytes)."""
    mod = _compression(path)
    if mod is None:
        with open(path, "rb") as f:
            return f.read()
    import importlib

    with importlib.import_module(mod).open(path, "rb") as f:
        return f.read()


def _line_chunks(path, lines_per_chunk, block=1 << 24):
    """Yield ``(start_byte, end_byte, first_line)`` for runs of ``lines_per_chunk`` lines."""
    size = os.path.getsize(path)
    start, line, pending = 0, 1, 0
    with open(path, "rb") as f:
        off = 0
        while off < size:
            buf = np.frombuffer(f.read(block), dtype=np.uint8)
            nl = np.flatnonzero(buf == 10) + off + 1  # byte just after each newline
            i = 0
            while nl.size - i >= lines_per_chunk - pending:
                i += lines_per_chunk - pending
                end = int(nl[i - 1])
                yield start, end, line
                start, line, pending = end, line + lines_per_chunk, 0
            pending += nl.size - i
            off += buf.size
    if start < size:
        yield start, size, line


def _read_range(path, start, end):
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def _svmlight_dask(path, n_features, chunks, zero_based, dtype, task, name):
    import dask
    import dask.array as da
    import scipy.sparse as sp

    if chunks < 1:
        raise ValueError(f"chunks must be a positive number of rows, got {chunks}")
    mod = _compression(path)
    if mod is not None:
        raise ValueError(f"{path} is {mod}-compressed: chunks= reads byte ranges of the file lazily, which a "
                         "compressed stream cannot seek to; decompress it first, or load it without chunks")
    pieces, rows, lo, hi, ys = [], [], None, -1, []
    for start, end, line in _line_chunks(path, chunks):
        # zero_based is resolved globally below, so parse this pass as zero-based.
        _, _, _, y, l, h = _parse_svmlight_bytes(_read_range(path, start, end), first_line=line,
                                                   zero_based=True, dtype=dtype, path=path)
        if y.size == 0:
            continue
        pieces.append((start, end, line))
        rows.append(int(y.size))
        ys.append(y)
        if l >= 0:
            lo = l if lo is None else min(lo, l)
            hi = max(hi, h)
    if not pieces:
        raise ValueError(f"{path}: no data rows")
    zb = (lo == 0) if zero_based == "auto" else zero_based
    if not zb and lo == 0:
        raise ValueError(f"{path}: feature index 0 in a one-based file (pass zero_based=True)")
    if n_features is None:
        n_features = (hi + (1 if zb else 0)) if hi >= 0 else 1
    elif hi - (0 if zb else 1) >= n_features:
        raise ValueError(f"{path}: feature index {hi} out of range for n_features={n_features}")

    def block(start, end, line):
        ip, ix, v, y, _, _ = _parse_svmlight_bytes(_read_range(path, start, end), first_line=line,
                                                   zero_based=zb, n_features=n_features,
                                                   dtype=dtype, path=path)
        return sp.csr_matrix((v, ix, ip), shape=(y.size, n_features))

    meta = sp.csr_matrix((0, n_features), dtype=dtype)
    blocks = [da.from_delayed(dask.delayed(block)(*p), shape=(r, n_features), dtype=dtype, meta=meta)
              for p, r in zip(pieces, rows)]
    X = da.concatenate(blocks, axis=0)
    y = np.concatenate(ys)  # labels are small: kept in memory, chunked like X
    yd = da.from_array(y, chunks=(tuple(rows),))
    return Dataset(X, yd, name, task or infer_task(y),
                   f"svmlight file {path}, lazily read in chunks of {chunks} lines")


def save_svmlight(path, X, y, *, zero_based: bool = True, comment: str | None = None) -> None:
    """Write ``X`` and ``y`` as svmlight text (explicit zeros of a sparse ``X`` are kept).

    Parameters
    ----------
    path : str or os.PathLike
        Destination file (overwritten).
    X : numpy.ndarray or scipy.sparse matrix
        ``[N, D]``; dense input writes its nonzero entries.
    y : array-like
        ``[N]`` targets.
    zero_based : bool
        Write indices starting at 0 (else at 1).
    comment : str, optional
        Written as a leading ``# comment`` line.
    """
    import scipy.sparse as sp

    Xc = sp.csr_matrix(X)
    y = np.asarray(y).ravel()
    if y.shape[0] != Xc.shape[0]:
        raise ValueError(f"X has {Xc.shape[0]} rows but y has {y.shape[0]}")
    fmt = "%.9g" if Xc.dtype == np.float32 else "%.17g"
    off = 0 if zero_based else 1
    with open(path, "w") as f:
        if comment:
            f.write("# " + comment.replace("\n", " ") + "\n")
        for i in range(Xc.shape[0]):
            a, b = Xc.indptr[i], Xc.indptr[i + 1]
            feats = " ".join(f"{j + off}:{fmt % v}" for j, v in zip(Xc.indices[a:b], Xc.data[a:b]))
            lab = "%d" % y[i] if float(y[i]).is_integer() else "%.17g" % y[i]
            f.write(f"{lab} {feats}\n" if feats else f"{lab}\n")


def _load_y(y, n, where):
    if y is None:
        return None
    if isinstance(y, (str, os.PathLike)):
        y = np.load(_check_file(y), mmap_mode="r")
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != n:
        raise ValueError(f"{where}: targets must have shape ({n},), got {y.shape}")
    return y


def load_npy(path, chunks: int | None = None, *, y=None, task: str | None = None) -> Dataset:
    """Memory-map a 2-D ``.npy`` file (nothing is read until used).

    Parameters
    ----------
    path : str or os.PathLike
        A ``.npy`` file holding a float ``[N, D]`` array.
    chunks : int, optional
        Rows per chunk: return ``X`` as a Dask array over the memory map (blocks read lazily).
    y : str, os.PathLike or array-like, optional
        Targets ``[N]``, or the path of a ``.npy`` file holding them.
    task : str, optional
        The Dataset's task (inferred from ``y`` when given, else "unknown").

    Returns
    -------
    Dataset
        ``X``: ``numpy.memmap`` [N, D] (or a Dask array); ``y``: ``[N]`` or None.
    """
    path = _check_file(path)
    try:
        X = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise ValueError(f"{path}: not a readable .npy array ({e})") from None
    if not isinstance(X, np.ndarray):
        raise ValueError(f"{path}: expected a .npy array, got an archive (use load_npz_shards)")
    if X.ndim != 2:
        raise ValueError(f"{path}: expected a 2-D array [N, D], got shape {X.shape}")
    if X.dtype.kind != "f":
        raise TypeError(f"{path}: expected floating point data, got dtype {X.dtype}")
    if 0 in X.shape:
        raise ValueError(f"{path}: empty array of shape {X.shape}")
    yv = _load_y(y, X.shape[0], path)
    if chunks is not None:
        import dask.array as da

        if int(chunks) < 1:
            raise ValueError(f"chunks must be a positive number of rows, got {chunks}")
        X = da.from_array(X, chunks=(int(chunks), X.shape[1]))
        if yv is not None:
            yv = da.from_array(yv, chunks=(int(chunks),))
    t = task or (infer_task(np.asarray(yv)) if yv is not None else "unknown")
    return Dataset(X, yv, os.path.basename(path), t, f".npy file {path} (memory-mapped)")


def _npz_header(path, member):
    """``(shape, dtype)`` of one member of an ``.npz`` without reading its data."""
    with zipfile.ZipFile(path) as z:
        with z.open(member + ".npy") as f:
            version = np.lib.format.read_magic(f)
            shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                               else np.lib.format.read_array_header_2_0(f))
    return shape, dtype


def _shard_info(path):
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:  # a pickle, garbage, or unreadable
        raise ValueError(f"{path}: not an .npz archive ({e})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):  # a .npy file
        raise ValueError(f"{path}: not an .npz archive (a single .npy array)")
    try:
        with z:
            names = set(z.files)
            if not {"format", "shape", "data", "indices", "indptr"} <= names:
                raise ValueError(f"{path}: not a scipy.sparse.save_npz file (members {sorted(names)})")
            fmt = z["format"].item()
            fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
            shape = tuple(int(s) for s in z["shape"])
    except zipfile.BadZipFile:
        raise ValueError(f"{path}: not an .npz archive") from None
    if fmt != "csr":
        raise TypeError(f"{path}: unsupported sparse format {fmt!r}; only CSR shards are supported")
    _, dtype = _npz_header(path, "data")
    return shape, np.dtype(dtype)


def load_npz_shards(folder, chunks: int | None = None, *, task: str | None = None) -> Dataset:
    """Load CSR shards written by ``scipy.sparse.save_npz``, stacked by file name order.

    Targets, when present, sit beside each shard as ``<shard name>.y.npy`` (all shards or none).

    Parameters
    ----------
    folder : str or os.PathLike
        A folder of ``*.npz`` shards (or one ``.npz`` file).
    chunks : int, optional
        Rows per block of a lazily read Dask array (blocks never straddle shards; each shard is
        read once per compute).
    task : str, optional
        The Dataset's task (inferred from the targets when present, else "unknown").

    Returns
    -------
    Dataset
        ``X``: ``scipy.sparse.csr_matrix`` [N, D] (or a Dask array of CSR blocks); ``y``: [N] or None.
    """
    import scipy.sparse as sp

    folder = os.fspath(folder)
    if not os.path.exists(folder):
        raise FileNotFoundError(f"no such file or folder: {folder}")
    if os.path.isdir(folder):
        files = sorted(glob.glob(os.path.join(folder, "*.npz")))
        if not files:
            raise FileNotFoundError(f"no .npz shards in folder: {folder}")
    else:
        files = [folder]
    infos = [_shard_info(f) for f in files]
    widths = {s[1] for s, _ in infos}
    if len(widths) != 1:
        raise ValueError(f"{folder}: shards have different numbers of columns {sorted(widths)}")
    d = widths.pop()
    if not any(s[0] for s, _ in infos):  # as load_svmlight / load_npy reject empty data
        raise ValueError(f"{folder}: every shard has 0 rows")
    dtype = np.result_type(*[dt for _, dt in infos])
    if dtype.kind != "f":
        raise TypeError(f"{folder}: expected floating point values, got {dtype}")
    ypaths = [f[:-4] + ".y.npy" for f in files]
    have = [os.path.exists(p) for p in ypaths]
    if any(have) and not all(have):
        missing = ypaths[have.index(False)]
        raise FileNotFoundError(f"targets missing for a shard: {missing}")
    ys = [_load_y(p, s[0], p) for p, (s, _) in zip(ypaths, infos)] if all(have) else None
    y = np.concatenate([np.asarray(v) for v in ys]) if ys else None
    t = task or (infer_task(y) if y is not None else "unknown")
    name = os.path.basename(os.path.normpath(folder))
    if chunks is None:
        X = sp.vstack([sp.load_npz(f).astype(dtype, copy=False) for f in files], format="csr")
        return Dataset(X, y, name, t, f"{len(files)} CSR shard(s) from {folder}")
    import dask
    import dask.array as da

    chunks = int(chunks)
    if chunks < 1:
        raise ValueError(f"chunks must be a positive number of rows, got {chunks}")
    meta = sp.csr_matrix((0, d), dtype=dtype)
    blocks, sizes = [], []

    def load(f):
        return sp.load_npz(f).tocsr().astype(dtype, copy=False)

    for f, (shape, _) in zip(files, infos):
        shard = dask.delayed(load)(f)
        for r0 in range(0, shape[0], chunks):
            r1 = min(r0 + chunks, shape[0])
            blocks.append(da.from_delayed(shard[r0:r1], shape=(r1 - r0, d), dtype=dtype, meta=meta))
            sizes.append(r1 - r0)
    X = da.concatenate(blocks, axis=0)
    yd = da.from_array(y, chunks=(tuple(sizes),)) if y is not None else None
    return Dataset(X, yd, name, t, f"{len(files)} CSR shard(s) from {folder}, lazily read")
