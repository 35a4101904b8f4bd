"""The one error of the configuration."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, phrased for the person who edits config.toml."""
