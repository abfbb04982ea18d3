"""Matrix factorisations and the solves built on them."""
