"""Sphinx configuration for scrapy-banker."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
sys.path.insert(0, os.path.abspath("_ext"))

project = "scrapy-banker"
author = "scrapy-banker contributors"
copyright = "2026, scrapy-banker contributors"
release = "0.1.0.dev0"

extensions = ["sphinx.ext.autodoc", "bankerdocs", "bankerverbs"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []
