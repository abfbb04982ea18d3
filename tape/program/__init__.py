"""Layer ``program``: the Wengert list without tensors.

- :mod:`tape.program.core`: ``Tape`` (buffers, entries, replay entry points, workspaces);
- :mod:`tape.program.replay`: argument checks, guards, replay errors;
- :mod:`tape.program.callbacks`: the protocol of entries that call back into Python;
- :mod:`tape.program.persist`: saving and loading tapes (untrusted input, validated);
- :mod:`tape.program.anomaly`, :mod:`tape.program.dot`, :mod:`tape.program.kernels`: anomaly
  checks, Graphviz printing, the sweeps for user ``@njit`` code.

Imports only from the layers below (layout, ops, interpreter); never from the front end.
"""
