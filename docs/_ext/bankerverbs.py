"""The operator's verbs in the docs, from the table the code reads.

``.. banker-verbs::`` is a table of every verb of
:data:`scrapy_banker.core.directives.VERBS`: its command line, what it does and
whether a single process (``--jobdir``) can carry it out.  The role
``:banker-verbs:`WHICH``` names verbs inline (``all``, ``jobdir``: those a
single process can carry out, ``fleet-only``: those it cannot), as
"``pause``, ``resume`` and ``limit``".  A verb added to the table shows in
both without touching the pages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive

from scrapy_banker.core.directives import JOBDIR, VERBS, Verb

#: ``:banker-verbs:`WHICH``` -> which verbs it names.
SELECTIONS: dict[str, Callable[[Verb], bool]] = {
    "all": lambda verb: True,
    "jobdir": lambda verb: verb.available(JOBDIR),
    "fleet-only": lambda verb: not verb.available(JOBDIR),
}
#: The table's columns: heading, relative width, the cell of a verb.
COLUMNS: tuple[tuple[str, int, Callable[[Verb], nodes.Node]], ...] = (
    ("Command", 5, lambda v: nodes.literal(text=f"scrapy banker {v.name} {v.synopsis}")),
    ("What it does", 6, lambda v: _help(v.help)),
    ("Single process", 2, lambda v: nodes.Text("yes" if v.available(JOBDIR) else "no: Redis")),
)


def _help(text: str) -> nodes.inline:
    """A verb's help line, its command-line options (``--topic``) as literals."""
    out = nodes.inline()
    for i, part in enumerate(re.split(r"(--[a-z][a-z-]*)", text)):
        if part:
            out += nodes.literal(text=part) if i % 2 else nodes.Text(part)
    return out


def selected(which: str) -> list[Verb]:
    """The verbs ``which`` names, in the table's order; ``KeyError`` for an unknown name."""
    keep = SELECTIONS[which]
    return [verb for verb in VERBS.values() if keep(verb)]


def _listed(names: Sequence[str]) -> list[nodes.Node]:
    """``a``, ``a`` and ``b``, ``a``, ``b`` and ``c`` -- as literals."""
    out: list[nodes.Node] = []
    for i, name in enumerate(names):
        if i:
            out.append(nodes.Text(" and " if i == len(names) - 1 else ", "))
        out.append(nodes.literal(text=name))
    return out


def verbs_role(
    name: str, rawtext: str, text: str, lineno: int, inliner: Any, *args: Any, **kwargs: Any
) -> tuple[list[nodes.Node], list[nodes.system_message]]:
    try:
        verbs = selected(text.strip())
    except KeyError:
        message = inliner.reporter.error(
            f"banker-verbs: unknown selection {text!r}; one of {', '.join(SELECTIONS)}",
            line=lineno,
        )
        return [inliner.problematic(rawtext, rawtext, message)], [message]
    return _listed([v.name for v in verbs]), []


class VerbTable(Directive):
    """``.. banker-verbs::`` -- one row per verb of the table."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        table = nodes.table(classes=["banker-verbs"])
        group = nodes.tgroup(cols=len(COLUMNS))
        table += group
        for _, width, _ in COLUMNS:
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += self._row([nodes.Text(title) for title, _, _ in COLUMNS])
        body = nodes.tbody()
        for verb in VERBS.values():
            body += self._row([cell(verb) for _, _, cell in COLUMNS])
        group += head
        group += body
        return [table]

    @staticmethod
    def _row(cells: list[nodes.Node]) -> nodes.row:
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            entry += nodes.paragraph("", "", cell)
            row += entry
        return row


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("banker-verbs", VerbTable)
    app.add_role("banker-verbs", verbs_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
