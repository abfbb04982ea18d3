"""Validation of tapes that come from outside (files, pickles, arrays): see :func:`check_tape`."""

from __future__ import annotations


def check_tape(t) -> None:
    """Raise ``ValueError`` naming what is wrong if ``t``'s arrays could make compiled code
    read or write outside them; return ``None`` for a valid tape."""
