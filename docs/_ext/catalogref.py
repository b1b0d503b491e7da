"""The ``catalog-reference`` directive: the table of every catalog key (``catalogkeys``)."""

from __future__ import annotations

from typing import Any

from catalogkeys import Key, problems, rows
from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


def _literal(text: str) -> bool:
    """A default written as a value (``[0, 1]``, ``''``, ``true``), not in words."""
    return text[:1] in "'\"[{0123456789" or text in ("true", "false")


def _cell(text: str, code: bool = False) -> nodes.entry:
    entry = nodes.entry()
    if text:
        entry += nodes.paragraph("", "", nodes.literal(text, text) if code else nodes.Text(text))
    return entry


class CatalogReference(SphinxDirective):
    """``catalog-reference``: the table of every catalog key."""

    def run(self) -> list[nodes.Node]:
        for problem in problems():
            logger.warning("catalog reference: %s", problem, location=self.get_location())
        table = nodes.table(classes=["catalog-reference"])
        group = nodes.tgroup(cols=5)
        table += group
        for width in (22, 18, 12, 36, 12):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        header = nodes.row()
        for title in ("key", "type", "default", "what", "example"):
            header += _cell(title)
        head += header
        group += head
        body = nodes.tbody()
        for path, type_text, key in rows():
            key = key or Key("", "")
            row = nodes.row()
            row += _cell(path, code=True)
            row += _cell(type_text)
            row += _cell(key.default, code=_literal(key.default))
            row += _cell(key.meaning)
            row += _cell(key.example, code=True)
            body += row
        group += body
        return [table]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("catalog-reference", CatalogReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
