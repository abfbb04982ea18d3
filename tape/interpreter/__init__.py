"""Layer ``interpreter``: the op-agnostic sweeps over a tape, above the instruction set.

- :mod:`tape.interpreter.dispatch`: the address tables the sweeps call each entry's kernel
  through, filled lazily per op and dtype (``prepare``);
- :mod:`tape.interpreter.warm`: helper processes that compile kernels into Numba's cache;
- :mod:`tape.interpreter.drivers`: the drivers' source (forward + backward, checks, batches);
- :mod:`tape.interpreter.codegen` and :mod:`tape.interpreter.specialize`: the generator of
  ``tape/interpreter/generated/`` (one module per op, and the sweeps);
- ``generated/``: GENERATED code, never edited by hand.

Imports only from :mod:`tape.layout` and :mod:`tape.ops`.
"""
