"""``dirmult-ext regress``: Dirichlet-multinomial regression of a count table
on a table of numeric covariates; prints the coefficients sorted by
significance and saves the full table.

    dirmult-ext regress counts.csv covariates.csv --out coefficients.csv
    dirmult-ext regress taxa.csv metadata.tsv --penalty group-lasso --lam 20

COUNTS: any format ``dirmult-ext fit`` reads (rows = samples, or taxa x
samples, detected as there). COVARIATES: a ``.csv``/``.tsv``/``.txt``
(optionally ``.gz``) table, one row per sample, a header of covariate names
and a first column of sample names (or no name column), or a ``.npy``
matrix. Samples are matched by name when both files name them (extra
covariate rows are ignored), else by order.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import List, Optional

import numpy as np
import torch

from ..data.orientation import ORIENTATION_HINT
from .errors import one_line_errors

__all__ = ["main", "match_samples"]


def match_samples(sample_names: List[str], counts_named: bool,
                  cov_names: Optional[List[str]], n_cov: int, cov_path: str,
                  feature_names: Optional[List[str]] = None) -> np.ndarray:
    """Row indices into the covariates for each counts sample: by name when
    both have names (counts without a name column count as named "1", "2",
    ... when the covariates name every one of those), else by order. The
    errors say how to set the counts' orientation; ``feature_names`` (the
    counts' column names) lets them say when the columns are the samples."""
    B = len(sample_names)
    flip = ORIENTATION_HINT
    if cov_names is not None and feature_names is not None and \
            set(feature_names) & set(cov_names):
        flip = (f"the counts' columns are named like {cov_path}'s rows: the file holds one "
                "sample per column; pass --samples-in-columns (in Python: "
                "samples_in_columns=True)")
    if cov_names is not None and (counts_named or set(sample_names) <= set(cov_names)):
        where = {}
        for i, s in enumerate(cov_names):
            if s in where:
                raise ValueError(f"{cov_path}: sample {s!r} appears twice")
            where[s] = i
        missing = [s for s in sample_names if s not in where]
        if missing:
            shown = ", ".join(repr(s) for s in missing[:5])
            raise ValueError(f"{len(missing)} of the {B} samples of the counts have no row in "
                             f"{cov_path}: {shown}" + (" ..." if len(missing) > 5 else "")
                             + f"; {flip}")
        return np.asarray([where[s] for s in sample_names], dtype=np.int64)
    if n_cov != B:
        raise ValueError(f"the counts have {B} samples and {cov_path} {n_cov} rows; without "
                         "sample names in both files the rows are matched by order and must "
                         f"agree in number; {flip}")
    return np.arange(B)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dirmult-ext regress",
        description="Dirichlet-multinomial regression: log alpha[sample, category] = "
                    "covariates[sample] @ W[:, category] + bias[category]. Prints the "
                    "coefficients (estimate, s.e., Wald z, two-sided p) sorted by p.")
    p.add_argument("counts", help="count table (the formats of 'dirmult-ext fit')")
    p.add_argument("covariates", help="samples x covariates table (.csv/.tsv/.txt with a "
                   "header and a sample-name column, or .npy); numeric values only")
    p.add_argument("--penalty", choices=["none", "l2", "group-lasso"], default="none",
                   help="l2: lam/2 ||W||^2; group-lasso: lam * sum over covariates of the "
                        "norm of its coefficients (default none)")
    p.add_argument("--lam", type=float, default=0.0, help="penalty weight (default 0)")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True,
                   help="per-category intercepts (default on; --no-bias drops them)")
    p.add_argument("--samples-in-columns", action=argparse.BooleanOptionalAction,
                   default=None, help="the counts file holds one sample per column (default: "
                   "detected from the header's first cell)")
    p.add_argument("--index-col", action=argparse.BooleanOptionalAction, default=None,
                   help="the counts file's first column holds names (default: when not numeric)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N")
    p.add_argument("--top", type=int, default=20, help="coefficients printed (default 20)")
    p.add_argument("--out", help="save the full coefficient table as CSV")
    p.add_argument("--max-iter", type=int, default=1000, help="iterations (default 1000)")
    p.add_argument("--tol", type=float, default=1e-9, help="relative objective change "
                   "(default 1e-9)")
    p.add_argument("--batch-size", type=int, default=None, help="stream rows in batches")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="report the iterations on stderr (default: when stderr is a "
                        "terminal, once the fit has taken 2 s)")
    return p


