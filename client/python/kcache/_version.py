"""The package version (pyproject.toml reads it from here); the same as the
repository's VERSION file, which tests/python/test_package.py checks."""

__version__ = "0.5.0"
