"""Which way round a named count table is: one sample per row, or (as
microbiome tables come) one taxon per row and one sample per column.

A header whose first cell names the taxa (``Taxon``, ``#OTU ID``, ...)
settles it (:mod:`dirmult_ext.data.io`). R's ``write.csv`` and pandas'
``to_csv`` leave that cell blank (R writes ``""``); then the names decide:
the side whose names look like taxa (``OTU_12``, ``ASV3``, ``g__Bacteroides``,
a ``;``-separated lineage, an amplicon sequence, a QIIME 2 feature hash) or
the other side's like samples (``S1``, ``sample_7``, ``SRR1234567``).
"""
from __future__ import annotations

import re
import warnings
from typing import List, Optional, Sequence

__all__ = ["ORIENTATION_HINT", "blank_corner_orientation", "looks_like_taxa",
           "looks_like_samples"]

#: How to set the orientation, appended to the errors it may explain.
ORIENTATION_HINT = ("if the counts file holds one sample per column (taxa x samples), pass "
                    "--samples-in-columns (in Python: samples_in_columns=True to "
                    "dirmult_ext.io.load_counts / load_count_table)")

_TAXON = re.compile(
    r"""^(?:
        (?:z?otu|asv|esv|sv|taxon|taxa|feature|phylotype|species|genus|tax)[\s_.:-]?\d+
      | .*\b[dkpcofgst]__.*          # rank prefixes: k__Bacteria, g__Bacteroides
      | [^;]+(?:;[^;]*)+             # a lineage: Bacteria;Firmicutes;...
      | [acgtn]{20,}                 # an amplicon sequence variant's sequence
      | [0-9a-f]{32}                 # a QIIME 2 feature id (md5 of the sequence)
    )$""", re.I | re.X)

_SAMPLE = re.compile(
    r"^(?:s|sample|smp|subject|patient|specimen|[sedr]r[rsx])[\s_.:-]?\d+$", re.I)


def _fraction(names: Sequence[str], pattern) -> float:
    names = [n.strip().strip('"') for n in names]
    return sum(bool(pattern.match(n)) for n in names) / max(len(names), 1)


def looks_like_taxa(names: Sequence[str]) -> bool:
    """At least half of ``names`` are named as taxa usually are."""
    return _fraction(names, _TAXON) >= 0.5


def looks_like_samples(names: Sequence[str]) -> bool:
    """At least half of ``names`` are named as samples usually are."""
    return _fraction(names, _SAMPLE) >= 0.5


def blank_corner_orientation(path: str, row_names: Optional[List[str]],
                             col_names: Optional[List[str]]) -> bool:
    """``samples_in_columns`` for a table with named rows and columns and a
    blank first header cell: True when the rows are named like taxa or the
    columns like samples (and not the other way too); else False, with a
    warning that says how to set it."""
    if not row_names or not col_names:
        return False
    rows_taxa, cols_taxa = looks_like_taxa(row_names), looks_like_taxa(col_names)
    rows_samples, cols_samples = looks_like_samples(row_names), looks_like_samples(col_names)
    if (rows_taxa or cols_samples) and not (cols_taxa or rows_samples):
        return True
    if (cols_taxa or rows_samples) and not (rows_taxa or cols_samples):
        return False
    warnings.warn(
        f"{path}: a table with row and column names and a blank first header cell (as R's "
        f"write.csv writes it) is read with one sample per row ({len(row_names)} samples x "
        f"{len(col_names)} categories); {ORIENTATION_HINT}; --no-samples-in-columns "
        "(samples_in_columns=False) confirms this reading", UserWarning, stacklevel=3)
    return False
