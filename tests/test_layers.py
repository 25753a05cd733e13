"""The pure cores stay pure, and every request.meta key is declared in one place.

The cores (hashing, the directory, the frontier, the Banker's state, GNP,
placement...) are the parts worth reusing and benchmarking on their own; they
stay importable and testable without Scrapy's start-up cost or a reactor only
as long as nothing drags Scrapy, Twisted or Redis in -- directly, or through
another scrapy_banker module.  Each core is imported in a fresh interpreter,
which catches transitive imports, and its source is scanned for import
statements anywhere (a lazy import inside a function, a ``TYPE_CHECKING``
block), which the runtime check cannot see.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import scrapy_banker
from scrapy_banker import meta

PACKAGE = Path(scrapy_banker.__file__).parent
DOCS = PACKAGE.parent / "docs"
FORBIDDEN = ("scrapy", "twisted", "redis")

CORES = (
    "hashing",
    "directory",
    "topics",
    "frontier",
    "banker",
    "gnp",
    "netstats",
    "assignment",
    "partitions",
    "placement",
    "meta",
    "telemetry",
    "fleetmodel",
    "journal",
)

_PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})))
"""


def forbidden_loaded(module: str, cwd: Path | None = None) -> list[str]:
    """Scrapy/Twisted/Redis modules in ``sys.modules`` after importing ``module`` afresh."""
    code = _PROBE.format(forbidden=set(FORBIDDEN))
    out = subprocess.run(
        [sys.executable, "-c", code, module], capture_output=True, text=True, check=True, cwd=cwd
    ).stdout
    loaded: list[str] = json.loads(out.strip().splitlines()[-1])
    return loaded


def forbidden_imports(path: Path) -> list[str]:
    """``file:line module`` of every import statement of a forbidden package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{path.name}:{node.lineno} {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    return found


@pytest.mark.parametrize("core", CORES)
def test_core_imports_nothing_from_scrapy_twisted_or_redis(core: str) -> None:
    assert forbidden_loaded(f"scrapy_banker.{core}") == []
    assert forbidden_imports(PACKAGE / f"{core}.py") == []


def test_detectors_flag_a_module_that_imports_scrapy(tmp_path: Path) -> None:
    # Without this, a probe that silently saw nothing would pass every core.
    assert "scrapy" in forbidden_loaded("scrapy_banker.serialize")
    assert any(f.endswith(" scrapy.http") for f in forbidden_imports(PACKAGE / "serialize.py"))
    # A module that reaches Scrapy only through another scrapy_banker module:
    # its own imports look clean, the fresh interpreter still sees Scrapy.
    (tmp_path / "innocent.py").write_text("from scrapy_banker import serialize\n")
    assert forbidden_imports(tmp_path / "innocent.py") == []
    assert "scrapy" in forbidden_loaded("innocent", cwd=tmp_path)


def test_interpreter_starts_without_forbidden_modules() -> None:
    # A .pth file or sitecustomize importing Scrapy would make every core fail.
    assert forbidden_loaded("json") == []


# -- request.meta keys --------------------------------------------------------------

_META_KEY = re.compile(r"banker_[a-z0-9_]+")
#: ``banker_*`` strings that are not request.meta keys, and what they are.
NOT_REQUEST_META = {
    "banker_setting": "key of a dataclass field's metadata in scrapy_banker/settings.py",
}


def meta_literals() -> dict[str, list[str]]:
    """Every string constant of the package that is exactly a ``banker_*`` name."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _META_KEY.fullmatch(node.value)
            ):
                where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                found.setdefault(node.value, []).append(where)
    return found


def test_every_banker_meta_key_is_declared_in_the_meta_module() -> None:
    undeclared = {
        k: v
        for k, v in meta_literals().items()
        if k not in meta.ALL_KEYS and k not in NOT_REQUEST_META
    }
    assert undeclared == {}, (
        "declare these in scrapy_banker/meta.py and docs/reference/meta.rst "
        "(or, if they are not request.meta keys, in NOT_REQUEST_META here)"
    )


def test_meta_module_groups_are_consistent() -> None:
    assert len(set(meta.ALL_KEYS)) == len(meta.ALL_KEYS)
    assert set(meta.USER_KEYS).isdisjoint(meta.INTERNAL_KEYS)
    assert set(meta.TRANSIENT_KEYS) <= set(meta.ALL_KEYS)
    constants = {v for k, v in vars(meta).items() if k.startswith("META_")}
    assert constants == set(meta.ALL_KEYS)


def test_every_meta_key_has_a_reference_entry() -> None:
    page = (DOCS / "reference" / "meta.rst").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\.\. _meta-(banker_[a-z0-9_]+):$", page, re.MULTILINE))
    assert documented == set(meta.ALL_KEYS)


def test_starting_a_worker_does_not_import_scipy() -> None:
    # scipy.optimize costs ~0.45 s of CPU to import; every worker names the
    # placement modes (BANKER_PLACEMENT is validated against the strategies'
    # registry), but only a placement plan needs a solver.  Four workers
    # starting on two cores lost ~1 s before their first request to it.
    code = (
        "import sys\n"
        "import scrapy_banker.redis.scheduler, scrapy_banker.addon\n"
        "from scrapy_banker import placement, settings\n"
        "assert 'hash' in placement.MODES\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"
    # ... and a plan still finds its solver.
    from scrapy_banker import assignment

    rows, cols = assignment.solve([[2.0, 1.0], [1.0, 3.0]])
    assert list(cols[rows.argsort()]) == [1, 0]
