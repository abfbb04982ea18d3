"""Front ends of the structural ops: argument handling, attribute blocks and the entries they
record (:func:`tape.frontend.tensor.apply`), above the kernels in :mod:`tape.ops`. The public
functions are exported by :mod:`tape.functional`."""
