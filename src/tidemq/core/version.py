"""The package version (kept in core so every layer can report it)."""

__version__ = "0.1.0"
