"""One generated module per op (see :mod:`tape.interpreter.codegen`), imported on first use."""
