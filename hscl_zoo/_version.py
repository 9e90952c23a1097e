"""The package version, in one place: pyproject.toml reads it, and the Hub client reports it."""

__version__ = "0.1.0"
