"""The crawl's Redis key names: pinned here, since renaming one strands a live crawl's data."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

import scrapy_banker
from scrapy_banker.net.netstats import LinkStats
from scrapy_banker.redis.frontier import RedisFrontier
from scrapy_banker.redis.frontier.registry import NodeRegistry
from scrapy_banker.redis.keys import (
    BUDGET_FIELDS,
    DELIVERIES,
    HOST_PAGES,
    META_FIELDS,
    QUEUED,
    HashField,
    Keyspace,
    PartitionKeys,
    decode,
)
from scrapy_banker.settings import load_placement_config

PREFIX = "banker:shop"


def test_every_key_name_is_the_one_a_running_fleet_uses() -> None:
    keys = Keyspace(PREFIX, 16)
    assert keys.partition(3) == PartitionKeys(
        levels="{banker:shop:3}:lv",
        leases="{banker:shop:3}:leases",
        payloads="{banker:shop:3}:payloads",
        meta="{banker:shop:3}:meta",
        owner="{banker:shop:3}:owner",
        dead="{banker:shop:3}:dead",
        seen="{banker:shop:3}:seen",
        bloom="{banker:shop:3}:bloom",
        hosts="{banker:shop:3}:hosts",
        over="{banker:shop:3}:over",
        revisits="{banker:shop:3}:revisits",
        revisit_requests="{banker:shop:3}:revisit-requests",
        revisit_due="{banker:shop:3}:revisit-due",
    )
    assert keys.partition(3).level(-2) == "{banker:shop:3}:lv:-2"
    assert (keys.nodes, keys.heartbeats, keys.table) == (
        "banker:shop:nodes",
        "banker:shop:heartbeats",
        "banker:shop:table",
    )
    assert (keys.rebalance_lock, keys.reaper_lock) == (
        "banker:shop:rebalance-lock",
        "banker:shop:reaper-lock",
    )
    assert (keys.sites, keys.schemes) == ("banker:shop:sites", "banker:shop:schemes")
    assert (keys.net_bs, keys.net_placed, keys.net_backlog, keys.plan_gate) == (
        "banker:shop:net:bs",
        "banker:shop:net:placed",
        "banker:shop:net:backlog",
        "banker:shop:net:plan-gate",
    )
    assert keys.rtt("n1") == "banker:shop:net:rtt:n1"
    assert keys.bw("n1") == "banker:shop:net:bw:n1"
    assert keys.bs_probe("n1") == "banker:shop:net:bs-probe:n1"
    # Expiring, per origin: a flush leaves them (robots.txt is no crawl state).
    assert keys.robots("https://a.test:8443") == "banker:shop:robots:https://a.test:8443"
    assert keys.robots_lock("http://a.test") == "banker:shop:robots-lock:http://a.test"
    assert (keys.control, keys.control_log, keys.known_hosts, keys.budget) == (
        "banker:shop:control",
        "banker:shop:control:log",
        "banker:shop:known-hosts",
        "banker:shop:budget",
    )
    assert keys.known_topics == "banker:shop:known-topics"


def test_a_partitions_keys_share_one_slot_and_partitions_spread() -> None:
    keys = Keyspace(PREFIX, 64)
    slots = []
    for p in range(64):
        names = keys.partition(p).names()
        assert len(names) == 13
        # The level lists too: the scripts name them from the levels key.
        names += (keys.partition(p).level(0), keys.partition(p).level(-7))
        assert len({key_slot(n.encode()) for n in names}) == 1
        slots.append(key_slot(names[0].encode()))
    assert len(set(slots)) > 32  # different tags, different slots


def test_cleared_is_the_whole_crawl_but_the_network_measurements() -> None:
    keys = Keyspace(PREFIX, 4)
    cleared = list(keys.cleared())
    assert len(cleared) == len(set(cleared)) == 4 * 13 + 15
    for p in range(4):
        assert set(keys.partition(p).names()) <= set(cleared)
    assert {
        keys.nodes,
        keys.heartbeats,
        keys.table,
        keys.rebalance_lock,
        keys.reaper_lock,
        keys.sites,
        keys.schemes,
        keys.net_placed,
        keys.net_backlog,
        keys.plan_gate,
        keys.control,
        keys.known_hosts,
        keys.known_topics,
        keys.budget,
    } <= set(cleared)
    # Links do not change between crawls: a re-crawl places its sites at once.
    # The operators' log is the record of who did what.
    assert not {keys.net_bs, keys.rtt("n1"), keys.bw("n1"), keys.control_log} & set(cleared)
    assert not any(":net:rtt:" in k or ":net:bw:" in k for k in cleared)


@pytest.mark.parametrize(
    ("prefix", "partitions", "match"),
    [
        ("", 8, "non-empty"),
        ("a{b", 8, "braces"),
        ("a}b", 8, "braces"),
        ("a", 0, "partitions must be an integer >= 1"),
        ("a", True, "partitions must be an integer >= 1"),
        ("a", 2.0, "partitions must be an integer >= 1"),
    ],
)
def test_bad_keyspaces(prefix: str, partitions: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Keyspace(prefix, partitions)


@pytest.mark.parametrize("partition", [-1, 8, 99])
def test_partitions_out_of_range_have_no_keys(partition: int) -> None:
    with pytest.raises(ValueError, match=r"partition must be in \[0, 8\)"):
        Keyspace("a", 8).partition(partition)


def test_decode_is_strict_unless_asked_to_be_lossy() -> None:
    assert decode(b"caf\xc3\xa9") == "café"
    assert decode("already text") == "already text"
    assert decode(42) == "42"
    with pytest.raises(UnicodeDecodeError):
        decode(b"\x80pickle")
    assert decode(b"\x80pickle", lossy=True) == "\ufffdpickle"


@pytest.mark.slow  # a real redis-server
def test_frontier_registry_and_placement_share_one_keyspace(redis_client: redis.Redis) -> None:
    from scrapy_banker.redis.worker.placement_agent import PlacementAgent

    frontier = RedisFrontier(redis_client, prefix=PREFIX, partitions=16)
    registry = NodeRegistry(redis_client, frontier)
    config = load_placement_config({"BANKER_PLACEMENT": "top1"})
    agent = PlacementAgent(redis_client, frontier.keyspace, "n1", config, LinkStats())
    assert registry.keyspace is frontier.keyspace is agent.keyspace
    assert frontier.keys(3) == frontier.keyspace.partition(3)
    assert (registry.table_key, registry.lock_key) == (
        frontier.keyspace.table,
        frontier.keyspace.rebalance_lock,
    )
    # A bare prefix names the same keys.
    by_prefix = PlacementAgent(redis_client, PREFIX, "n1", config, LinkStats())
    assert by_prefix.prefix == agent.prefix == PREFIX
    for name in ("sites_key", "schemes_key", "bs_key", "placed_key", "plan_key", "backlog_key"):
        assert getattr(by_prefix, name) == getattr(agent, name)
    assert by_prefix.rtt_key("b") == agent.rtt_key("b") == frontier.keyspace.rtt("b")
    assert by_prefix.bw_key("b") == agent.bw_key("b") == frontier.keyspace.bw("b")


# -- the fields of the hashes the scripts keep ------------------------------------------
PACKAGE = Path(scrapy_banker.__file__).parent
LUA = PACKAGE / "redis" / "lua"
DOCS = PACKAGE.parent / "docs" / "reference" / "distributed.rst"

#: Per script, the key expressions that name a hash whose fields are
#: declared: the partition's meta (or, for enqueue's KEYS[6], the hash that
#: keeps a bit array's geometry: the same ``bf`` fields) and the crawl-wide
#: budget hash -- numbered as each script's header comment numbers its KEYS.
#: The shared pieces (``_*.lua``) name them by their parameters, and
#: charge.lua by a local.  A literal field on a key not named here fails
#: the tests below: a new script (or key) is added here.
HASHES: dict[str, dict[str, str]] = {
    "ack": {"KEYS[3]": "meta", "KEYS[4]": "budget"},
    "charge": {"KEYS[2]": "meta", "global": "budget"},
    "count": {"KEYS[i]": "meta"},
    "deadletter": {"KEYS[3]": "meta"},
    "enqueue": {"KEYS[4]": "meta", "KEYS[6]": "meta"},
    "hosts": {"KEYS[3]": "meta"},
    "nack": {"KEYS[3]": "meta"},
    "pop": {"KEYS[4]": "meta"},
    "purge": {"KEYS[2]": "meta"},
    "reap": {"KEYS[4]": "meta"},
    "release": {"KEYS[2]": "meta"},
    "requeue": {"KEYS[3]": "meta"},
    "start": {"KEYS[1]": "meta"},
}
PIECES = {"meta": "meta", "global": "budget"}
DECLARED = {"meta": META_FIELDS, "budget": BUDGET_FIELDS}
#: Hash commands -> which of their arguments after the key are fields.
READS = {"HGET": "first", "HEXISTS": "first", "HMGET": "all"}
WRITES = {"HINCRBY": "first", "HDEL": "all", "HSET": "pairs"}


@dataclass(frozen=True)
class Use:
    """One field a script names in a hash command."""

    script: str
    command: str
    hash: str  # "meta", "budget" or the key expression of an undeclared hash
    field: str  # "n" (a literal) or "d:" (a prefix: "d:" .. id)
    family: bool

    @property
    def writes(self) -> bool:
        return self.command in WRITES


def _code(text: str) -> str:
    """``text`` without its ``--`` comments (strings kept whole)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            j = i + 1
            while text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("--", i):
            i = text.find("\n", i)
            i = len(text) if i < 0 else i
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _calls(code: str) -> list[list[str]]:
    """The arguments of every ``redis.call``/``redis.pcall``, split at top-level commas."""
    calls = []
    for match in re.finditer(r"redis\.p?call\(", code):
        args, current, depth, i = [], [], 1, match.end()
        while True:
            ch = code[i]
            if ch in "\"'":
                j = i + 1
                while code[j] != ch:
                    j += 2 if code[j] == "\\" else 1
                current.append(code[i : j + 1])
                i = j + 1
                continue
            depth += ch in "([{"
            depth -= ch in ")]}"
            if depth == 0:
                break
            if ch == "," and depth == 1:
                args.append("".join(current).strip())
                current = []
            else:
                current.append(ch)
            i += 1
        args.append("".join(current).strip())
        calls.append(args)
    return calls


