"""The Dirichlet-multinomial log-likelihood as users call it: the functions
and module over the ops (``log_lik``, ``regression``), their path for sparse
counts (``sparse``), moments of sparse counts (``sparse_stats``) and the
``torch.distributions`` distribution (``distribution``)."""
