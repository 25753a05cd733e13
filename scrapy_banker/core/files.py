"""Durable file-system steps shared by the JOBDIR journal, its dead letters and the spill.

A file written and renamed into place survives a power loss only once the
directory that holds the new name is ``fsync``'d too; every writer that
swaps files with ``os.replace`` needs that step, so it is written once here.
"""

from __future__ import annotations

import os

__all__ = ["fsync_dir"]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename, creation or unlink in ``path`` durable; best effort.

    A no-op where a directory cannot be opened (Windows) or a file system
    refuses to ``fsync`` one.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse
        pass
    finally:
        os.close(fd)
