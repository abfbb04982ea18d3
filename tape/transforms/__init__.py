"""Layer ``transforms``: what a program gives beyond its gradient.

- :mod:`tape.transforms.derivatives`: JVPs, VJPs, Jacobians, Hessians and HVPs of a tape;
- :mod:`tape.transforms.sparse`: sparsity patterns and colourings;
- :mod:`tape.transforms.batch`: one tape replayed over a batch of inputs.

Imports only from the compiler layer and below; never from the front end.
"""
