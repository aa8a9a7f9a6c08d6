"""The ops' Python side: the native libraries (``library``), the argument
checks in Python (``checks``), the one door to torch's private dispatcher
APIs (``dispatch``), and per op family its fake kernels, autograd formula and
eager call side by side (``dense``, ``components``, ``csr``, ``regression``,
``second_derivatives``), and their forms under the torch.func transforms
(``transforms``). Importing the package registers them all."""
from . import components, csr, dense, library, regression, second_derivatives, transforms  # noqa: F401
