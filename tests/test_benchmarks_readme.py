"""benchmarks/README.md stays a table of current results: every row of its question tables
has a unique id (the handle the coordinator edits rows by), and every link into
benchmarks/history/ names a file and a section that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "benchmarks"
README = ROOT / "README.md"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    a = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return a.replace(" ", "-")


def test_every_result_row_has_a_unique_id() -> None:
    rows = [line for line in README.read_text().splitlines()
            if line.startswith("| `") and line.count("|") >= 8]
    ids = [line.split("`")[1] for line in rows]
    assert len(ids) >= 40, ids
    dup = sorted({i for i in ids if ids.count(i) > 1})
    assert not dup, f"duplicate row ids: {dup}"


def test_history_links_resolve() -> None:
    links = re.findall(r"\]\(history/([\w.\-]+)(?:#([^)]+))?\)", README.read_text())
    assert len(links) >= 40
    for name, anchor in links:
        path = ROOT / "history" / name
        assert path.exists(), name
        if anchor:
            heads = {_anchor(line.lstrip("#")) for line in path.read_text().splitlines()
                     if line.startswith("#")}
            assert anchor in heads, f"{name}#{anchor}"
