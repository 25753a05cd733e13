"""The spill file format, parser, merge and file handling (pure: no Redis, no Scrapy).

The file holds the worker's own operation values
(:class:`~scrapy_banker.core.ops.EnqueueOp`, :class:`~scrapy_banker.core.ops.LeaseToken`);
a file already on disk must still be read, and written again byte for byte.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from scrapy_banker.core.ops import EnqueueOp, LeaseToken
from scrapy_banker.core.spill import (
    SPILL_VERSION,
    SpillDir,
    SpillHeader,
    SpillOps,
    format_spill,
    merge,
    parse_spill,
)

HEADER = SpillHeader("banker:s", 64, "node-1", "2026-01-01T00:00:00Z")


def _ops() -> SpillOps:
    return SpillOps(
        enqueues=[
            EnqueueOp(3, "fp-a", '{"url":"http://a.test/"}', 5, False),
            EnqueueOp(4, "fp-b", '{"url":"http://b.test/\\u00e9"}', -1, True),
        ],
        dead=[(LeaseToken(1, "id-x", 2), "malformed: nope")],
        acks=[LeaseToken(3, "id-1", 1), LeaseToken(63, "id-2", 3)],
        nacks=[LeaseToken(0, "id-3", 1)],
    )


#: A spill as the worker wrote it before its operations and the spill's were one set of types.
WRITTEN_BEFORE = (
    '{"v":1,"kind":"header","prefix":"banker:s","partitions":64,"node":"node-1",'
    '"written":"2026-01-01T00:00:00Z"}\n'
    '{"v":1,"op":"enqueue","p":3,"fp":"fp-a","prio":5,"df":false,'
    '"payload":"{\\"url\\":\\"http://a.test/\\"}"}\n'
    '{"v":1,"op":"enqueue","p":4,"fp":"fp-b","prio":-1,"df":true,'
    '"payload":"{\\"url\\":\\"http://b.test/\u00e9\\"}"}\n'
    '{"v":1,"op":"dead","p":1,"id":"id-x","d":2,"reason":"malformed: nope"}\n'
    '{"v":1,"op":"ack","p":3,"id":"id-1","d":1}\n'
    '{"v":1,"op":"nack","p":0,"id":"id-3","d":1}\n'
)


def test_a_spill_written_before_reads_and_writes_the_same() -> None:
    parsed = parse_spill(WRITTEN_BEFORE, 64)
    assert parsed.bad == [] and parsed.header == HEADER
    ops = parsed.ops
    assert ops == SpillOps(
        enqueues=[
            EnqueueOp(3, "fp-a", '{"url":"http://a.test/"}', 5, False),
            EnqueueOp(4, "fp-b", '{"url":"http://b.test/\u00e9"}', -1, True),
        ],
        dead=[(LeaseToken(1, "id-x", 2), "malformed: nope")],
        acks=[LeaseToken(3, "id-1", 1)],
        nacks=[LeaseToken(0, "id-3", 1)],
    )
    assert format_spill(HEADER, ops) == WRITTEN_BEFORE
    # A live token's time and epoch are not its identity and are never written.
    live = LeaseToken(3, "id-1", 1, leased_at=12.5, epoch=7)
    assert live == ops.acks[0] and hash(live) == hash(ops.acks[0])
    again = SpillOps(ops.enqueues, ops.dead, [live], ops.nacks)
    assert format_spill(HEADER, again) == WRITTEN_BEFORE
    assert merge([ops, again]).acks == ops.acks  # the same delivery: kept once


def test_round_trip_keeps_every_op_and_its_order() -> None:
    ops = _ops()
    text = format_spill(HEADER, ops)
    lines = text.splitlines()
    assert len(lines) == 1 + len(ops)
    assert all(json.loads(line)["v"] == SPILL_VERSION for line in lines)
    parsed = parse_spill(text, 64)
    assert parsed.bad == []
    assert parsed.header == HEADER
    assert parsed.ops == ops
    assert ops.counts() == {"enqueue": 2, "dead": 1, "ack": 2, "nack": 1, "revisit": 0}
    assert ops.describe() == "2 enqueues, 1 dead letter, 2 acks, 1 nack"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"v": 2, "op": "ack", "p": 1, "id": "x", "d": 1}', "unsupported version"),
        ('{"op": "ack", "p": 1, "id": "x", "d": 1}', "unsupported version"),
        ('{"v": 1, "op": "frobnicate"}', "unknown op"),
        ('{"v": 1, "op": "ack", "p": 64, "id": "x", "d": 1}', "out of range"),
        ('{"v": 1, "op": "ack", "p": -1, "id": "x", "d": 1}', "out of range"),
        ('{"v": 1, "op": "ack", "p": true, "id": "x", "d": 1}', "must be an integer"),
        ('{"v": 1, "op": "nack", "p": 1, "id": "", "d": 1}', "non-empty string"),
        ('{"v": 1, "op": "nack", "p": 1, "id": "x", "d": 0}', "out of range"),
        ('{"v": 1, "op": "enqueue", "p": 1, "fp": "f", "payload": 7}', "payload"),
        ('{"v": 1, "op": "enqueue", "p": 1, "fp": "f", "payload": "x", "df": 1}', "'df'"),
        ('{"v": 1, "op": "enqueue", "p": 1, "fp": "f", "payload": "x", "prio": "1"}', "'prio'"),
        ('{"v": 1, "op": "dead", "p": 1, "id": "x", "d": 1}', "'reason'"),
        ('{"v": 1, "kind": "header", "prefix": "banker:s", "partitions": 64}', "second header"),
    ],
)
def test_a_malformed_line_is_reported_and_the_rest_kept(line: str, reason: str) -> None:
    good = format_spill(HEADER, _ops()).splitlines()
    text = "\n".join([*good[:3], line, *good[3:]]) + "\n"
    parsed = parse_spill(text, 64)
    assert parsed.ops == _ops()
    assert len(parsed.bad) == 1
    (bad,) = parsed.bad
    assert bad.number == 4 and bad.text == line
    assert reason in bad.reason


def test_a_torn_last_line_and_blank_lines_never_raise() -> None:
    text = format_spill(HEADER, _ops())
    parsed = parse_spill("\n" + text[:-20], 64)  # cut mid-line, as a crash would
    assert len(parsed.bad) == 1
    assert len(parsed.ops) == len(_ops()) - 1
    assert parse_spill("", 64).ops == SpillOps()


def test_merge_keeps_order_and_drops_what_replay_would_repeat() -> None:
    a, b = _ops(), _ops()
    b.enqueues.append(EnqueueOp(9, "fp-c", "{}", 0, False))
    b.acks.append(LeaseToken(3, "id-1", 2))  # another delivery: kept
    merged = merge([a, b])
    # fp-a once (dedup would drop the second); dont_filter fp-b twice (asked twice).
    assert [e.fingerprint for e in merged.enqueues] == ["fp-a", "fp-b", "fp-b", "fp-c"]
    assert merged.acks == [*a.acks, LeaseToken(3, "id-1", 2)]
    assert merged.nacks == a.nacks and merged.dead == a.dead
    assert merge([]) == SpillOps()


def test_write_is_atomic_and_claim_reads_it_back(tmp_path: Path) -> None:
    box = SpillDir(tmp_path / "spill")
    assert box.files() == []
    path = box.write(HEADER, _ops())
    second = box.write(HEADER, _ops())  # a second stop never overwrites the first
    assert path != second and path.parent == tmp_path / "spill"
    assert sorted(box.files()) == sorted([path, second])
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    claimed, foreign = box.claim("banker:s", 64)
    assert foreign == [] and len(claimed) == 2
    assert claimed[0].parsed.ops == _ops() and claimed[0].bad_path is None
    claimed[0].release(remove=True)
    claimed[1].release(remove=False)
    assert box.files() == [claimed[1].path]


def test_claim_keeps_bad_lines_in_a_bad_file_and_skips_another_crawls_spill(
    tmp_path: Path,
) -> None:
    box = SpillDir(tmp_path)
    path = box.write(HEADER, _ops())
    with path.open("a", encoding="utf-8") as f:
        f.write("garbage\n")
    other = box.write(SpillHeader("banker:other", 64, "n"), _ops())
    claimed, foreign = box.claim("banker:s", 64)
    assert foreign == [other]
    (c,) = claimed
    assert c.parsed.ops == _ops()
    assert c.bad_path == path.with_name(path.name + ".bad")
    assert c.bad_path.read_text("utf-8") == "garbage\n"
    c.release(remove=True)
    assert not path.exists() and c.bad_path.exists() and other.exists()


def _try_claim(directory: str, out: multiprocessing.Queue[int]) -> None:
    claimed, _ = SpillDir(directory).claim("banker:s", 64)
    out.put(len(claimed))


@pytest.mark.skipif(os.name != "posix", reason="flock")
@pytest.mark.slow  # starts two processes
def test_a_file_another_process_is_replaying_is_not_claimed_twice(tmp_path: Path) -> None:
    box = SpillDir(tmp_path)
    box.write(HEADER, _ops())
    claimed, _ = box.claim("banker:s", 64)
    assert len(claimed) == 1
    ctx = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[int] = ctx.Queue()
    proc = ctx.Process(target=_try_claim, args=(str(tmp_path), out))
    proc.start()
    proc.join(30)
    assert out.get(timeout=5) == 0  # locked by this process
    claimed[0].release(remove=False)
    proc = ctx.Process(target=_try_claim, args=(str(tmp_path), out))
    proc.start()
    proc.join(30)
    assert out.get(timeout=5) == 1  # released: the next worker may replay it
