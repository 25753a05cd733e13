"""``scrapy banker …``: the operator's commands (registered as a Scrapy command).

:mod:`scrapy_banker.ops.commands.banker` is the one Scrapy command; each
subcommand lives in its own module here and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(opts, settings) -> int`` (the exit code).
A subcommand reports bad input by raising :class:`CommandError`: one line on
stderr, exit code 2, nothing written anywhere.
"""

from __future__ import annotations

__all__ = ["CommandError"]


class CommandError(Exception):
    """Bad input or an unreachable store: printed as one line, exit code 2."""