def _uses(script: str, code: str, hashes: dict[str, str]) -> list[Use]:
    uses = []
    for args in _calls(code):
        command = args[0].strip("\"'").upper()
        if command not in READS and command not in WRITES:
            continue
        key, rest = args[1], args[2:]
        which = READS.get(command) or WRITES[command]
        fields = rest[:1] if which == "first" else rest[::2] if which == "pairs" else rest
        for field in fields:
            prefix = re.match(r'"([^"]*)"\s*\.\.', field)
            named = re.fullmatch(r'"([^"]*)"', field) or prefix
            if named:
                uses.append(Use(script, command, hashes.get(key, key), named[1], bool(prefix)))
            else:
                # Only a whole hash read back (ack.lua rewrites the meta so)
                # may name a declared hash's fields otherwise.
                assert key not in hashes or field.startswith("unpack("), (script, args)
    return uses


def _script_uses() -> list[Use]:
    """Every field every script names, through the shared pieces' functions it calls."""
    pieces: dict[str, list[Use]] = {}
    for path in sorted(LUA.glob("_*.lua")):
        code = _code(path.read_text("utf-8"))
        for match in re.finditer(r"^local function (\w+)\(.*?^end$", code, re.M | re.S):
            pieces[match.group(1)] = _uses(path.stem, match.group(0), PIECES)
    scripts = [path for path in sorted(LUA.glob("*.lua")) if not path.stem.startswith("_")]
    assert {path.stem for path in scripts} >= set(HASHES)
    uses = []
    for path in scripts:
        code = _code(path.read_text("utf-8"))
        uses += _uses(path.stem, code, HASHES.get(path.stem, {}))
        for function, used in pieces.items():
            if re.search(rf"(?<![\w.]){function}\(", code):
                uses += [Use(path.stem, u.command, u.hash, u.field, u.family) for u in used]
    return uses


