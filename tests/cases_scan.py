"""KERNEL_CASES of the scan and selection ops (merged into tests/test_ops.py)."""

CASES = {}
