"""The ``scrapy banker`` command: dispatches to the subcommands of this package.

Registered through Scrapy's ``scrapy.commands`` entry point, so it works in
any project (and outside one, with ``-s`` settings) once scrapy-banker is
installed.  Subcommand modules import their heavy dependencies (Redis,
matplotlib, Twisted's web server) only when they run.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import TYPE_CHECKING, Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.settings import SETTINGS_PRIORITIES

from scrapy_banker.core.directives import VERBS
from scrapy_banker.ops.commands import CommandError

if TYPE_CHECKING:
    from types import ModuleType

logger = logging.getLogger(__name__)

#: Subcommands with a module of this package each, in the order ``--help`` lists them.
SUBCOMMANDS = ("status", "explain", "assign", "deadletters", "plot", "dashboard")
#: The run-time control subcommands, all in :mod:`scrapy_banker.ops.commands.control`:
#: ``control``, then one per operator verb of :data:`~scrapy_banker.core.directives.VERBS`.
CONTROL = ("control", *VERBS)


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"scrapy_banker.ops.commands.{name}")


def _control() -> ModuleType:
    return _module("control")


class Command(ScrapyCommand):
    requires_project = False
    # None of the subcommands crawls: no CrawlerProcess (and no reactor
    # installed by Scrapy) is needed.  Ignored by Scrapy < 2.14.
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_LEVEL": "WARNING"}

    def syntax(self) -> str:
        return f"{{{','.join(SUBCOMMANDS + CONTROL)}}} [options]"

    def short_desc(self) -> str:
        return "Inspect and operate a scrapy-banker crawl (JOBDIR or Redis fleet)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
        for name in SUBCOMMANDS:
            module = _module(name)
            child = sub.add_parser(name, help=module.HELP, description=module.HELP)
            # Scrapy's global options (-s, -L, …) also after the subcommand.
            ScrapyCommand.add_options(self, child)
            module.add_arguments(child)
        control = _control()
        for name in CONTROL:
            child = sub.add_parser(name, help=control.HELPS[name], description=control.HELPS[name])
            ScrapyCommand.add_options(self, child)
            control.add_arguments_for(name, child)

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        assert self.settings is not None
        # A project's LOG_LEVEL (often INFO) outranks default_settings; Scrapy
        # 2.13 builds a CrawlerProcess for every command, whose start-up lines
        # would bury a one-line answer.  Only -L / -s LOG_LEVEL=... change it.
        if (self.settings.getpriority("LOG_LEVEL") or 0) < SETTINGS_PRIORITIES["cmdline"]:
            self.settings.set("LOG_LEVEL", "WARNING", priority="cmdline")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        name = getattr(opts, "subcommand", None)
        if name is None:
            sys.stderr.write(
                f"scrapy banker: name a subcommand: {', '.join(SUBCOMMANDS + CONTROL)} "
                "(scrapy banker SUBCOMMAND -h for its options)\n"
            )
            self.exitcode = 2
            return
        if args:
            sys.stderr.write(f"scrapy banker {name}: unexpected arguments: {' '.join(args)}\n")
            self.exitcode = 2
            return
        assert self.settings is not None
        try:
            if name in CONTROL:
                self.exitcode = int(_control().run_verb(name, opts, self.settings))
            else:
                self.exitcode = int(_module(name).run(opts, self.settings))
        except CommandError as exc:
            sys.stderr.write(f"scrapy banker {name}: {exc}\n")
            self.exitcode = 2
