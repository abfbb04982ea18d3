"""``python -m tape.bench``: tape against a hand-written Numba gradient and the installed peers
(JAX, PyTorch, HIPS autograd, Dr.Jit, CasADi) on Rosenbrock, two MLPs, the lesson's linear
regression and the ADBench problems (GMM, bundle adjustment, LSTM), a tape's gradient inside a
user's ``@njit`` loop, and derivatives beyond the gradient.

Run ``python -m tape.bench --help`` for the options; :func:`main` is the same from Python.
"""

from tape.bench.cli import main, problems

__all__ = ["main", "problems"]