@one_line_errors("regress")
def main(argv=None) -> int:
    """Run ``dirmult-ext regress``."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from .fit import pick_device
    from ..data.io import load_count_table, load_covariates
    from ..models.regression.fit import fit_regression

    t0 = time.perf_counter()
    try:
        if args.top < 1:
            raise ValueError(f"--top must be >= 1, got {args.top}")
        penalty = {"none": None, "l2": "l2", "group-lasso": "group_lasso"}[args.penalty]
        if penalty is None and args.lam != 0:
            raise ValueError("--lam needs --penalty l2 or group-lasso")
        if args.lam < 0:
            raise ValueError(f"--lam must be >= 0, got {args.lam}")
        # before any work: a typo found after a long fit loses the fit
        if not (args.tol > 0 and math.isfinite(args.tol)):
            raise ValueError(f"--tol must be a positive number, got {args.tol}")
        if args.batch_size is not None and args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        if args.max_iter < 1:
            raise ValueError(f"--max-iter must be >= 1, got {args.max_iter}")
        if args.out:
            from ..models.arg_checks import check_writable
            check_writable(args.out, "--out")
        device = pick_device(args.device)
        table = load_count_table(args.counts, sparse=False,
                                 samples_in_columns=args.samples_in_columns,
                                 index_col=args.index_col)
        counts, samples = table.counts, table.sample_names
        B = counts.shape[0]
        counts_named = samples != [str(i + 1) for i in range(B)]
        X, cov_samples, cov_names = load_covariates(args.covariates)
        by_name = cov_samples is not None and (counts_named or set(samples) <= set(cov_samples))
        idx = match_samples(samples, counts_named, cov_samples, X.shape[0], args.covariates,
                            table.feature_names)
        X = X[idx]
        if float((counts.sum(-1) > 0).sum()) == 0:
            raise ValueError(f"{args.counts}: every sample has zero counts")
    except (ValueError, FileNotFoundError, TypeError) as e:
        print(f"dirmult-ext regress: error: {e}", file=sys.stderr)
        return 2

    B, V = counts.shape
    print(f"counts: {args.counts}" + (" (samples in columns: transposed)"
                                      if table.transposed else ""))
    print(f"  {B} samples x {V} categories; covariates: {args.covariates}, {X.shape[1]} "
          f"({', '.join(cov_names[:8])}{', ...' if len(cov_names) > 8 else ''}); "
          f"samples matched {'by name' if by_name else 'by order'}")
    print(f"device: {device}")
    try:
        r = fit_regression(counts, torch.from_numpy(np.ascontiguousarray(X)), bias=args.bias,
                           penalty=penalty, lam=args.lam, tol=args.tol,
                           max_iter=args.max_iter, batch_size=args.batch_size, device=device,
                           progress=args.progress, covariate_names=cov_names,
                           category_names=table.feature_names)
    except ValueError as e:
        print(f"dirmult-ext regress: error: {e}", file=sys.stderr)
        return 2
    print(r.summary(top=args.top))
    if r.has_bias and not np.isnan(r.null_log_lik):
        lr = max(2 * (r.log_lik - r.null_log_lik), 0.0)
        df = X.shape[1] * V
        p_lr = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                             torch.tensor(lr / 2, dtype=torch.float64)))
        print(f"  likelihood ratio vs intercept only: {lr:.4f} on {df} degrees of freedom, "
              f"p = {p_lr:.3g}" + (" (penalized fit: not a valid test)" if penalty else ""))
    if args.out:
        try:
            r.to_csv(args.out)
        except OSError as e:
            # Not lost: the table goes to a temporary file.
            import tempfile
            fd, fallback = tempfile.mkstemp(prefix="dirmult-ext-regress-", suffix=".csv")
            os.close(fd)
            r.to_csv(fallback)
            print(f"dirmult-ext regress: error: cannot write --out {args.out} ({e}); the "
                  f"table was saved instead to {fallback}", file=sys.stderr)
            return 2
        print(f"saved: {args.out} ({len(r.to_table())} coefficients)")
    else:
        print("table not saved (--out FILE.csv saves it)")
    print(f"total {time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
