"""The failure every command raises for a reason the user can act on."""

from __future__ import annotations


class CommandError(Exception):
    """A command could not do its job for a reason the user can act on (exit code 1)."""
