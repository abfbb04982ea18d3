"""Layer ``compiler``: the compiled tier, a tape turned into fused, specialised Numba code
(:mod:`tape.compiler.compiled`). Imports only from the program layer and below."""
