"""The docs name the operator's verbs from the table the code reads (core.control.VERBS).

docs/control.rst shows the verbs through ``.. banker-verbs::`` (a table built
from VERBS by ``docs/_ext/bankerverbs.py``) and says what each does in one
bullet per verb, written by hand: a verb added to the table without its bullet,
or a bullet left for a verb that is gone, fails here.  No Sphinx run: the
extension's selections are checked directly (``sphinx-build -W`` renders them).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from scrapy_banker.core.directives import JOBDIR, VERBS

DOCS = Path(__file__).resolve().parent.parent / "docs"
CONTROL_RST = DOCS / "control.rst"
COMMANDS_RST = DOCS / "ops" / "commands.rst"


@pytest.fixture(scope="module")
def bankerverbs() -> object:
    # The extension is Sphinx's (docutils): installed with the docs extras, which
    # the main run has and the Scrapy 2.13 run (Scrapy-facing code only) does not.
    pytest.importorskip("docutils", reason="the docs extras are not installed here")
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import bankerverbs
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    return bankerverbs


def test_control_rst_has_the_generated_table_and_one_bullet_per_verb() -> None:
    text = CONTROL_RST.read_text(encoding="utf-8")
    assert "\n.. banker-verbs::\n" in text
    bullets = re.findall(r"^\* ``([a-z]+)`` ", text, flags=re.MULTILINE)
    assert sorted(bullets) == sorted(VERBS), "one bullet per verb of VERBS, saying what it does"
    # No hand-written list of verbs left: the commands' synopsis comes from the table.
    for verb in VERBS.values():
        assert f"scrapy banker {verb.name} {verb.synopsis}" not in text


def test_commands_rst_names_the_verbs_through_the_role() -> None:
    text = COMMANDS_RST.read_text(encoding="utf-8")
    assert ":banker-verbs:`all`" in text
    assert not re.search(r"^``(pause|purge|inject)``", text, flags=re.MULTILINE)


def test_the_extension_selects_from_the_table(bankerverbs: object) -> None:
    selected = bankerverbs.selected  # type: ignore[attr-defined]
    assert [v.name for v in selected("all")] == list(VERBS)
    assert [v.name for v in selected("jobdir")] == [
        v.name for v in VERBS.values() if JOBDIR in v.where
    ]
    assert [v.name for v in selected("fleet-only")] == ["purge", "inject"]
    with pytest.raises(KeyError):
        selected("nosuch")
