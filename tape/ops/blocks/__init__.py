"""One codec per attribute block: the layout of the integers an entry's op reads from the pool
at ``entries[i, E_ATTR]``, written down once.

Each module holds the block's encoder (used by the front end when it records), its decoder
(validation of loaded tapes, the compiled tier) and the positions of its fields as plain
functions of ints, which the CPU kernels compile with Numba and the GPU kernels as device
functions. Nothing outside ``tape/ops`` indexes a block by hand (``tests/test_layers.py``).
"""
