"""``dirmult-ext fit``: fit a Dirichlet-multinomial (``--k 1``) or a K-component
DM mixture to a count matrix, print a summary, save the parameters.

    dirmult-ext fit                      the bundled digits data: mixtures of 5, 10,
                                         15, 20 and 30 components (dmn's prior) on a
                                         random 400 of its rows, the criteria table,
                                         the chosen k's components and their
                                         agreement with the digit labels, and
                                         held-out accuracy of the class-conditional
                                         DM classifier vs multinomial naive Bayes on
                                         every row
    dirmult-ext fit counts.npz --k 3 --out params.npz
    dirmult-ext fit taxa.csv --k 1-7 --prior dmn --out results/ --plot
                                         model selection as DirichletMultinomial's
                                         dmn: the criteria table and the chosen k
    dirmult-ext fit counts.csv --labels labels.txt
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
from torch import Tensor

from .errors import one_line_errors

__all__ = ["main", "pick_device", "parse_k",
           "DIGITS_K", "DIGITS_ROWS", "DIGITS_PRIOR", "MULTINOMIAL_LIMIT"]

#: ``--k``, ``--rows`` and ``--prior`` for the bundled digits. On all 1797
#: rows the criteria keep falling well past the 10 classes (BIC turns near
#: k = 45, Laplace later: minutes of fits on two cores); on a random 400
#: under dmn's prior, Laplace, the criterion to trust with the prior, is
#: lowest at k = 15 or 20 (seeds 0-12), so this list ends on an interior
#: choice in seconds.
DIGITS_K = "5,10,15,20,30"
DIGITS_ROWS = 400
DIGITS_PRIOR = "dmn"

#: A precision A = sum(alpha) above this is reported as the multinomial
#: limit (no overdispersion); so is a DM log-likelihood within
#: MULTINOMIAL_RTOL (relative) of the multinomial's.
MULTINOMIAL_LIMIT = 1e6
MULTINOMIAL_RTOL = 1e-6


def parse_k(text: str) -> List[int]:
    """``--k``: ``3``, a range ``1-7`` or a list ``2,4,6``."""
    try:
        if "-" in text:
            lo, hi = (int(t) for t in text.split("-"))
            ks = list(range(lo, hi + 1))
        else:
            ks = [int(t) for t in text.split(",")]
    except ValueError:
        raise ValueError(f"--k must be a number, a range like 1-7 or a list like 2,4,6; "
                         f"got {text!r}") from None
    if not ks or min(ks) < 1 or len(set(ks)) != len(ks):
        raise ValueError(f"--k must give distinct numbers of components >= 1, got {text!r}")
    return ks


def format_k(ks: List[int]) -> str:
    """``ks`` as the header names them: ``8..12`` for a range, else a list."""
    if len(ks) > 2 and ks == list(range(ks[0], ks[-1] + 1)):
        return f"{ks[0]}..{ks[-1]}"
    return ", ".join(map(str, ks))


def pick_device(name: str = "auto") -> torch.device:
    """``auto``: cuda if torch sees a GPU and the package's CUDA kernels are
    loaded, else cpu; otherwise the named device."""
    if name != "auto":
        from ..models.arg_checks import check_device
        return check_device(name, "--device")
    from ..ops.library import CUDA_KERNELS
    return torch.device("cuda" if torch.cuda.is_available() and CUDA_KERNELS else "cpu")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dirmult-ext fit",
        description="Fit a Dirichlet-multinomial (k=1) or a DM mixture to a count matrix "
                    "(rows = samples, columns = categories). Without FILE: the bundled "
                    "UCI digits data.")
    p.add_argument("file", nargs="?", help=".npy, .npz (dense or scipy.sparse), .csv/.tsv/"
                   ".txt (optionally .gz) or .mtx; default: the bundled digits data")
    p.add_argument("--k", default=None,
                   help="components: a number (1: a single DM; default 1, or "
                        f"{DIGITS_K} for the digits), or a range 1-7 / list 2,4,6: fit "
                        "each, print the table of log-likelihood, Laplace, BIC, AIC and the "
                        "k Laplace picks")
    p.add_argument("--prior", choices=["none", "dmn"], default=None,
                   help="dmn: the MAP estimate under DirichletMultinomial's "
                        "Gamma(0.1, 0.1) prior on each alpha (its criteria then match "
                        "dmn's; with --k 1 a one-component dmn fit); none: maximum "
                        f"likelihood (default; {DIGITS_PRIOR} for the digits)")
    p.add_argument("--criterion", choices=["laplace", "bic", "aic"], default=None,
                   help="the criterion that chooses k among several: default laplace with "
                        "--prior dmn (it then approximates the marginal likelihood), bic "
                        "without a prior (Laplace then drifts to larger k)")
    p.add_argument("--rows", type=int, default=None,
                   help="fit to a random N of the rows, drawn with --seed (the classifier "
                        "comparison of --labels keeps every row); default: every row, or "
                        f"{DIGITS_ROWS} for the digits")
    p.add_argument("--samples-in-columns", action=argparse.BooleanOptionalAction,
                   default=None, help="the text file holds one sample per column (taxa x "
                   "samples) and is transposed (default: detected from the header's first "
                   "cell, e.g. Taxon or #OTU ID)")
    p.add_argument("--index-col", action=argparse.BooleanOptionalAction, default=None,
                   help="the text file's first column holds names (default: when it is not "
                        "numeric)")
    p.add_argument("--allow-fractional", action="store_true",
                   help="accept non-integer counts (e.g. 0.5), fitted through the DM's "
                        "Gamma-function extension to real counts (default: an error naming "
                        "the first one)")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, cuda:N")
    p.add_argument("--out", help="save the results: a .npz file (with the tables as .csv "
                   "beside it) or a directory (dmm.npz, dmm_*.csv); default: not saved")
    p.add_argument("--plot", action="store_true",
                   help="mixtures, with --out: PNGs of the criteria against k and of the top "
                        "features' mean proportions per component (needs matplotlib)")
    p.add_argument("--top", type=int, default=5,
                   help="features printed per component (default 5)")
    p.add_argument("--labels", help="one label per row: also report the held-out accuracy "
                   "of the class-conditional DM classifier vs multinomial naive Bayes "
                   "(and, for k > 1, the adjusted Rand index of the clusters)")
    p.add_argument("--method", choices=["newton", "fixed_point"], default="newton",
                   help="single-DM optimizer (default newton)")
    p.add_argument("--n-init", type=int, default=3,
                   help="mixture EM runs to convergence (default 3)")
    p.add_argument("--n-screen", type=int, default=20,
                   help="short mixture runs screened for the --n-init starts (default 20; "
                        "0: none)")
    p.add_argument("--max-iter", type=int, default=200, help="iterations (default 200)")
    p.add_argument("--tol", type=float, default=None,
                   help="relative log-likelihood tolerance (default 1e-8 for k=1, 1e-6 for "
                        "mixtures)")
    p.add_argument("--seed", type=int, default=0, help="seed for restarts and the split")
    p.add_argument("--test-fraction", type=float, default=0.25,
                   help="held-out fraction for the classifier comparison (default 0.25)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="stream rows in batches of N from host memory (default: all at "
                        "once, or streamed when the matrix exceeds half the free GPU memory)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="report the iterations on stderr: a tqdm bar, or plain lines "
                        "without tqdm (default: when stderr is a terminal, once a fit has "
                        "taken 2 s)")
    return p


def _print_baseline(log_lik: float, V: int, B: int, half: bool) -> None:
    """The single multinomial at its MLE (p = column totals / total, V - 1
    parameters) on the fit's scale: -2 log L + ... for one DM, dmn's half
    scale for mixtures."""
    p = V - 1
    if half:
        bic, aic, scale = -log_lik + 0.5 * p * np.log(B), -log_lik + p, "dmn's half scale"
    else:
        bic, aic, scale = -2 * log_lik + p * np.log(B), -2 * log_lik + 2 * p, "the DM's scale"
    print(f"  baseline, one multinomial (p = column totals / total, {p} parameters): "
          f"log-likelihood {log_lik:.4f} (normalized pmf); BIC {bic:.1f}, AIC {aic:.1f} "
          f"({scale})")


def _check_options(args) -> None:
    """The numeric options and the output location, before any work: a
    typo found after a long fit loses the fit."""
    if args.tol is not None and not (args.tol > 0 and math.isfinite(args.tol)):
        raise ValueError(f"--tol must be a positive number, got {args.tol}")
    if args.rows is not None and args.rows < 1:
        raise ValueError(f"--rows must be >= 1, got {args.rows}")
    if args.batch_size is not None and args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    if not 0 < args.test_fraction < 1:
        raise ValueError(f"--test-fraction must be in (0, 1), got {args.test_fraction}")
    if args.out:
        from ..models.arg_checks import check_writable
        check_writable(args.out, "--out", directory=not args.out.lower().endswith(".npz"))


@one_line_errors("fit")
def main(argv=None) -> int:
    """Run ``dirmult-ext fit``."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from ..models.criteria import CRITERION_NAMES, multinomial_log_lik
    from ..models.baselines import multinomial_naive_bayes, train_test_split
    from ..models.fit import fit
    from ..data.io import load_count_table, load_labels
    from ..models.classifier import DMClassifier
    from ..models.metrics import adjusted_rand_index
    from ..models.mixture import fit_mixture

    t_start = time.perf_counter()
    try:
        _check_options(args)
        device = pick_device(args.device)
        labels: Optional[Tensor] = None
        classes = None
        if args.file is None:
            if args.labels:
                raise ValueError("--labels needs a counts FILE (the digits data has its own)")
            from ..data.datasets import load_digits
            counts, labels = load_digits()
            classes = np.arange(10)
            source = "bundled UCI optical digits (Alpaydin & Kaynak 1998, CC BY 4.0)"
            ks = parse_k(DIGITS_K if args.k is None else args.k)
            args.rows = DIGITS_ROWS if args.rows is None else args.rows
            args.prior = DIGITS_PRIOR if args.prior is None else args.prior
            sample_names = [str(i + 1) for i in range(counts.shape[0])]
            feature_names = [f"pixel{i + 1}" for i in range(counts.shape[1])]
            transposed = False
        else:
            # (sparse files stay sparse)
            counts, sample_names, feature_names, transposed = load_count_table(
                args.file, samples_in_columns=args.samples_in_columns,
                index_col=args.index_col, require_integer=not args.allow_fractional)
            source = args.file
            ks = [1] if args.k is None else parse_k(args.k)
            if args.labels:
                labels, classes = load_labels(args.labels, counts.shape[0])
        args.prior = args.prior or "none"
        n_fit = counts.shape[0] if args.rows is None else min(args.rows, counts.shape[0])
        if max(ks) > n_fit:
            held = (f"--rows keeps {n_fit}" if n_fit < counts.shape[0]
                    else f"the data has {n_fit}")
            raise ValueError(f"--k {max(ks)} needs at least {max(ks)} samples, {held}")
        for flag, v, lo in (("--top", args.top, 1), ("--n-init", args.n_init, 1),
                            ("--n-screen", args.n_screen, 0), ("--max-iter", args.max_iter, 1)):
            if v < lo:
                raise ValueError(f"{flag} must be >= {lo}, got {v}")
        if args.plot:
            if not args.out:
                raise ValueError("--plot writes beside the results: give --out too")
            from ..integrations.plots import require_matplotlib
            require_matplotlib()
    except ImportError as e:
        print(f"dirmult-ext fit: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:
        if "non-integer count" in str(e) and not args.allow_fractional:
            e = f"{e}; counts are whole numbers (--allow-fractional fits real values)"
        print(f"dirmult-ext fit: error: {e}", file=sys.stderr)
        return 2

    B, V = counts.shape
    # (no copy of the counts: the totals accumulate in float64 as they read)
    if isinstance(counts, Tensor):
        N = counts.sum(-1, dtype=torch.float64)
        nonzero = int(torch.count_nonzero(counts))
    else:
        N = counts.row_totals()
        nonzero = int(torch.count_nonzero(counts.values))
    zeros = 1.0 - nonzero / max(B * V, 1)
    print(f"data: {source}" + (" (samples in columns: transposed)" if transposed else ""))
    print(f"  {B} rows x {V} categories, {int(N.sum())} counts, row totals "
          f"{int(N.min())}..{int(N.max())}, {zeros:.1%} zeros")
    print(f"device: {device}")
    empty = int((N == 0).sum())
    if empty:
        print(f"dirmult-ext fit: warning: {empty} sample{'s have' if empty > 1 else ' has'} "
              f"no counts; {'they add' if empty > 1 else 'it adds'} 0 to the log-likelihood",
              file=sys.stderr)
    all_counts, all_labels = counts, labels
    if n_fit < B:
        g = torch.Generator().manual_seed(args.seed)
        idx = torch.randperm(B, generator=g)[:n_fit].sort().values
        counts = counts[idx]
        N = N[idx]
        labels = None if labels is None else labels[idx]
        sample_names = [sample_names[i] for i in idx.tolist()]
        print(f"  fitted to a random {n_fit} of the {B} rows (--rows {n_fit}, seed "
              f"{args.seed})" + ("; the classifier uses every row" if labels is not None
                                 else ""))
        B = n_fit
    baseline = _baseline(multinomial_log_lik, counts, N, device)
    params = {}
    mixture = selection = None
    t0 = time.perf_counter()
    k = ks[0]
    if ks == [1] and args.prior == "none":
        tol = 1e-8 if args.tol is None else args.tol
        r = fit(counts, method=args.method, tol=tol, max_iter=args.max_iter,
                batch_size=args.batch_size, progress=args.progress, device=device)
        dt = time.perf_counter() - t0
        base_ll = baseline.result()
        print(f"Dirichlet-multinomial fit ({r.method}): log-likelihood {r.log_lik:.4f} "
              f"(normalized pmf), {r.n_iter} iterations, converged={r.converged}, {dt:.2f} s")
        bic, aic = -2 * r.log_lik + V * np.log(B), -2 * r.log_lik + 2 * V
        print(f"  precision A = sum(alpha) = {r.precision:.6g}; BIC {bic:.1f}, AIC {aic:.1f} "
              f"(-2 log L + penalty, {V} parameters; lower is better)")
        _print_baseline(base_ll, V, B, half=False)
        if (r.precision > MULTINOMIAL_LIMIT
                or abs(r.log_lik - base_ll) <= MULTINOMIAL_RTOL * abs(base_ll)):
            print("  no overdispersion: the DM has reached its multinomial limit")
        top = torch.argsort(r.alpha, descending=True)[:args.top].tolist()
        print("  largest alpha: " + ", ".join(f"{feature_names[i]} {float(r.alpha[i]):.4g}"
                                               for i in top))
        params = dict(alpha=r.alpha.numpy(), log_alpha=r.log_alpha.numpy(),
                      log_lik=r.log_lik, n_iter=r.n_iter, converged=r.converged,
                      log_lik_trace=np.asarray(r.log_lik_trace))
    else:
        tol = 1e-6 if args.tol is None else args.tol
        prior = None if args.prior == "none" else args.prior
        fitted = fit_mixture(counts, ks if len(ks) > 1 else k, n_init=args.n_init,
                             n_screen=args.n_screen,
                             max_iter=args.max_iter, tol=tol, seed=args.seed,
                             progress=args.progress, device=device,
                             batch_size=args.batch_size, prior=prior)
        dt = time.perf_counter() - t0
        base_ll = baseline.result()
        what = ("maximum likelihood" if prior is None
                else "MAP under dmn's Gamma(0.1, 0.1) prior")
        if len(ks) > 1:
            selection = fitted
            criterion = _chosen_criterion(args)
            k = selection.chosen(criterion)
            m = selection[k]
            print(f"model selection, k = {format_k(ks)} ({what}, {args.n_init} runs from "
                  f"{max(args.n_screen, args.n_init)} seeds each, {dt:.2f} s); criteria as "
                  "DirichletMultinomial::dmn defines them (lower is better, half the usual "
                  "BIC/AIC scale; log-lik: the normalized pmf):")
            print(selection.format_table())
            print(f"chosen k = {k} ({CRITERION_NAMES[criterion]})")
            from .advice import criteria_advice
            for line in criteria_advice({c: selection.chosen(c) for c in ("laplace", "bic",
                                                                          "aic")},
                                        ks, prior is not None):
                print(f"  {line}")
        else:
            m = fitted
        mixture = m
        print(f"{k}-component DM mixture (EM, {what}): log-likelihood {m.log_lik:.4f} "
              f"(normalized pmf); Laplace {m.laplace:.1f}, BIC {m.bic:.1f}, AIC {m.aic:.1f}")
        _print_baseline(base_ll, V, B, half=True)
        print(f"  best restart: {m.n_iter} iterations, converged={m.converged}; restarts' "
              f"objectives " + ", ".join(f"{x:.2f}" for x in m.restart_log_liks)
              + f"; {dt:.2f} s")
        mean = m.alpha / m.alpha.sum(-1, keepdim=True)
        print(f"  components by weight, top {args.top} features by mean proportion:")
        for j in range(k):
            top = torch.argsort(mean[j], descending=True)[:args.top].tolist()
            print(f"  {j + 1}: weight {float(m.weights[j]):.3f}, precision "
                  f"{float(m.alpha[j].sum()):.4g}: "
                  + ", ".join(f"{feature_names[i]} {float(mean[j, i]):.1%}" for i in top))
        at_limit = [j + 1 for j in range(k) if float(m.alpha[j].sum()) > MULTINOMIAL_LIMIT]
        if at_limit:
            print(f"  no overdispersion within component{'s' if len(at_limit) > 1 else ''} "
                  + ", ".join(map(str, at_limit)) + ": precision above "
                  f"{MULTINOMIAL_LIMIT:.0e}, the multinomial limit")
        assign = m.responsibilities.argmax(-1)
        if labels is not None:
            print(f"  adjusted Rand index of clusters vs labels: "
                  f"{adjusted_rand_index(assign, labels):.4f}")
            if selection is not None:
                print("  (every k: " + ", ".join(
                    f"{kk}: {adjusted_rand_index(f.responsibilities.argmax(-1), labels):.4f}"
                    for kk, f in zip(selection.ks, selection.fits)) + ")")
        params = dict(weights=m.weights.numpy(), log_alpha=m.log_alpha.numpy(),
                      alpha=m.alpha.numpy(), log_lik=m.log_lik, bic=m.bic, aic=m.aic,
                      n_iter=m.n_iter, converged=m.converged, assignments=assign.numpy())
    if all_labels is not None:
        counts, labels = all_counts, all_labels
        tr, te = train_test_split(counts.shape[0], args.test_fraction, args.seed)
        C = len(classes)
        t0 = time.perf_counter()
        clf = DMClassifier(device=device).fit(counts[tr], labels[tr])
        right_dm = torch.as_tensor(clf.predict(counts[te])) == labels[te]
        acc_dm = float(right_dm.double().mean())
        t_dm = time.perf_counter() - t0
        right_nb = multinomial_naive_bayes(counts[tr], labels[tr], counts[te], C) == labels[te]
        acc_nb = float(right_nb.double().mean())
        print(f"classification, seeded split (seed {args.seed}): {len(tr)} train / "
              f"{len(te)} test rows, {C} classes")
        print(f"  class-conditional DM classifier: accuracy {acc_dm:.4f} ({t_dm:.2f} s)")
        print(f"  multinomial naive Bayes (Laplace): accuracy {acc_nb:.4f}")
        # Paired over the same test rows: only the rows where one is right and
        # the other wrong carry the difference (its standard error as McNemar's).
        n_te = max(len(te), 1)
        discordant = int((right_dm != right_nb).sum())
        se = math.sqrt(discordant) / n_te
        diff = acc_dm - acc_nb
        verdict = ("within two standard errors: no difference this split can show"
                   if abs(diff) <= 2 * se else "beyond two standard errors")
        print(f"  difference {diff:+.4f}, paired standard error {se:.4f} over {len(te)} "
              f"test rows ({discordant} classified differently): {verdict}")
        params.update(classifier_log_alpha=clf.log_alpha_.numpy(),
                      classifier_log_prior=clf.log_prior_.numpy(),
                      classifier_accuracy=acc_dm, naive_bayes_accuracy=acc_nb)
    if args.out:
        try:
            paths = _save(args, params, mixture, selection, r if mixture is None else None,
                          sample_names, feature_names)
        except OSError as e:
            # Not lost: the fit's arrays go to a fresh temporary directory.
            import tempfile
            from .outputs import save_mixture
            prefix = os.path.join(tempfile.mkdtemp(prefix="dirmult-ext-fit-"), "dmm")
            if mixture is None:
                np.savez(prefix + ".npz", feature_names=np.asarray(feature_names), **params)
                paths = [prefix + ".npz"]
            else:
                paths = save_mixture(prefix, mixture, sample_names, feature_names, selection,
                                     {key: v for key, v in params.items()
                                      if key.startswith("classifier")
                                      or key == "naive_bayes_accuracy"})
            print(f"dirmult-ext fit: error: cannot write --out {args.out} ({e}); the results "
                  f"were saved instead to: {', '.join(paths)}", file=sys.stderr)
            return 2
        print("saved: " + ", ".join(paths))
    else:
        print("results not saved (--out FILE.npz or --out DIR saves them)")
    print(f"total {time.perf_counter() - t_start:.2f} s")
    return 0


def _baseline(of, counts, N, device: torch.device):
    """The multinomial baseline ``of(counts, N)`` as a future: for a fit on
    another device computed on a host thread while that device fits (the
    host waits on it otherwise), for a CPU fit at once (it takes the cores
    itself)."""
    from concurrent.futures import Future, ThreadPoolExecutor
    if device.type == "cpu":
        done = Future()
        done.set_result(of(counts, N))
        return done
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dirmult-baseline")
    try:
        return pool.submit(of, counts, N)
    finally:
        pool.shutdown(wait=False)


def _chosen_criterion(args) -> str:
    """--criterion, or its default: Laplace with a prior, BIC without."""
    return args.criterion or ("laplace" if args.prior == "dmn" else "bic")


def _save(args, params, mixture, selection, r, sample_names, feature_names) -> List[str]:
    """Write ``--out`` (and its plots); returns the paths written."""
    from .outputs import output_prefix, save_mixture
    prefix = output_prefix(args.out)
    if mixture is None:
        paths = [prefix + ".npz"]
        np.savez(paths[0], feature_names=np.asarray(feature_names), **params)
        if args.plot:  # one DM: its mean proportions as one component
            from ..integrations.plots import plot_component_heatmap
            paths.append(plot_component_heatmap(r, feature_names, prefix + "_heatmap.png"))
    else:
        extra = {key: v for key, v in params.items() if key.startswith("classifier")
                 or key == "naive_bayes_accuracy"}
        paths = save_mixture(prefix, mixture, sample_names, feature_names, selection,
                             extra)
        if args.plot:
            from ..integrations.plots import plot_component_heatmap, plot_criteria
            if selection is not None:
                paths.append(plot_criteria(selection, prefix + "_criteria.png",
                                           criterion=_chosen_criterion(args)))
            paths.append(plot_component_heatmap(mixture, feature_names,
                                                prefix + "_heatmap.png"))
    return paths


if __name__ == "__main__":
    sys.exit(main())
