"""A/B probe of the unrolled ("small") kernel at m = 3 (session 17; ``--m 5``..``8``: the model's
padded ``tl.dot`` against the unrolled kernel on request, five tiles; ``--launches``, ``--forms``,
``--loss-max-d``: chosen unrolled launches at any m, the loss pass on wider rows): the Hessian product
``X^T (h ⊙ [X,1] S) + beta z`` (mul and softmax forms) and the multinomial loss pass; the kernel as
of session 16 (``fusedml/mmchain/_dense_s16.py``, a copy of that commit's ``dense.py``, when present)
against the current one: the register prefetch one or two tiles ahead, m = 3 unrolled exactly or
padded to 4, other tiles. Every point is checked against float64.

    python benchmarks/m3_probe.py [--shapes 16000000x64 1000000x100] [--out FILE]
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fusedml  # noqa: E402
from fusedml.mmchain import dense as new  # noqa: E402
from fusedml.mmchain._checks import prepare_mmchain  # noqa: E402
from _common import H200_BANDWIDTH, bench_ms, device, markdown_table, write_json  # noqa: E402


def parse_launch(spec, bd, m_pad, pf=2):
    """``"WxE[cCH][pP]"`` (warps x values per thread, column chunk, prefetch depth) -> (name, config)."""
    w, e, ch, p = re.fullmatch(r"(\d+)x(\d+)(?:c(\d+))?(?:p(\d+))?", spec).groups()
    w, e, p = int(w), int(e), pf if p is None else int(p)
    cfg = {"mode": "small", "m_pad": m_pad, "num_warps": w, "prefetch": p, "block_n": max(1, e * 32 * w // bd)}
    if ch:
        cfg["chunk"] = int(ch)
    return f"small {w}w x {e}/thread" + (f", chunk {ch}" if ch else "") + f", {p} ahead", cfg


def plain_cases(spec, dev, old, launches=None):
    N, D, m = (int(s) for s in spec[:-1].split("x"))
    g = torch.Generator(device=dev).manual_seed(N + D + m)
    X = torch.randn(N, D, generator=g, device=dev)
    S = torch.randn(D, m, generator=g, device=dev)
    h = torch.rand(N, m, generator=g, device=dev)
    ref = X.double().T @ (h.double() * (X.double() @ S.double()))
    floor = 1e3 * X.numel() * 4 / H200_BANDWIDTH
    P = prepare_mmchain(X, S, h, None, 1.0, 0.0, intercept=False, v_op="mul", check_finite=False)
    base = new._config(P, None)
    if launches:  # the model against the chosen launches (one tile ahead unless given)
        cases = [("plain new", "model", new, None)] + [
            ("plain new", name, new, cfg) for name, cfg in (parse_launch(x, base.block_d, 4, 1) for x in launches)]
    else:
        cases = [("plain s16", "model", old, None)] if old is not None else []
        cases += [("plain new", "model", new, None), ("plain new", "prefetch 1", new, {"prefetch": 1}),
                  ("plain new", "8w x 8/thread, prefetch 1", new,
                   {"num_warps": 8, "block_n": base.block_n, "prefetch": 1}),
                  ("plain new", "8w x 8/thread, prefetch 2", new,
                   {"num_warps": 8, "block_n": base.block_n, "prefetch": 2})]
    rows = []
    for name, cfg_name, mod, cfg in cases:
        def fn():
            return mod.dense_mmchain_fused(P, config=cfg)
        out = fn()
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        ms = bench_ms(fn)
        rows.append({"shape": spec, "case": name, "launch": cfg_name, "ms": ms, "%floor": 100 * floor / ms,
                     "rel_err": err})
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=None)
    ap.add_argument("--m", type=int, default=3, help="right-hand sides (classes); m > 4: the padded tl.dot "
                    "against the unrolled kernel forced")
    ap.add_argument("--launches", nargs="+", default=None, metavar="WxE[cCH][pP]",
                    help="unrolled launches (warps x values per thread, column chunk, prefetch depth; e.g. "
                    "4x8c32p2) timed against the model for --forms (and the NxDxMp plain shapes); default "
                    "for m > 4: 8x4 4x4 4x8 8x8 16x4")
    ap.add_argument("--forms", nargs="+", default=["mul", "softmax", "loss"], choices=["mul", "softmax", "loss"])
    ap.add_argument("--loss-max-d", type=int, default=None,
                    help="let the unrolled loss pass take rows up to this many values (block_d)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.loss_max_d:  # the loss pass on wider rows than the model allows (session 18's probe)
        new.LOSS_SMALL_MAX_BD = args.loss_max_d
        importlib.import_module("fusedml.mmchain.launch").SMALL_WIDE_M_D["loss"] = args.loss_max_d
    dev = device()
    quick = dev.type != "cuda"
    shapes = args.shapes or (["16000000x64", "4000000x64", "1000000x100", "2000000x128x4p"] if not quick
                             else ["300x10", "200x16x4p"])
    try:
        old = importlib.import_module("fusedml.mmchain._dense_s16")
    except ImportError:
        old = None
    sm = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 2
    rows, t0 = [], time.time()
    for spec in shapes:
        if spec.endswith("p"):  # NxDxMp: the plain product X^T (v ⊙ X Y), no intercept (bench_mmchain's m = 4 case)
            rows += plain_cases(spec, dev, old, args.launches)
            continue
        N, D = (int(s) for s in spec.split("x"))
        m = args.m
        g = torch.Generator(device=dev).manual_seed(N + D)
        X = torch.randn(N, D, generator=g, device=dev)
        S = 0.1 * torch.randn(D + 1, m, generator=g, device=dev)
        h = torch.rand(N, m, generator=g, device=dev)
        Y = torch.nn.functional.one_hot(torch.randint(0, m, (N,), generator=g, device=dev), m).float()
        floor = 1e3 * X.numel() * 4 / H200_BANDWIDTH
        A = torch.cat([X.double(), torch.ones(N, 1, dtype=torch.float64, device=dev)], 1)
        T = A @ S.double()
        refs = {"mul": A.T @ (h.double() * T) + 0.5 * S.double(),
                "softmax": A.T @ (h.double() * (T - (h.double() * T).sum(1, keepdim=True))) + 0.5 * S.double()}
        refs["loss"] = A.T @ (torch.softmax(T, 1) - Y.double()) + 0.5 * S.double()
        cases = []
        if m > 4 or args.launches:  # the model against the unrolled kernel on request
            bd = 1 << (D - 1).bit_length()
            unrolled = [parse_launch(x, bd, 8 if m > 4 else 4)
                        for x in args.launches or ("8x4", "4x4", "4x8", "8x8", "16x4")]
            for form in args.forms:
                P = None if form == "loss" else prepare_mmchain(X, S, h, S, 1.0, 0.5, intercept=True, v_op=form,
                                                                check_finite=False)
                extra = [("matvec + X^T V", {"mode": "dot", "m_pad": 16})] if form == "loss" and D > 128 else []
                for cfg_name, cfg in [("model", None)] + extra + unrolled:  # dot on > 128 values: no one-read pass
                    cases.append((f"{form} new", cfg_name, form, new, True, P, cfg))
        for form in ("mul", "softmax") if m <= 4 and not args.launches else ():
            P = prepare_mmchain(X, S, h, S, 1.0, 0.5, intercept=True, v_op=form, check_finite=False)
            if old is not None:
                cases.append((f"{form} s16", "model", form, old, True, P, None))
            for cfg_name, cfg in (("model", None), ("prefetch 1", {"prefetch": 1}),
                                  ("prefetch 1, 1/SM", {"prefetch": 1, "num_programs": sm}),
                                  ("4w bn/2", "half4"), ("16w bn*2", "dbl16"),
                                  ("maxnreg 128", {"max_registers": 128}), ("maxnreg 80", {"max_registers": 80})):
                cases.append((f"{form} new", cfg_name, form, new, True, P, cfg))
            cases.append((f"{form} new pad4", "model", form, new, False, P, None))
        for cfg_name, cfg in () if m > 4 or args.launches else (("model", None), ("prefetch 1", {"prefetch": 1}), ("4w bn/2", "half4"),
                              ("maxnreg 168", {"max_registers": 168}), ("maxnreg 128", {"max_registers": 128}),
                              ("8w bn*2, maxnreg 128", {"num_warps": 8, "block_n": "dbl", "max_registers": 128}),
                              ("16w bn*2", "dbl16"), ("8w bn/2 (4/thread)", {"block_n": "half"}),
                              ("dot tf32x3", {"mode": "dot", "m_pad": 16, "block_n": 64, "num_warps": 4,
                                              "prefetch": False, **({"block_d": 16} if D < 16 else {})})):
            cases.append(("loss new", cfg_name, "loss", new, True, None, cfg))
        for name, cfg_name, form, mod, exact, P, cfg in cases:
            new._EXACT_UNROLL = exact
            if cfg in ("half4", "dbl16") or (isinstance(cfg, dict) and cfg.get("block_n") in ("half", "dbl")):
                base = new._config_uncached(prepare_mmchain(X, S, Y, S, 1.0, 0.5, intercept=True, v_op="mul",
                                                            check_finite=False), None, form == "loss")
                cfg = ({"num_warps": 4, "block_n": max(1, base.block_n // 2)} if cfg == "half4" else
                       {"num_warps": 16, "block_n": base.block_n * 2} if cfg == "dbl16" else
                       dict(cfg, block_n=base.block_n * 2) if cfg["block_n"] == "dbl" else
                       dict(cfg, block_n=max(1, base.block_n // 2)))
            if form == "loss":
                def fn():
                    return fusedml.loss_gradient(X, S, Y, loss="multinomial", z=S, beta=0.5, intercept=True,
                                                 backend="fused", config=cfg).grad
            else:
                def fn():
                    return mod.dense_mmchain_fused(P, config=cfg)
            try:
                out = fn()
                err = float((out.double() - refs[form]).abs().max() / refs[form].abs().max())
                ms = bench_ms(fn)
            except Exception as e:  # an invalid point: recorded, not fatal
                err, ms = None, None
                name += f" ({type(e).__name__}: {str(e)[:60]})"
            rows.append({"shape": spec, "case": name, "launch": cfg_name, "ms": ms,
                         "%floor": None if ms is None else 100 * floor / ms, "rel_err": err})
            print(rows[-1], flush=True)
        new._EXACT_UNROLL = True
        X = A = T = h = Y = None  # free the device memory
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    path = write_json("m3_probe", rows, {"args": vars(args), "wall_s": time.time() - t0}, args.out)
    print(f"\nwrote {path}\n")
    print(markdown_table(rows, ["shape", "case", "launch", "ms", "%floor", "rel_err"]))
    return rows


if __name__ == "__main__":
    main()
