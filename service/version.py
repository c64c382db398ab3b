"""The package version, read once from the installed distribution's metadata."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "private-data-enclave"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
