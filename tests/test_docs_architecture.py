"""docs/architecture.rst is true to the code: every module it names exists, and it
names every pure core module (``core/`` and ``net/``), every scheduler part and
every module of the fleet (``redis/``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "scrapy_banker"
PAGE = (ROOT / "docs" / "architecture.rst").read_text()
#: ``core/frontier``, ``scheduler/wire``, ``redis/keys.py``, ``lua/charge.lua``...
NAMED = re.compile(
    r"``((?:core|net|scheduler|redis|ops|testing|lua)(?:/[a-z_]+)+)(?:\.py|\.lua|/)?``"
)


#: Scrapy's stats keys, which read like module paths.
STATS = re.compile(r"scheduler/(enqueued|dequeued)(/|$)")


def _named() -> set[str]:
    return {m.group(1) for m in NAMED.finditer(PAGE) if not STATS.match(m.group(1))}


def _exists(name: str) -> bool:
    folder, _, module = name.partition("/")
    if folder == "lua":
        return (PACKAGE / "redis" / "lua" / f"{module}.lua").is_file()
    path = PACKAGE / name
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _name(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return "/".join(rel.parent.parts if rel.name == "__init__.py" else rel.with_suffix("").parts)


def test_every_module_the_page_names_exists() -> None:
    named = _named()
    assert len(named) > 30  # the pattern finds the page's names
    missing = sorted(n for n in named if not _exists(n))
    assert not missing, f"docs/architecture.rst names modules that do not exist: {missing}"


def test_the_page_names_every_core_scheduler_and_fleet_module() -> None:
    named = _named()
    # ``net/gnp`` / ``net/netstats`` share a row; both are matched.
    wanted = {
        _name(path)
        for folder in ("core", "net", "scheduler")
        for path in (PACKAGE / folder).glob("*.py")
        if path.stem != "__init__"
    }
    wanted |= {_name(path) for path in (PACKAGE / "redis").rglob("*.py")} - {"redis"}
    absent = sorted(wanted - named)
    assert not absent, f"docs/architecture.rst does not name: {absent}"