def _declared(use: Use) -> HashField | None:
    for declared in DECLARED.get(use.hash, ()):
        if declared.name == use.field and bool(declared.key) == use.family:
            return declared
    return None


def test_the_lua_parser_sees_literal_fields_prefixes_and_pairs() -> None:
    code = _code(
        'local x = "--" -- redis.call("HGET", KEYS[1], "gone")\n'
        'redis.call("HSET", KEYS[1], "a:" .. id, f(1, "b"), "c", "d" .. e)\n'
        'redis.call("HDEL", KEYS[2], "e", ARGV[1])  redis.call("GET", KEYS[1])\n'
    )
    uses = _uses("x", code, {"KEYS[1]": "meta"})
    assert [(u.command, u.hash, u.field, u.family) for u in uses] == [
        ("HSET", "meta", "a:", True), ("HSET", "meta", "c", False), ("HDEL", "KEYS[2]", "e", False),
    ]  # fmt: skip
    with pytest.raises(AssertionError):
        _uses("x", 'redis.call("HGET", KEYS[1], ARGV[1])', {"KEYS[1]": "meta"})


def test_every_field_a_script_names_is_declared_in_keys() -> None:
    uses = _script_uses()
    assert len(uses) > 100
    undeclared = sorted(
        {(u.script, u.hash, u.field + ("<...>" if u.family else "")) for u in uses
         if _declared(u) is None}
    )  # fmt: skip
    assert not undeclared, "declare these in scrapy_banker/redis/keys.py (or name the hash here)"
    # A count a script keeps with HINCRBY is declared an int.
    counts = {_declared(u) for u in uses if u.command == "HINCRBY"}
    assert {field.kind for field in counts if field is not None} == {int}


