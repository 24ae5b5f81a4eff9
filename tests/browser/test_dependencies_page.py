"""Dependencies (issue 34) on the dashboard: an item page links its parents and children
with their statuses and says which parents a Waiting item waits for; the overview counts
Waiting items; a Waiting item can be cancelled from its page."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from selenium.webdriver import Chrome
from selenium.webdriver.common.by import By

from tests.browser.driving import click, notice, open_page, sign_in, until
from tests.browser.queue import Conn, one
from tests.browser.support import TOKEN, Dashboard, request

RUNNING = (
    "INSERT INTO work_items (kind, status, attempt, worker_id, started_at, lease_expires_at)"
    " VALUES ('Thumb', 'Running', 1, 'w', now(), now() + interval '1 h') RETURNING id"
)


def family(pg: Conn) -> tuple[int, int, int, int]:
    """A Running and a Queued Thumb; a Publish after both; a Zip after the Publish."""
    busy = one(pg, RUNNING)
    later = one(pg, "INSERT INTO work_items (kind) VALUES ('Thumb') RETURNING id")
    child = one(pg, "INSERT INTO work_items (kind, after) VALUES ('Publish', %s) RETURNING id",
                [[later, busy]])  # fmt: skip
    grandchild = one(pg, "INSERT INTO work_items (kind, after) VALUES ('Zip', %s) RETURNING id",
                     [[child]])  # fmt: skip
    return busy, later, child, grandchild


def relatives(browser: Chrome, table: str) -> list[tuple[str, str, str, str]]:
    """(id, link, kind, status) of each row of the item page's #parents or #children."""
    rows = []
    for row in browser.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-id]"):
        link = row.find_element(By.CSS_SELECTOR, "a")
        cells = row.find_elements(By.TAG_NAME, "td")
        rows.append((str(row.get_attribute("data-id")), str(link.get_attribute("href")),
                     cells[1].text, cells[2].text))  # fmt: skip
    return rows


def test_the_item_page_links_parents_and_children_with_their_status(
    browser: Chrome, dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """A Waiting item's page lists its parents and its children, each a link to its
    own page with its kind and status, and says under "Why it waits" which parents
    have not Succeeded; following a parent's link shows the item among its children.
    The overview's Waiting tile and counts have the Waiting items."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        busy, later, child, grandchild = family(pg)
        url = start_dashboard(dsn).url

        open_page(browser, f"{url}/items/{child}")
        assert relatives(browser, "parents") == [
            (str(busy), f"{url}/items/{busy}", "Thumb", "Running"),
            (str(later), f"{url}/items/{later}", "Thumb", "Queued"),
        ]
        assert relatives(browser, "children") == [
            (str(grandchild), f"{url}/items/{grandchild}", "Zip", "Waiting"),
        ]
        assert browser.find_element(By.CSS_SELECTOR, "#waiting li").text == (
            f"for parent {busy} (Thumb, Running), parent {later} (Thumb, Queued)"
        )

        browser.find_element(By.CSS_SELECTOR, f'#parents tr[data-id="{later}"] a').click()
        until(browser, lambda: browser.current_url == f"{url}/items/{later}",
              what="the parent's page")  # fmt: skip
        until(browser, lambda: relatives(browser, "children")
              == [(str(child), f"{url}/items/{child}", "Publish", "Waiting")],
              what="the parent's children")  # fmt: skip
        assert not browser.find_elements(By.ID, "parents")

        # The live refresh follows a parent's change: both done, the child is Queued.
        pg.execute("UPDATE work_items SET status = 'Succeeded', finished_at = now(),"
                   " started_at = now(), attempt = 1, worker_id = NULL,"
                   " lease_expires_at = NULL WHERE id = ANY(%s)", [[busy, later]])  # fmt: skip
        open_page(browser, f"{url}/items/{child}")
        until(browser, lambda: [r[3] for r in relatives(browser, "parents")]
              == ["Succeeded", "Succeeded"], what="the parents Succeeded")  # fmt: skip
        assert browser.find_element(By.CSS_SELECTOR, "#fields [data-field=status]").text == (
            "Queued"
        )

        open_page(browser, f"{url}/")
        waiting = browser.find_element(By.CSS_SELECTOR, "#tile-waiting .value")
        assert waiting.get_attribute("data-n") == "1"  # the Zip; the Publish is Queued
        cell = '#counts tr[data-kind="Zip"] td[data-status="Waiting"]'
        assert browser.find_element(By.CSS_SELECTOR, cell).get_attribute("data-n") == "1"
        headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#counts thead th")]
        assert headers[:3] == ["kind", "Waiting", "Queued"]


def test_a_waiting_item_is_cancelled_from_its_page(
    browser: Chrome, dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """Signed in, a Waiting item's page offers cancel: it cancels the item, and the item
    waiting on it is cancelled with a reason that names it."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        _, _, child, grandchild = family(pg)
        url = start_dashboard(dsn, "--allow-actions",
                              env={"TRIOWORKER_DASHBOARD_TOKEN": TOKEN}).url  # fmt: skip
        sign_in(browser, url, TOKEN, next=f"/items/{child}")
        click(browser, 'button[data-action="cancel"]')
        notice(browser, f"item {child} cancelled (it had not started)")
        status = "SELECT status, reason FROM work_items WHERE id = %s"
        assert pg.execute(status, [child]).fetchone() == ("Cancelled", "cancelled before it ran")
        assert pg.execute(status, [grandchild]).fetchone() == (
            "Cancelled",
            f"parent {child} was cancelled",
        )


def test_the_item_page_lists_200_children_and_counts_the_rest(
    dsn: str, start_dashboard: Callable[..., Dashboard]
) -> None:
    """A parent of 205 children: its page links the first 200 by id, and says how many
    more there are (a page refreshed every two seconds reads a bounded list)."""
    with psycopg.connect(dsn, autocommit=True) as pg:
        parent = one(pg, "INSERT INTO work_items (kind) VALUES ('Thumb') RETURNING id")
        pg.execute(
            "INSERT INTO work_items (kind, after)"
            " SELECT 'C', ARRAY[%s::bigint] FROM generate_series(1, 205)",
            [parent],
        )
        first = one(pg, "SELECT min(id) FROM work_items WHERE kind = 'C'")
        page = request(f"{start_dashboard(dsn).url}/items/{parent}")
    assert page.status == 200, page.body[-2000:]
    assert page.body.count('<a href="/items/') == 200
    assert f'<a href="/items/{first + 199}">' in page.body
    assert f'<a href="/items/{first + 200}">' not in page.body
    assert 'Children <span class="dim">(205)</span>' in page.body
    assert "and 5 more" in page.body
