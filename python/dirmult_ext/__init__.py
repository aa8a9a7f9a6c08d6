"""dirmult_ext: the Dirichlet-multinomial log-likelihood as fused C++/CUDA
PyTorch custom ops (``torch.ops.dirmult.*``), with autograd, fake kernels for
torch.compile/export, and TorchScript support.
"""
from ._version import __version__
from ._ops import BUILD_INFO, COMPONENTS_WAY, CUDA_KERNELS, OP_CHECKS
from .api import (DirichletMultinomialLogLik, log_lik, log_lik_components,
                  reference_log_lik)
from .regression_api import log_lik_regression
from .distribution import DirichletMultinomial
from .fit import DMFit, fit
from .mixture import DMClassifier, DMMixture, fit_mixture
from .regression import DirichletMultinomialRegression, DMRegressionFit, fit_regression
from .sparse import SparseCounts
from . import datasets, io


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
        return importlib.import_module(f"{__name__}.pyro")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "build_info", "log_lik", "log_lik_components", "log_lik_regression",
           "DirichletMultinomialLogLik", "reference_log_lik", "DirichletMultinomial",
           "fit", "DMFit", "fit_mixture", "DMMixture", "DMClassifier", "datasets", "io",
           "SparseCounts", "fit_regression", "DMRegressionFit", "DirichletMultinomialRegression"]
