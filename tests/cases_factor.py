"""KERNEL_CASES of the factorisation ops (merged into tests/test_ops.py)."""

CASES = {}
