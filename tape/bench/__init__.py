"""``python -m tape.bench``: tape against a hand-written Numba gradient and the installed peers
(JAX, PyTorch, HIPS autograd) on Rosenbrock, two MLPs, the lesson's linear regression and the
ADBench problems (GMM, bundle adjustment, LSTM).

Run ``python -m tape.bench --help`` for the options; :func:`main` is the same from Python.
"""

from tape.bench.cli import main, problems

__all__ = ["main", "problems"]
