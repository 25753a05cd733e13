"""``setting`` and ``stat`` cross-reference types, like Scrapy's own docs."""

from __future__ import annotations

from typing import Any


def setup(app: Any) -> dict[str, Any]:
    app.add_crossref_type(
        directivename="setting", rolename="setting", indextemplate="pair: %s; setting"
    )
    app.add_crossref_type(directivename="stat", rolename="stat", indextemplate="pair: %s; stat")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
