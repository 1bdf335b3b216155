"""The web page's static parts (the browser test, slow, checks them drawn): where the token
is, one unit per column, no failure reason under a "waiting" heading, an empty queue said in
words."""

from __future__ import annotations

from html.parser import HTMLParser
from importlib import resources


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.headers: list[str] = []
        self.ids: dict[str, str] = {}
        self._stack: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._stack.append((tag, dict(attrs).get("id")))
        if tag == "th":
            self.headers.append("")

    def handle_endtag(self, tag: str) -> None:
        while self._stack and self._stack.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        if any(t == "th" for t, _ in self._stack):
            self.headers[-1] += data
        for _, i in self._stack:
            if i:
                self.ids[i] = self.ids.get(i, "") + data


def _page() -> _Page:
    p = _Page()
    p.feed((resources.files("miso.observe") / "web" / "index.html").read_text())
    return p


def test_the_token_form_says_where_the_token_is() -> None:
    where = " ".join(_page().ids["token-where"].split())
    assert "operator.token" in where and "miso login" in where and "miso user add" in where


def test_one_unit_per_column_and_no_failure_under_waiting() -> None:
    heads = [" ".join(h.split()) for h in _page().headers]
    speed = [h for h in heads if "speed" in h]
    assert len(speed) == 2, heads
    assert any("it/s" in h and "relative" not in h for h in speed)
    assert any("relative" in h and "it/s" not in h for h in speed)
    assert "waiting because" not in heads
    assert any("ended" in h for h in heads)


def test_an_empty_queue_is_said_in_words_not_as_an_item() -> None:
    page = _page()
    assert "No job is waiting" in page.ids["queue-empty"]
    js = (resources.files("miso.observe") / "web" / "app.js").read_text()
    assert 'text: "empty"' not in js
