"""The layers stay layers, the pure cores stay pure, every request.meta key is declared.

The package's folders are its layers (``docs/architecture.rst``), from the
bottom: ``core/`` and ``net/`` (pure algorithms), ``settings``,
``scheduler/`` (the Scrapy adapter), ``redis/`` (the fleet), ``ops/``
(commands, dashboard, metrics, read models); the public Scrapy-facing
modules at the root (add-on, middlewares, extensions) and ``testing/`` sit
on top.  A module imports only from its own layer and the ones below.

The pure folders are checked twice: each module is imported in a fresh
interpreter (which catches transitive imports), and its source is scanned
for import statements anywhere (a lazy import inside a function, a
``TYPE_CHECKING`` block), which the runtime check cannot see.  The lists
come from the folders, so a new core is checked the day it is added.
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
from scrapy_banker.core import meta

PACKAGE = Path(scrapy_banker.__file__).parent
DOCS = PACKAGE.parent / "docs"
FORBIDDEN = ("scrapy", "twisted", "redis")
PURE = ("core", "net")

#: Layer of each top-level name of the package, bottom first; a module may
#: import its own layer and those with a lower rank.
LAYERS = {
    "errors": 0, "core": 0, "net": 1, "settings": 2, "scheduler": 3, "redis": 4, "ops": 5,
    "addon": 6, "middlewares": 6, "extensions": 6, "testing": 7,
}  # fmt: skip


#: Sub-layers of ``redis/``, bottom first: the keyspace, script runner and
#: connection; the frontier's operations on Redis (partitions, registry,
#: control document); the worker thread that runs them; the Scrapy-facing
#: lease store; the scheduler users name.  The three lowest import nothing
#: from Scrapy or Twisted.
REDIS_SUBLAYERS = {
    "keys": 0, "scripts": 0, "connection": 0, "frontier": 1, "worker": 2, "store": 3,
    "scheduler": 4,
}  # fmt: skip
REDIS_SCRAPY_FREE = ("keys", "scripts", "connection", "frontier", "worker")


def _modules(folder: str) -> list[str]:
    return sorted(
        "scrapy_banker." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in (PACKAGE / folder).rglob("*.py")
        if p.name != "__init__.py"
    )


CORES = [m for folder in PURE for m in _modules(folder)]

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


def _imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            if node.module == "scrapy_banker":
                out += [(node.lineno, f"scrapy_banker.{a.name}") for a in node.names]
    return out


def forbidden_imports(path: Path) -> list[str]:
    """``file:line module`` of every import statement of a forbidden package."""
    return [
        f"{path.name}:{line} {name}"
        for line, name in _imports(path)
        if name.split(".")[0] in FORBIDDEN
    ]


def test_the_pure_folders_hold_the_cores() -> None:
    assert "scrapy_banker.core.frontier" in CORES and "scrapy_banker.net.gnp" in CORES
    assert len(CORES) >= 15


@pytest.mark.slow  # a fresh interpreter per core
@pytest.mark.parametrize("core", CORES)
def test_core_imports_nothing_from_scrapy_twisted_or_redis(core: str) -> None:
    assert forbidden_loaded(core) == []
    path = PACKAGE.joinpath(*core.split(".")[1:]).with_suffix(".py")
    assert forbidden_imports(path) == []


def _rank(parts: list[str]) -> tuple[int, int] | None:
    """(layer, sub-layer) of a module given by its names under the package."""
    if not parts or parts[0] not in LAYERS:
        return None
    if parts[0] != "redis" or len(parts) < 2:
        return LAYERS[parts[0]], 0 if parts[0] != "redis" else 9
    return LAYERS["redis"], REDIS_SUBLAYERS[parts[1]]


def _layer(module: str) -> tuple[int, int] | None:
    parts = module.split(".")
    if parts[0] != "scrapy_banker" or len(parts) < 2:
        return None
    return _rank(parts[1:])


def _own(rel: Path) -> tuple[int, int] | None:
    parts = [p.removesuffix(".py") for p in rel.parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return _rank(parts)


def test_every_module_imports_only_its_layer_and_below() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        own = _own(rel)
        if own is None:  # the package's __init__ (the add-on's export)
            continue
        for line, name in _imports(path):
            layer = _layer(name)
            if layer is not None and layer > own:
                wrong.append(f"{rel}:{line} imports {name}")
    assert wrong == []


def test_every_redis_module_has_a_sub_layer() -> None:
    names = {p.name.removesuffix(".py") for p in (PACKAGE / "redis").iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}  # fmt: skip
    assert names - {"__init__"} == set(REDIS_SUBLAYERS)


def test_the_lower_redis_sub_layers_import_nothing_from_scrapy_or_twisted() -> None:
    found = []
    for name in REDIS_SCRAPY_FREE:
        folder = PACKAGE / "redis" / name
        paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
        for path in paths:
            found += [
                f"{path.relative_to(PACKAGE)}:{line} {module}"
                for line, module in _imports(path)
                if module.split(".")[0] in ("scrapy", "twisted")
                or module.startswith(("scrapy_banker.scheduler", "scrapy_banker.ops"))
            ]
    assert found == []


def test_no_two_modules_share_a_file_name() -> None:
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    assert {n: p for n, p in seen.items() if len(p) > 1} == {}


def test_every_folder_and_root_module_has_a_layer() -> None:
    names = {p.name.removesuffix(".py") for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}  # fmt: skip
    assert names - {"__init__"} == set(LAYERS)


@pytest.mark.slow
def test_detectors_flag_a_module_that_imports_scrapy(tmp_path: Path) -> None:
    # Without this, a probe that silently saw nothing would pass every core.
    assert "scrapy" in forbidden_loaded("scrapy_banker.scheduler.serialize")
    serialize = PACKAGE / "scheduler" / "serialize.py"
    assert any(f.endswith(" scrapy.http") for f in forbidden_imports(serialize))
    # A module that reaches Scrapy only through another scrapy_banker module:
    # its own imports look clean, the fresh interpreter still sees Scrapy.
    (tmp_path / "innocent.py").write_text("from scrapy_banker.scheduler import serialize\n")
    assert forbidden_imports(tmp_path / "innocent.py") == []
    assert "scrapy" in forbidden_loaded("innocent", cwd=tmp_path)


@pytest.mark.slow
def test_interpreter_starts_without_forbidden_modules() -> None:
    # A .pth file or sitecustomize importing Scrapy would make every core fail.
    assert forbidden_loaded("json") == []


# -- request.meta keys --------------------------------------------------------------

_META_KEY = re.compile(r"banker_[a-z0-9_]+")
#: ``banker_*`` strings that are not request.meta keys, and what they are.
NOT_REQUEST_META = {
    "banker_setting": "key of a dataclass field's metadata in scrapy_banker/settings.py",
    "banker_crawl_budget": "the close reason once the crawl budget is spent (every mode)",
    "banker_budget": "the close reason of a crawl ending with requests held over a budget",
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
        "declare these in scrapy_banker/core/meta.py and docs/reference/meta.rst "
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


@pytest.mark.slow
def test_starting_a_worker_does_not_import_scipy() -> None:
    # scipy.optimize costs ~0.45 s of CPU to import; every worker names the
    # placement modes (BANKER_PLACEMENT is validated against the strategies'
    # registry), but only a placement plan needs a solver.  Four workers
    # starting on two cores lost ~1 s before their first request to it.
    code = (
        "import sys\n"
        "import scrapy_banker.redis.scheduler, scrapy_banker.addon\n"
        "from scrapy_banker import settings\n"
        "from scrapy_banker.net import placement\n"
        "assert 'hash' in placement.MODES\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"
    # ... and a plan still finds its solver.
    from scrapy_banker.net import assignment

    rows, cols = assignment.solve([[2.0, 1.0], [1.0, 3.0]])
    assert list(cols[rows.argsort()]) == [1, 0]
