// scheduler web: live regions and in-place actions, without a full reload. No dependencies, no CDN.
//
// * Every page marks the parts that change with data-live (and an id). While <body data-refresh="MS"> is above 0,
//   the page is fetched again every MS milliseconds (while the tab is visible) and each live region is replaced
//   by the fresh copy; the new page's data-refresh says whether to go on (a run page stops once the run ends).
// * A form marked data-action (run now, pause, resume, cancel, retry) is posted with fetch; the answer (JSON) is
//   shown in the flash line and the live regions are refreshed at once. Without JavaScript the same forms post
//   normally and the server redirects back.
"use strict";
(function () {
  let busy = false;
  let timer = null;

  function interval() {
    return parseInt(document.body.dataset.refresh || "0", 10) || 0;
  }

  function flash(text, failed) {
    const el = document.getElementById("flash");
    if (!el) return;
    el.textContent = text;
    el.hidden = false;
    el.classList.toggle("failed", !!failed);
  }

  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const res = await fetch(window.location.href, {headers: {"X-Live": "1"}, credentials: "same-origin", cache: "no-store"});
      if (!res.ok) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      document.querySelectorAll("[data-live][id]").forEach(function (region) {
        const fresh = doc.getElementById(region.id);
        if (fresh && fresh.innerHTML !== region.innerHTML) region.innerHTML = fresh.innerHTML;
      });
      document.body.dataset.refresh = doc.body.dataset.refresh || "0";
      const live = document.getElementById("live-indicator");
      if (live) live.hidden = interval() === 0;
    } catch (err) {
      // the server restarted or the network blinked: try again on the next tick
    } finally {
      busy = false;
      schedule();
    }
  }

  function schedule() {
    if (timer) clearTimeout(timer);
    timer = null;
    const ms = interval();
    if (ms > 0) timer = setTimeout(function () {
      if (document.visibilityState === "hidden") schedule(); else refresh();
    }, ms);
  }

  document.addEventListener("submit", async function (event) {
    const form = event.target;
    if (!(form instanceof HTMLFormElement) || !form.hasAttribute("data-action")) return;
    event.preventDefault();
    const button = form.querySelector("button");
    if (button) button.disabled = true;
    try {
      const res = await fetch(form.action, {method: "POST", body: new FormData(form), credentials: "same-origin",
                                            headers: {"X-Requested-With": "fetch", "Accept": "application/json"}});
      const answer = await res.json();
      flash(answer.ok ? answer.message : answer.code + ": " + answer.error, !answer.ok);
    } catch (err) {
      flash("the action could not be sent: " + err, true);
    } finally {
      if (button) button.disabled = false;
    }
    if (interval() === 0) document.body.dataset.refresh = "1500";
    refresh();
  });

  document.addEventListener("DOMContentLoaded", function () {
    const live = document.getElementById("live-indicator");
    if (live) live.hidden = interval() === 0;
    schedule();
  });
})();
