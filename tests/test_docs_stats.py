"""docs/stats.rst lists every ``banker/...`` stats key the code writes, and no other.

Stats are an interface: dashboards, alerts and the demo summary read them by
name, so a key nobody documented is a key nobody can rely on, and a
documented key nothing writes is a dashboard that silently reads zero.

The keys are found in the source, not by running crawls: an AST walk over
``scrapy_banker/`` collects every string constant, f-string or ``+``
concatenation that starts with ``banker/`` (keys are often built in one place
and written in another, e.g. counters the Redis worker batches up), plus the
key argument of every ``inc_value``/``set_value``/``max_value``/``min_value``/
``_count`` call.  A placeholder (``{topic}``) becomes a wildcard, except that
a local variable assigned a string is inlined (``prefix = f"banker/topic/{x}"``
then ``f"{prefix}/slice_s"``) and a function parameter is expanded to the
string constants its call sites pass (``self._count("enqueued", ...)``) when
every call site passes one.  A wildcard is documented only by a ``<name>``
placeholder of a ``.. stat::`` entry; a literal is documented by the same
literal or by a placeholder.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import scrapy_banker

PACKAGE = Path(scrapy_banker.__file__).parent
STATS_RST = PACKAGE.parent / "docs" / "stats.rst"

#: Stands for a value only known at run time (a topic, a resource name...).
WILD = "\x00"
WRITERS = frozenset({"inc_value", "set_value", "max_value", "min_value", "_count"})
#: ``banker/...`` strings that are not stats keys (none so far); add one here
#: with a comment saying what it is rather than documenting it as a stat.
NOT_STATS: frozenset[str] = frozenset()

_Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_MAX_EXPANSIONS = 64


@dataclass
class _ScopeInfo:
    node: _Scope
    module: _ModuleInfo
    #: name -> values of ``name = <expr>``; names bound any other way are absent.
    assigned: dict[str, list[ast.expr]] = field(default_factory=dict)
    #: names bound by something else (loop targets, ``with``, augmented assignment...).
    other: set[str] = field(default_factory=set)
    #: names used inside a string expression: their string values are fragments.
    in_strings: set[str] = field(default_factory=set)


@dataclass
class _ModuleInfo:
    name: str  # path relative to the scanned root's parent, for messages
    tree: ast.Module
    scopes: dict[ast.AST, _ScopeInfo] = field(default_factory=dict)
    scope_of: dict[ast.AST, _ScopeInfo] = field(default_factory=dict)


@dataclass(frozen=True)
class Key:
    pattern: str  # WILD where a run-time value goes
    where: str

    @property
    def readable(self) -> str:
        return self.pattern.replace(WILD, "<*>")


def _is_string_expr(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _is_string_expr(node.left) or (
            isinstance(node.op, ast.Add) and _is_string_expr(node.right)
        )
    return False


def _bound_names(target: ast.AST) -> Iterator[str]:
    """The names an assignment target binds: ``a``, ``a, *b``; not those an
    item or attribute target only reads (``d[(k, w)] = v`` binds no ``k``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _bound_names(element)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


class _Indexer(ast.NodeVisitor):
    """Record each scope's assignments and each node's scope."""

    def __init__(self, module: _ModuleInfo) -> None:
        self.module = module
        self.stack: list[_ScopeInfo] = []

    def _enter(self, node: _Scope) -> None:
        info = _ScopeInfo(node, self.module)
        self.module.scopes[node] = info
        self.stack.append(info)
        self.generic_visit(node)
        self.stack.pop()

    visit_Module = _enter
    visit_FunctionDef = _enter
    visit_AsyncFunctionDef = _enter
    visit_Lambda = _enter

    def visit(self, node: ast.AST) -> None:
        if self.stack:
            self.module.scope_of[node] = self.stack[-1]
        super().visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        scope = self.stack[-1]
        for target in node.targets:
            if isinstance(target, ast.Name):
                scope.assigned.setdefault(target.id, []).append(node.value)
            else:
                scope.other.update(_bound_names(target))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if isinstance(node.target, ast.Name) and node.value is not None:
            self.stack[-1].assigned.setdefault(node.target.id, []).append(node.value)
        self.generic_visit(node)

    def _other(self, target: ast.AST) -> None:
        self.stack[-1].other.update(_bound_names(target))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._other(node.target)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self._other(node.target)
        self.generic_visit(node)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._other(node.target)
        self.generic_visit(node)

    def visit_withitem(self, node: ast.withitem) -> None:
        if node.optional_vars is not None:
            self._other(node.optional_vars)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._other(node.target)
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        for part in node.values:
            if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
                self.stack[-1].in_strings.add(part.value.id)
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if _is_string_expr(node):
            for side in (node.left, node.right):
                if isinstance(side, ast.Name):
                    self.stack[-1].in_strings.add(side.id)
        self.generic_visit(node)


@dataclass
class _Signature:
    params: list[str]
    required: int
    defaults: dict[str, ast.expr]


class StatsKeyFinder:
    """Collect the ``banker/...`` keys written by the modules under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: list[_ModuleInfo] = []
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            module = _ModuleInfo(str(path.relative_to(root.parent)), tree)
            _Indexer(module).visit(module.tree)
            self.modules.append(module)
        self._calls: dict[str, list[tuple[ast.Call, _ScopeInfo]]] = {}
        for module in self.modules:
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Call):
                    name = _callee(node)
                    if name is not None:
                        self._calls.setdefault(name, []).append((node, module.scope_of[node]))

    # -- resolution -------------------------------------------------------------------

    def resolve(self, node: ast.expr, scope: _ScopeInfo, depth: int = 0) -> set[str]:
        """The strings ``node`` can evaluate to, with WILD for run-time values."""
        if depth > 8:
            return {WILD}
        if isinstance(node, ast.Constant):
            return {node.value} if isinstance(node.value, str) else {WILD}
        if isinstance(node, ast.JoinedStr):
            parts: list[set[str]] = []
            for value in node.values:
                if isinstance(value, ast.Constant):
                    parts.append({str(value.value)})
                elif (
                    isinstance(value, ast.FormattedValue)
                    and value.format_spec is None
                    and value.conversion == -1
                ):
                    parts.append(self.resolve(value.value, scope, depth + 1))
                else:
                    parts.append({WILD})
            return _product(parts)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return _product(
                [
                    self.resolve(node.left, scope, depth + 1),
                    self.resolve(node.right, scope, depth + 1),
                ]
            )
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return {
                re.sub(r"%[-+ #0-9.]*[sdirf]", WILD, s)
                for s in self.resolve(node.left, scope, depth + 1)
            }
        if isinstance(node, ast.Name):
            return self._resolve_name(node.id, scope, depth)
        return {WILD}

    def _resolve_name(self, name: str, scope: _ScopeInfo, depth: int) -> set[str]:
        if name in scope.other:
            return {WILD}
        values = scope.assigned.get(name)
        if values:
            out: set[str] = set()
            for value in values:
                out |= self.resolve(value, scope, depth + 1)
            return out
        if (
            isinstance(scope.node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and name in _signature(scope.node).params
        ):
            return self._resolve_param(scope.node, name)
        module_scope = scope.module.scopes[scope.module.tree]
        if scope is not module_scope and name in module_scope.assigned:
            return self._resolve_name(name, module_scope, depth + 1)
        return {WILD}

    def _resolve_param(self, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> set[str]:
        """The string constants every call site of ``func`` passes for ``name``.

        Call sites are found by name and arity across the package, which is
        all an AST can do without types: one non-constant argument, or no
        call site at all, makes the parameter a run-time value.
        """
        sig = _signature(func)
        index = sig.params.index(name)
        values: set[str] = set()
        for call, _ in self._calls.get(func.name, []):
            if any(isinstance(a, ast.Starred) for a in call.args) or any(
                k.arg is None for k in call.keywords
            ):
                return {WILD}
            keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
            n = len(call.args) + len(keywords)
            if not sig.required <= n <= len(sig.params) or not set(keywords) <= set(sig.params):
                continue  # another function of the same name
            if index < len(call.args):
                arg: ast.expr | None = call.args[index]
            else:
                arg = keywords.get(name, sig.defaults.get(name))
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                return {WILD}
            values.add(arg.value)
        return values or {WILD}

    # -- collection -------------------------------------------------------------------

    def find(self) -> list[Key]:
        found: dict[str, Key] = {}
        for module in self.modules:
            for node, scope in self._roots(module):
                for pattern in self._patterns(node, scope):
                    if pattern.startswith("banker/") and pattern not in NOT_STATS:
                        found.setdefault(pattern, Key(pattern, _where(module, node)))
        return sorted(found.values(), key=lambda k: k.pattern)

    def _patterns(self, node: ast.expr, scope: _ScopeInfo) -> set[str]:
        patterns = self.resolve(node, scope)
        # Silently widening to one wildcard could hide keys: say so instead.
        assert len(patterns) <= _MAX_EXPANSIONS, f"{_where(scope.module, node)}: too many keys"
        return patterns

    def _roots(self, module: _ModuleInfo) -> Iterator[tuple[ast.expr, _ScopeInfo]]:
        """Outermost string expressions that are not docstrings or fragments, and writer keys."""
        module_scope = module.scopes[module.tree]
        fragments: set[ast.AST] = set()
        for info in module.scopes.values():
            for name in info.in_strings:
                if name in info.assigned:
                    fragments.update(info.assigned[name])
                elif name not in info.other:  # a module constant used as a prefix
                    fragments.update(module_scope.assigned.get(name, []))
        stack: list[ast.AST] = [module.tree]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # a docstring
            if isinstance(node, ast.Call) and _callee(node) in WRITERS and node.args:
                yield node.args[0], module.scope_of[node]
            if isinstance(node, ast.expr) and _is_string_expr(node):
                if node not in fragments:
                    yield node, module.scope_of[node]
                continue
            stack.extend(ast.iter_child_nodes(node))


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _signature(func: ast.FunctionDef | ast.AsyncFunctionDef) -> _Signature:
    args = func.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    with_defaults = positional[len(positional) - len(args.defaults) :]
    defaults = dict(zip(with_defaults, args.defaults, strict=True))
    is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in func.decorator_list)
    if positional and positional[0] in ("self", "cls") and not is_static:
        positional = positional[1:]
    kwonly = [a.arg for a in args.kwonlyargs]
    defaults.update(
        (a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    )
    params = positional + kwonly
    required = sum(1 for p in params if p not in defaults)
    return _Signature(params, required, defaults)


def _product(parts: Iterable[set[str]]) -> set[str]:
    out = {"".join(combo) for combo in itertools.islice(itertools.product(*parts), 10_000)}
    return {re.sub(f"{WILD}+", WILD, s) for s in out}


def _where(module: _ModuleInfo, node: ast.expr) -> str:
    return f"{module.name}:{node.lineno}"


# -- the docs side ------------------------------------------------------------------------


def documented_stats(rst: str) -> list[str]:
    return re.findall(r"^\.\. stat:: (\S+)\s*$", rst, re.MULTILINE)


def _doc_regex(entry: str) -> re.Pattern[str]:
    """``<name>`` matches one run-time value or one literal path segment; WILD only here."""
    parts = re.split(r"<[^<>/]+>", entry)
    placeholder = f"(?:[^/{WILD}]+|[^/{WILD}]*{WILD}[^/{WILD}]*)"
    return re.compile(placeholder.join(map(re.escape, parts)))


def undocumented(keys: Iterable[Key], entries: Iterable[str]) -> list[Key]:
    regexes = [_doc_regex(e) for e in entries]
    return [k for k in keys if not any(r.fullmatch(k.pattern) for r in regexes)]


def unwritten(keys: Iterable[Key], entries: Iterable[str]) -> list[str]:
    patterns = [k.pattern for k in keys]
    return [e for e in entries if not any(_doc_regex(e).fullmatch(p) for p in patterns)]


# -- tests -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def code_keys() -> list[Key]:
    return StatsKeyFinder(PACKAGE).find()


@pytest.fixture(scope="module")
def doc_entries() -> list[str]:
    return documented_stats(STATS_RST.read_text(encoding="utf-8"))


def test_every_written_stats_key_is_documented(
    code_keys: list[Key], doc_entries: list[str]
) -> None:
    missing = [f"{k.readable}  ({k.where})" for k in undocumented(code_keys, doc_entries)]
    assert missing == [], "add a '.. stat::' entry to docs/stats.rst for each"


def test_every_documented_stats_key_is_written(
    code_keys: list[Key], doc_entries: list[str]
) -> None:
    assert unwritten(code_keys, doc_entries) == []


def test_stats_entries_are_unique(doc_entries: list[str]) -> None:
    assert len(doc_entries) == len(set(doc_entries))


def test_finder_sees_the_keys_the_package_is_known_to_write(code_keys: list[Key]) -> None:
    # The finder has to see through each way the package builds keys.
    patterns = {k.readable for k in code_keys}
    assert {
        "banker/topic/invalid_meta",  # a literal
        "banker/topic/<*>/requests",  # an f-string
        "banker/admission/deferred/<*>",  # a parameter some call site passes a variable for
        "banker/task/reclaimed_timeout",  # a parameter every call site passes a constant for
        "banker/redis/worker_errors",  # batched by the Redis worker, written later
    } <= patterns


FAKE_MODULE = '''
"""banker/not/a/key: docstrings are not keys."""

PREFIX = "banker/fake"


class Fake:
    def count(self, kind, n=1):
        self._keys[(kind, n)] = kind  # an item target binds no name: kind stays a parameter
        self.stats.inc_value(f"banker/fake/{kind}/total", n)

    def run(self, topic, what):
        self.count("started")
        self.count("stopped", 2)
        prefix = f"banker/fake/{topic}"
        self.stats.set_value(f"{prefix}/depth", 1)
        self.stats.max_value(PREFIX + "/peak", 3)
        self.stats.inc_value("banker/fake/%s/pct" % what)
        self._counters["banker/fake/batched"] = 1
'''


def test_finder_resolves_constants_parameters_and_fragments(tmp_path: Path) -> None:
    (tmp_path / "fake.py").write_text(FAKE_MODULE)
    patterns = {k.readable for k in StatsKeyFinder(tmp_path).find()}
    assert patterns == {
        "banker/fake/started/total",
        "banker/fake/stopped/total",
        "banker/fake/<*>/depth",
        "banker/fake/peak",
        "banker/fake/<*>/pct",
        "banker/fake/batched",
    }


def test_an_undocumented_key_is_reported(tmp_path: Path) -> None:
    (tmp_path / "fake.py").write_text(FAKE_MODULE)
    keys = StatsKeyFinder(tmp_path).find()
    entries = [
        "banker/fake/started/total",
        "banker/fake/<kind>/total",
        "banker/fake/<topic>/depth",
        "banker/fake/peak",
        "banker/fake/<what>/pct",
        "banker/fake/never/written",
    ]
    # "batched" is missing from the docs; "stopped" is covered by <kind>.
    assert [k.readable for k in undocumented(keys, entries)] == ["banker/fake/batched"]
    assert unwritten(keys, entries) == ["banker/fake/never/written"]
    # A run-time value is documented by a placeholder only, never by a literal.
    assert [k.readable for k in undocumented(keys, ["banker/fake/x/depth"])] != []
