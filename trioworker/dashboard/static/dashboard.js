// trioworker dashboard: keeps a page's live part fresh without reloading it, and posts
// action forms in the background. No dependencies, nothing fetched from elsewhere.
//
// Every `data-refresh` milliseconds the page asks its own URL again with the header
// X-Trioworker-Fragment: 1; the server answers with just the live part, which
// replaces main#live's content. Open <details data-key> stay open across refreshes.
"use strict";

(function () {
  const live = document.getElementById("live");
  const updated = document.getElementById("updated");
  const notice = document.getElementById("notice");
  if (!live) return;
  const every = parseInt(live.dataset.refresh || "0", 10);
  let busy = false;
  let failures = 0;

  // Now, in UTC on the 24-hour clock, as every time on the page is shown.
  function utcNow() {
    return new Date().toISOString().slice(11, 19) + " UTC";
  }

  function stamp(text, bad) {
    if (!updated) return;
    updated.textContent = text;
    updated.classList.toggle("stale", Boolean(bad));
  }

  function say(message, ok) {
    if (!notice) return;
    notice.textContent = message;
    notice.className = "notice " + (ok ? "ok" : "alert");
    notice.hidden = false;
  }

  function openKeys() {
    return new Set(Array.from(live.querySelectorAll("details[data-key]"))
      .filter((d) => d.open).map((d) => d.dataset.key));
  }

  async function refresh() {
    if (busy || document.hidden) return;
    // Someone typing in the live part keeps what they typed.
    const focused = document.activeElement;
    if (focused && live.contains(focused) && focused.matches("input, textarea, select")) return;
    busy = true;
    try {
      const answer = await fetch(location.pathname + location.search, {
        headers: { "X-Trioworker-Fragment": "1" },
        credentials: "same-origin",
        cache: "no-store",
      });
      const html = await answer.text();
      const keep = openKeys();
      live.innerHTML = html;
      for (const d of live.querySelectorAll("details[data-key]")) {
        if (keep.has(d.dataset.key)) d.open = true;
      }
      failures = 0;
      stamp("updated " + utcNow(), !answer.ok);
      document.dispatchEvent(new CustomEvent("trioworker:refreshed"));
    } catch (error) {
      failures += 1;
      stamp("not updated: the dashboard did not answer", true);
    } finally {
      busy = false;
    }
  }

  // Action forms (class "act") post in the background; the answer is a notice, and
  // the live part is read again at once.
  document.addEventListener("submit", async (event) => {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.classList.contains("act")) return;
    event.preventDefault();
    const buttons = form.querySelectorAll("button");
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const answer = await fetch(form.action, {
        method: "POST",
        headers: { "Accept": "application/json" },
        body: new URLSearchParams(new FormData(form)),
        credentials: "same-origin",
      });
      let message = answer.statusText;
      try {
        message = (await answer.json()).message;
      } catch (error) {
        // not JSON (a proxy's error page): keep the status text
      }
      say(message, answer.ok);
    } catch (error) {
      say("the dashboard did not answer", false);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
    refresh();
  });

  if (every > 0) {
    stamp("updated " + utcNow(), false);
    setInterval(refresh, every);
    document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
  }
})();
