"""Layer ``frontend``: what users write, PyTorch- and NumPy-style.

``Tensor``, grad modes and the recording engine (:mod:`tape.frontend.tensor`), the op front
ends (:mod:`tape.frontend.ops`), the functions (:mod:`tape.frontend.functional`,
:mod:`tape.frontend.linalg`), ``record`` and the JAX-style transforms, ``autograd``, custom
ops, checkpoints, distributed replay, ``nn`` and ``optim``. Their public names are the
package's (``tape.nn``, ``tape.optim``, ...: see :mod:`tape._aliases`).
"""
