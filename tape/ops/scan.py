"""Scans and selection along an axis (cumulative sums, sorting permutations)."""
