"""dirmult_ext: the Dirichlet-multinomial log-likelihood as fused C++/CUDA
PyTorch custom ops (``torch.ops.dirmult.*``), with autograd, fake kernels for
torch.compile/export, and TorchScript support; and the statistics built on
them.

The package is layered; each folder imports only the ones above it in this
list (``docs/ARCHITECTURE.md``; checked by ``lint-imports``):

- ``ops``: the native libraries and each op's fake kernel, autograd and call;
- ``data``: sparse counts, files, row streaming;
- ``likelihood``: the public functions, module and distribution over the ops;
- ``models``: fitting (one DM, mixtures, classifier, regression, distributed);
- ``integrations``: Pyro, scikit-learn, AnnData, plots (each imports its
  library on use);
- ``cli``: the ``dirmult-ext`` command.
"""
import sys

from ._version import __version__
from .ops.library import BUILD_INFO, COMPONENTS_WAY, CUDA_KERNELS, OP_CHECKS
from .likelihood.log_lik import (DirichletMultinomialLogLik, log_lik, log_lik_components,
                                 reference_log_lik)
from .likelihood.regression import log_lik_regression
from .likelihood.distribution import DirichletMultinomial
from .data.sparse_counts import SparseCounts
from .data import datasets, io
from .models.fit import DMFit, fit
from .models.mixture import DMMixture, fit_mixture
from .models.classifier import DMClassifier
from .models.regression.fit import DMRegressionFit, fit_regression
from .models.regression.module import DirichletMultinomialRegression

# The two public modules keep their import paths (``from dirmult_ext.io import
# load_counts``) now that they live in the data layer.
sys.modules.setdefault(f"{__name__}.io", io)
sys.modules.setdefault(f"{__name__}.datasets", datasets)


def build_info() -> dict:
    """How this package was built, and what it runs with."""
    import torch
    info = dict(BUILD_INFO)
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_kernels_loaded"] = CUDA_KERNELS
    info["cuda_components_way"] = COMPONENTS_WAY  # DIRMULT_CUDA_COMPONENTS, read on import
    info["op_checks"] = OP_CHECKS  # DIRMULT_OP_CHECKS (See Note [Stable ABI errors])
    t = info["torch_target_version"]
    info["torch_target"] = f"{(t >> 56) & 0xff}.{(t >> 48) & 0xff}"
    return info


def __getattr__(name):
    # dirmult_ext.pyro on first use: Pyro is optional, never imported with
    # the package itself.
    if name == "pyro":
        import importlib
        return importlib.import_module(f"{__name__}.integrations.pyro")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "build_info", "log_lik", "log_lik_components", "log_lik_regression",
           "DirichletMultinomialLogLik", "reference_log_lik", "DirichletMultinomial",
           "fit", "DMFit", "fit_mixture", "DMMixture", "DMClassifier", "datasets", "io",
           "SparseCounts", "fit_regression", "DMRegressionFit", "DirichletMultinomialRegression"]
