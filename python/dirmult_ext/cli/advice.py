"""What ``dirmult-ext fit`` says after a table of criteria: which k each
criterion picks, which to trust when they disagree and why, and whether the
range of k should move."""
from __future__ import annotations

from typing import Dict, List, Sequence

__all__ = ["criteria_advice"]


def criteria_advice(picks: Dict[str, int], ks: Sequence[int], prior: bool) -> List[str]:
    """Lines of guidance from the k each criterion picks (``picks``: keys
    ``laplace``, ``bic``, ``aic``), the fitted ``ks`` and whether the fit
    had a prior (``--prior dmn``)."""
    lap, bic, aic = picks["laplace"], picks["bic"], picks["aic"]
    lines = []
    if lap == bic == aic:
        lines.append(f"Laplace, BIC and AIC all choose k = {lap}")
        trusted = lap
    elif prior:
        trusted = lap
        lines += [
            f"the criteria disagree (Laplace k = {lap}, BIC k = {bic}, AIC k = {aic}): "
            f"trust Laplace (k = {lap}), the chosen k",
            "why: with the prior, Laplace approximates the marginal likelihood (dmn's "
            "choice); BIC is its cruder large-sample form, and AIC, whose penalty does not "
            "grow with the number of samples, targets prediction, not the number of groups"]
    else:
        trusted = bic
        lines += [
            f"the criteria disagree (Laplace k = {lap}, BIC k = {bic}, AIC k = {aic}): "
            f"trust BIC (k = {bic}) here",
            "why: without a prior, Laplace has no prior density to charge for each extra "
            "component's parameters and drifts to larger k (on structureless data, the "
            "largest fitted); AIC's penalty does not grow with the number of samples. "
            "--prior dmn makes Laplace an approximation of the marginal likelihood, as dmn "
            "uses it"]
    ks = sorted(ks)
    if len(ks) > 2 and trusted == ks[-1]:
        lines.append(f"k = {trusted} is the largest fitted: a larger k may fit better "
                     f"(e.g. --k {trusted}-{trusted + 4})")
    elif len(ks) > 2 and trusted == ks[0] and trusted > 1:
        lines.append(f"k = {trusted} is the smallest fitted: a smaller k may fit better "
                     f"(e.g. --k 1-{trusted})")
    return lines
