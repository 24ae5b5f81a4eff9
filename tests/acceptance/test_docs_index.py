"""The site's front page and its navigation: every page of the nav is listed on the
index, and no two nav entries share a name or a page (issue 20: the index omitted
Scheduling, Tracing, Dashboard and the otel reference; the nav had both "Scheduling and
operating" and "Operating")."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[2]


def nav_pages(entries: list[Any]) -> list[tuple[str, str]]:
    """(title, page) of every page in an mkdocs nav, depth first."""
    found: list[tuple[str, str]] = []
    for entry in entries:
        for title, value in entry.items():
            if isinstance(value, list):
                found += nav_pages(value)
            else:
                found.append((title, value))
    return found


def test_the_index_lists_every_page_of_the_nav() -> None:
    """Each guide page and reference page of the nav is linked from docs/index.md."""
    nav = nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    linked = set(re.findall(r"\]\(([^)#]+)", (ROOT / "docs" / "index.md").read_text()))
    missing = [page for _, page in nav if page != "index.md" and page not in linked]
    assert not missing, f"docs/index.md does not list {missing}"


def test_no_two_guide_pages_share_a_name_or_a_word_of_one() -> None:
    """The guide's titles are distinct, and none contains another (a reader cannot tell
    "Scheduling and operating" from "Operating")."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    [guide] = [entry["Guide"] for entry in nav if "Guide" in entry]
    titles = [title.lower() for title, _ in nav_pages(guide)]
    assert not [t for t, n in Counter(titles).items() if n > 1]
    overlapping = [
        (a, b) for a in titles for b in titles if a != b and re.search(rf"\b{re.escape(b)}\b", a)
    ]
    assert not overlapping, overlapping
