"""scrapy-banker: scheduling components for Scrapy and scrapy-redis crawls."""

from __future__ import annotations

__version__ = "0.1.0.dev0"

__all__ = ["Addon", "__version__"]


def __getattr__(name: str) -> object:
    # The add-on pulls in Scrapy; importing it lazily keeps the pure cores
    # (hashing, directory, banker, ...) importable without Scrapy's start-up cost.
    if name == "Addon":
        from scrapy_banker.addon import Addon

        return Addon
    raise AttributeError(f"module 'scrapy_banker' has no attribute {name!r}")