def test_every_declared_field_is_changed_by_exactly_its_declared_writers() -> None:
    uses = _script_uses()
    for hash_name, declared in DECLARED.items():
        assert len({d.name for d in declared}) == len(declared)
        for field in declared:
            assert isinstance(field, HashField) and field.meaning and field.kind in (int, str)
            touched = [u for u in uses if u.hash == hash_name and _declared(u) is field]
            writers = {u.script for u in touched if u.writes}
            assert touched and writers, f"{field.pattern} is declared but no script uses it"
            assert len(set(field.writers)) == len(field.writers), field.pattern
            assert set(field.writers) == writers, field.pattern


def test_the_lease_bookkeeping_is_written_once() -> None:
    """Ending a lease -- its epoch's count, the request's fields -- is _lease.lua's alone."""
    patterns = (
        r'"HINCRBY",\s*[^,]+,\s*"h:"\s*\.\.\s*e\s*,\s*-1',  # one lease fewer at its epoch
        r'"HDEL",\s*[^,]+,(\s*"\w+:"\s*\.\.\s*id\s*,){2}',  # the request's fields
    )
    for pattern in patterns:
        holders = [
            path.name for path in sorted(LUA.glob("*.lua"))
            if re.search(pattern, _code(path.read_text("utf-8")))
        ]  # fmt: skip
        assert holders == ["_lease.lua"], pattern


def test_fields_are_named_through_their_declarations() -> None:
    assert DELIVERIES.of(17) == "d:17" and DELIVERIES.pattern == "d:<id>"
    assert HOST_PAGES.key_of("u:a.test") == "a.test" and HOST_PAGES.key_of("o:a.test") is None
    assert QUEUED.pattern == "n" and QUEUED.key_of("n") is None
    with pytest.raises(ValueError, match="single field"):
        QUEUED.of(1)


def _spelled_fields(tree: ast.AST) -> list[tuple[int, str]]:
    """Declared fields spelled out in Python: ``h*`` commands' fields, ``startswith`` prefixes."""
    names = {f.name for f in (*META_FIELDS, *BUDGET_FIELDS) if not f.key}
    prefixes = tuple(f.name for f in (*META_FIELDS, *BUDGET_FIELDS) if f.key)
    commands = ("hget", "hmget", "hset", "hincrby", "hdel", "hexists")
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr == "startswith":
            args, exact = node.args, set()  # a family's prefix, tested by hand
        elif node.func.attr in commands:
            args, exact = node.args[1:], names
        else:
            continue
        for arg in args:
            for part in arg.elts if isinstance(arg, ast.List | ast.Tuple) else [arg]:
                if isinstance(part, ast.JoinedStr) and part.values:
                    part = part.values[0]
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    text = part.value
                    if text in exact or text.startswith(prefixes):
                        found.append((node.lineno, text))
    return found


def test_python_reads_the_hashes_through_the_declarations() -> None:
    code = 'c.hget(k.meta, f"d:{i}"); c.hmget(g, ["bf", x])\nif a.startswith(("u:", "n")): 1'
    assert sorted(_spelled_fields(ast.parse(code))) == [(1, "bf"), (1, "d:"), (2, "u:")]
    spelled = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if (found := _spelled_fields(ast.parse(path.read_text("utf-8"))))
    }
    assert not spelled


def test_the_docs_list_every_declared_field() -> None:
    text = DOCS.read_text("utf-8")
    missing = [f.pattern for f in (*META_FIELDS, *BUDGET_FIELDS) if f"``{f.pattern}``" not in text]
    assert not missing
