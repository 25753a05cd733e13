"""``scrapy banker plot TIMESERIES [TIMESERIES ...] -o DIR``: the crawl's charts as PNGs.

Reads the JSON-lines record(s) that ``BANKER_TIMESERIES_FILE`` made (one
file per node of a fleet, merged by node) and writes the charts of
:mod:`scrapy_banker.ops.plots`, printing each path on stdout so a script can
pick them up.  A truncated or unknown line costs that line only (one warning
line on stderr); a file that cannot be read, or holds no sample at all, is
bad input: one line on stderr and exit code 2.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

from scrapy_banker.ops.commands import CommandError

if TYPE_CHECKING:
    import argparse

    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

HELP = "Plot a crawl's time-series record (BANKER_TIMESERIES_FILE) as PNG charts"

#: Where the charts go when ``-o`` is not given.
DEFAULT_DIR = "banker-plots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "timeseries",
        nargs="*",
        metavar="TIMESERIES",
        help="time-series file(s) written by BANKER_TIMESERIES_FILE, one per node "
        "(default: the project's BANKER_TIMESERIES_FILE)",
    )
    parser.add_argument(
        "-o",
        "--output-dir",
        dest="plot_dir",
        metavar="DIR",
        default=DEFAULT_DIR,
        help=f"directory to write the PNG files into (created; default: {DEFAULT_DIR})",
    )


def run(opts: argparse.Namespace, settings: BaseSettings) -> int:
    paths: list[str] = list(opts.timeseries)
    if not paths:
        configured = settings.get("BANKER_TIMESERIES_FILE")
        if not configured:
            raise CommandError("name a time-series file (or set BANKER_TIMESERIES_FILE)")
        paths = [str(configured)]
    # matplotlib and numpy load only now: the other subcommands never pay for them.
    from scrapy_banker.ops import plots

    try:
        samples, bad = plots.read_samples(paths)
    except OSError as exc:
        raise CommandError(f"cannot read {exc.filename or paths}: {exc.strerror or exc}") from None
    first_bad = f"first: {str(bad[0])[:160]}" if bad else ""
    if not samples:
        why = f" ({len(bad)} bad line(s), {first_bad})" if bad else " (empty)"
        raise CommandError(f"no valid sample in {', '.join(paths)}{why}")
    if bad:
        sys.stderr.write(
            f"scrapy banker plot: warning: skipped {len(bad)} line(s) that are not samples "
            f"({first_bad})\n"
        )
    try:
        result = plots.plot_samples(samples, opts.plot_dir)
    except plots.PlotError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(
            f"cannot write to {exc.filename or opts.plot_dir}: {exc.strerror or exc}"
        ) from None
    nodes = len({s.node for s in samples})
    logger.info("Plotted %d samples of %d node(s) from %s", len(samples), nodes, paths)
    for path in result.written:
        print(path)
    for name, why in result.skipped:
        sys.stderr.write(f"scrapy banker plot: skipped {name}: {why}\n")
    sys.stdout.flush()
    return 0
