"""streamdedup: a streaming near-duplicate filter (numpy SimHash, LMDB segment index, Kafka service)."""

from __future__ import annotations

from importlib.metadata import version as _version

from .settings import ConfigError, Settings, load_settings

__version__ = _version("streamdedup")

__all__ = [
    "ConfigError",
    "Settings",
    "__version__",
    "load_settings",
]
