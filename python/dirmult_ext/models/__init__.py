"""Fitting: the engine every model streams its rows through (``engine``),
one DM (``fit``), mixtures by EM (``mixture``, its starts in ``starts``,
``criteria`` for model selection), the classifier (``classifier``), DM
regression (``regression/``), the data-parallel fits (``distributed``,
``distributed_mixture``, ``collective``), baselines and metrics."""
