"""One generated module per op (see :mod:`tape._codegen`), imported on first use."""
