"""Hostile strings for escaping tests, and one check that an HTML page shows them as text.

Anything a user, a notebook pod or another namespace controls (user and
server names, pod labels and annotations, image names, error messages that
quote them) may be one of these. A page is right when it shows each exactly
as text: no element, attribute or URL comes out of it.

    from tests.security.payloads import PAYLOADS, assert_escaped

    @pytest.mark.parametrize(("name", "value"), PAYLOADS)
    def test_shown_as_text(name, value):
        assert_escaped(render(value), value)

The browser-side check (a ``<script>`` or ``onerror`` that ran sets
``window.__pwned``) is up to the test that opens the page.
"""

from __future__ import annotations

from html.parser import HTMLParser

#: (name, value): what each tries, for test ids and messages.
PAYLOADS: tuple[tuple[str, str], ...] = (
    ("script-element", "<script>window.__pwned=1</script>"),
    ("attribute-breakout", '"><img src=x onerror="window.__pwned=1">'),
    ("javascript-url", "javascript:alert(1)"),
    ("nul", "nul\x00byte"),
    # a header or log line of its own if written raw
    ("cr-lf", "line\r\nSet-Cookie: pwned=1"),
    # shows "exe.doc" reversed: a name that reads as something else
    ("bidi-override", "invoice\u202ecod.exe"),
    ("ten-kb", "<b>" + "x" * 10_233 + "</b>"),
    ("non-ascii", "Zoë 🚀"),
)

#: Characters that end text or an attribute value in HTML: never raw in a page.
_MARKUP = set("<>\"'&")
#: What every payload that would run sets: ``window.__pwned``.
_MARKER = "__pwned"
#: Attributes whose value the browser may follow or run.
_URL_ATTRIBUTES = {"href", "src", "action", "formaction", "xlink:href"}


class _Collect(HTMLParser):
    """Text and attribute values, character references decoded."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.attributes: list[tuple[str, str, str]] = []
        self._tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tags.append(tag)
        self.attributes += [(tag, name, value or "") for name, value in attrs]

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.attributes += [(tag, name, value or "") for name, value in attrs]

    def handle_endtag(self, tag: str) -> None:
        if tag in self._tags:
            while self._tags.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        # text inside <script> or <style> is code, not something the page shows
        if not (self._tags and self._tags[-1] in ("script", "style")):
            self.text.append(data)


def assert_escaped(html: str, value: str) -> None:
    """``value`` is on the page as text or an attribute's value, and never as markup.

    - it appears, decoded, in the page's text or in an attribute value;
    - if it holds any of ``< > " ' &``, it does not appear raw in the source;
    - nothing it carries runs: no event-handler attribute (``on…``) holds
      ``__pwned`` (every payload's marker), and no link, source or form action
      is a ``javascript:`` URL made of it.

    The page's own handlers are left alone, and so is the text of its
    scripts (a page may carry the value JSON-encoded in one, as JupyterHub's
    do): whether a script ran is for the browser to tell (``window.__pwned``).
    """
    parser = _Collect()
    parser.feed(html)
    parser.close()
    text = "".join(parser.text)
    shown = value in text or any(value in v for _, _, v in parser.attributes)
    assert shown, f"{value[:60]!r} is not on the page as text or an attribute value"
    if set(value) & _MARKUP:
        assert value not in html, f"{value[:60]!r} is in the page's source unescaped"
    for tag, name, attribute in parser.attributes:
        assert not (name.startswith("on") and _MARKER in attribute), (
            f"<{tag} {name}={attribute[:60]!r}> is on the page: a payload made an element"
        )
        if name in _URL_ATTRIBUTES and attribute.strip().lower().startswith("javascript:"):
            assert value not in attribute, f"<{tag} {name}={attribute[:60]!r}> would run a script"
