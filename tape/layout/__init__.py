"""Layer ``layout``, the bottom: the tape's data model as plain integers and options.

- :mod:`tape.layout.columns`: entry and buffer columns, buffer kinds, ``CALLBACK``;
- :mod:`tape.layout.config`: Numba options shared by every compiled function;
- :mod:`tape.layout.source`: where in the user's code an entry was recorded;
- :mod:`tape.layout.fingerprint`: fingerprints of the sources the generated modules compile in.

Imports nothing from the package above it (``ARCHITECTURE.md`` lists the layers).
"""
