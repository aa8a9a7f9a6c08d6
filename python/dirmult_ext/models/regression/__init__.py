"""Dirichlet-multinomial regression, ``log_alpha = X @ W + bias``: the fit
(``fit``), its data and prepass (``data``), optimizers (``optim``), standard
errors (``se``), the result (``result``) and the loss head (``module``)."""
