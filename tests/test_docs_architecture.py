"""docs/architecture.rst is true to the code: every module it names exists, and it
names every pure core module (``core/`` and ``net/``) and every scheduler part."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scrapy_banker"
PAGE = (ROOT / "docs" / "architecture.rst").read_text()
#: ``core/frontier``, ``scheduler/wire``, ``redis/keys.py``, ``lua/charge.lua``...
NAMED = re.compile(r"``((?:core|net|scheduler|redis|ops|testing|lua)/[a-z_]+)(?:\.py|\.lua)?``")


def _named() -> set[str]:
    return {m.group(1) for m in NAMED.finditer(PAGE)}


def _exists(name: str) -> bool:
    folder, _, module = name.partition("/")
    if folder == "lua":
        return (PACKAGE / "redis" / "lua" / f"{module}.lua").is_file()
    base = PACKAGE / folder
    return (base / f"{module}.py").is_file() or (base / module / "__init__.py").is_file()


def test_every_module_the_page_names_exists() -> None:
    named = _named()
    assert len(named) > 30  # the pattern finds the page's names
    missing = sorted(n for n in named if not _exists(n))
    assert not missing, f"docs/architecture.rst names modules that do not exist: {missing}"


def test_the_page_names_every_core_module_and_every_scheduler_part() -> None:
    named = _named()
    # ``net/gnp`` / ``net/netstats`` share a row; both are matched.
    wanted = {
        f"{folder}/{path.stem}"
        for folder in ("core", "net", "scheduler")
        for path in (PACKAGE / folder).glob("*.py")
        if path.stem != "__init__"
    }
    absent = sorted(wanted - named)
    assert not absent, f"docs/architecture.rst does not name: {absent}"
