"""The op families. Importing this package fills :mod:`tape.registry`; the import order below
fixes the op codes (the generated sweeps are regenerated when it changes)."""

from tape.ops import elementwise, linalg, movement, reduce, guard, scan, factor  # noqa: F401, I001
from tape.ops import scatter, spectral, nn  # noqa: F401, I001
