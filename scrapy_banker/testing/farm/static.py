"""Static sites for the web farm: any folder of files served under a virtual host name.

The generated farm (:class:`~scrapy_banker.testing.farm.model.FarmModel`) has
shallow link graphs and pages that cost ~4 ms of CPU to parse; real sites
do not.  A static site serves a directory tree as it is -- a documentation
package, a mirrored site, or a small tree a test writes (HTML pages,
``robots.txt``, sitemaps, XML and CSV feeds) -- with the farm's latency
model and counters, so a crawl can be judged on real pages and real link
graphs.

Pure file-system code (no Twisted): the farm's server asks
:meth:`StaticSite.answer` for a status, a body and a content type.  Paths
are resolved inside the root only (``..`` and symlinks out of it answer
404), a directory answers its ``index.html``, and ``POST`` is answered like
``GET`` so ``FormRequest`` and ``JsonRequest`` have somewhere to go.
"""

from __future__ import annotations

import mimetypes
import os
from pathlib import Path
from typing import Final
from urllib.parse import unquote

__all__ = ["StaticSite"]

_TYPES: Final = {
    ".html": b"text/html",
    ".htm": b"text/html",
    ".xml": b"application/xml",
    ".txt": b"text/plain",
    ".csv": b"text/csv",
    ".json": b"application/json",
    ".css": b"text/css",
    ".js": b"text/javascript",
}


class StaticSite:
    """One directory tree served as a site; bodies are read once and kept."""

    def __init__(self, root: str | os.PathLike[str], max_cached_bytes: int = 256 << 20) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"static site root {str(root)!r} is not a directory")
        self.max_cached_bytes = max_cached_bytes
        self._cache: dict[str, tuple[int, bytes, bytes]] = {}
        self._cached_bytes = 0

    def resolve(self, path: str) -> Path | None:
        """The file a URL path names inside the root, or None (outside, missing)."""
        parts = [p for p in unquote(path.split("?", 1)[0]).split("/") if p]
        if any(p in (".", "..") or "\x00" in p for p in parts):
            return None
        target = self.root.joinpath(*parts)
        if target.is_dir():
            target = target / "index.html"
        try:
            real = target.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        if not real.is_file() or not real.is_relative_to(self.root):
            return None
        return real

    def answer(self, path: str) -> tuple[int, bytes, bytes]:
        """``(status, body, content type)`` for a GET (or POST) of ``path``."""
        hit = self._cache.get(path)
        if hit is not None:
            return hit
        file = self.resolve(path)
        if file is None:
            return 404, b"<html><body><h1>404 Not Found</h1></body></html>\n", b"text/html"
        body = file.read_bytes()
        ctype = _TYPES.get(file.suffix.lower())
        if ctype is None:
            guessed = mimetypes.guess_type(file.name)[0]
            ctype = guessed.encode() if guessed else b"application/octet-stream"
        hit = (200, body, ctype)
        if self._cached_bytes + len(body) <= self.max_cached_bytes:
            self._cache[path] = hit
            self._cached_bytes += len(body)
        return hit

    def files(self) -> list[str]:
        """URL paths of every file of the site, sorted (``/a/index.html`` also as ``/a/``)."""
        out = []
        for dirpath, _, names in os.walk(self.root):
            rel = Path(dirpath).relative_to(self.root)
            for name in names:
                out.append("/" + (rel / name).as_posix().lstrip("./"))
        return sorted(out)
