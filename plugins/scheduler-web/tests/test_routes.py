"""Every route of the web view against a real database (SQLite and PostgreSQL), with real runs from a real dispatcher.

Pages render what ``scheduler.api.ops`` reads; actions change what the CLI's commands change
(checked by reading back through the facade); the safety rules refuse with their codes and
store nothing: CSRF, Origin, read-only, the access token, approvals never decided here;
output and names are escaped; a secret-bearing delivery URL is never shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from scheduler_web import WebConfig, create_app
from starlette.testclient import TestClient

from scheduler.api import ops
from scheduler.testing import add_job, run_rows, wait_for

TERMINAL = ("ok", "error", "timeout", "cancelled", "crashed", "skipped")
XSS = "<script>alert('x')</script>"


def finished(store: Any, job: dict[str, Any], count: int = 1) -> list[dict[str, Any]]:
    """Wait until ``job`` has ``count`` ended runs; its runs, oldest first."""
    return wait_for(lambda: (rows := run_rows(store, job["id"])) and len([r for r in rows if r["status"] in TERMINAL]) >= count
                    and rows, timeout=30, what="finished runs")


def post(client: TestClient, config: WebConfig, url: str, **form: str) -> Any:
    """An action as web.js sends it (the CSRF token in the form, a JSON answer)."""
    return client.post(url, data={"csrf": config.csrf_token, **form}, headers={"X-Requested-With": "fetch"})


def test_every_page_renders_what_the_facade_reads(store: Any, client: TestClient, dispatcher: Callable[..., Any]) -> None:
    ok = add_job(store, name="alpha", payload_message="echo:hello web", evidence={"provider": "checksum"})
    bad = add_job(store, name="beta", payload_message="fail")
    add_job(store, name="hourly", schedule_kind="every", schedule_every="1h", payload_message="ok")
    for job in (ok, bad):
        ops.run_job(store, job["id"])
    d = dispatcher()
    finished(store, ok), finished(store, bad)
    d.stop()
    page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
    for job in ops.list_jobs(store):
        assert f'data-job="{job["name"]}"' in page.text
    assert "every 1h" in page.text and "manual only" in page.text
    hourly = client.get("/jobs/hourly").text
    assert all(f["local"] in hourly for f in ops.next_runs(store, "hourly", 5)["fires"])
    assert len(re.findall(r'<span title="[^"]+Z">', hourly)) == 5
    job_page = client.get(f"/jobs/{ok['id']}")
    assert job_page.status_code == 200 and ok["artifact_digest"] in job_page.text
    assert '<svg class="chart"' in job_page.text and 'data-status="ok"' in job_page.text
    assert client.get("/jobs/alpha").status_code == 200  # by name, as the CLI takes it
    (run,) = run_rows(store, ok["id"])
    run_page = client.get(f"/runs/{run['id']}")
    assert run_page.status_code == 200
    assert '<pre class="output" id="stdout">hello web</pre>' in run_page.text
    assert ops.run_output(store, run["id"])["streams"]["stdout"]["sha256"] in run_page.text
    for event in ops.run_events(store, run["id"]):
        assert event["kind"] in run_page.text
    assert "not re-verified in this view yet" in run_page.text
    verified = client.get(f"/runs/{run['id']}?verify=1")
    assert 'data-verdict="verified"' in verified.text
    assert client.get("/runs").status_code == 200
    errors = client.get("/runs?status=error")
    assert list(re.findall(r'data-run="([^"]+)"', errors.text)) == [r["id"] for r in ops.list_runs(store, status="error")]
    assert client.get("/approvals").status_code == 200 and "Nothing waits for a decision" in client.get("/approvals").text
    assert client.get("/outbox").status_code == 200
    status = client.get("/status")
    assert status.status_code == 200 and "not running" in status.text and 'data-check=' not in status.text
    doctor = client.get("/status?doctor=1")
    assert [c["check"] for c in ops.doctor(store)["checks"]] == re.findall(r'data-check="([^"]+)"', doctor.text)
    assert client.get("/static/web.js").status_code == 200


def test_runs_page_filters_and_pages_by_a_keyset_cursor(store: Any, client: TestClient, dispatcher: Callable[..., Any]) -> None:
    job = add_job(store, name="many", payload_message="ok", overlap_policy="allow")
    other = add_job(store, name="other", payload_message="ok")
    for _ in range(5):
        ops.run_job(store, job["id"])
    ops.run_job(store, other["id"])
    d = dispatcher()
    finished(store, job, 5), finished(store, other)
    d.stop()
    newest_first = [r["id"] for r in ops.list_runs(store, job="many", limit=10)]
    seen: list[str] = []
    url: str | None = "/runs?job=many&limit=2"
    while url:
        page = client.get(url)
        assert page.status_code == 200
        seen += re.findall(r'data-run="([^"]+)"', page.text)
        found = re.search(r'<a href="([^"]+)" rel="next">', page.text)
        url = found.group(1).replace("&amp;", "&") if found else None
    assert seen == newest_first  # three pages of 2, 2 and 1, in order, nothing twice
    # each run is shown as the CLI lists it: the random end of its time-ordered id (its start is shared by the five)
    shown = re.findall(r'<a href="/runs/([^"]+)"><code>([^<]+)</code></a>', client.get("/runs?job=many").text)
    assert [(run_id, run_id[-8:]) for run_id in newest_first] == shown
    assert len({run_id[:8] for run_id in newest_first}) < 5 and len({code for _id, code in shown}) == 5
    assert f"<h1>Run <code>{newest_first[0][-8:]}</code>" in client.get(f"/runs/{newest_first[0]}").text
    created = sorted(r["created_at"] for r in run_rows(store, job["id"]))
    from scheduler_toolkit.timeutil import to_iso

    since, until = created[0] + 1, created[-1]  # runs claimed in one pass share an instant: compare with the rows
    expected = sorted(r["id"] for r in run_rows(store, job["id"]) if since <= r["created_at"] < until)
    window = client.get(f"/runs?job=many&since={to_iso(since)}&until={to_iso(until)}")
    assert sorted(re.findall(r'data-run="([^"]+)"', window.text)) == expected
    everything = client.get(f"/runs?job=many&since={to_iso(created[0])}&until={to_iso(created[-1] + 1)}")
    assert len(re.findall(r'data-run="', everything.text)) == 5
    assert client.get("/runs?since=yesterday").status_code == 400
    assert client.get("/runs?limit=0").status_code == 400
    assert client.get("/runs?status=nope").status_code == 400
    assert client.get("/runs?job=ghost").status_code == 404


def test_actions_do_what_the_cli_does(store: Any, client: TestClient, config: WebConfig,
                                      dispatcher: Callable[..., Any]) -> None:
    job = add_job(store, name="act", schedule_kind="every", schedule_every="1h", payload_message="ok")
    answer = post(client, config, f"/jobs/{job['id']}/pause")
    assert answer.status_code == 200 and answer.json()["ok"] is True
    assert ops.get_job(store, "act")["state"] == "paused"
    assert post(client, config, "/jobs/act/run").json()["code"] == "JOB_DISABLED"
    assert post(client, config, "/jobs/act/resume").json()["ok"] is True
    assert ops.get_job(store, "act")["state"] == "enabled"
    assert post(client, config, "/jobs/act/run").json()["message"] == "queued a run of act"
    assert [q["kind"] for q in ops.list_queue(store, job="act", status="pending")] == ["manual"]
    # a plain form post (no JavaScript) is redirected back with the message
    plain = client.post("/jobs/act/pause", data={"csrf": config.csrf_token, "next": "/"}, follow_redirects=False)
    assert plain.status_code == 303 and plain.headers["location"].startswith("/?msg=paused")
    assert client.post("/jobs/act/resume", data={"csrf": config.csrf_token, "next": "//evil.example/"},
                       follow_redirects=False).headers["location"].startswith(f"/jobs/{job['id']}?msg=")
    # cancel a running run
    sleeper = add_job(store, name="sleeper", payload_message="sleep:30")
    ops.run_job(store, sleeper["id"])
    d = dispatcher()
    (running,) = wait_for(lambda: [r for r in run_rows(store, sleeper["id"]) if r["status"] == "running"], timeout=20,
                          what="a running run")
    assert post(client, config, f"/runs/{running['id']}/cancel").json()["message"].endswith("requested")
    wait_for(lambda: run_rows(store, sleeper["id"])[0]["status"] == "cancelled", timeout=20, what="cancelled")
    d.stop()
    assert post(client, config, f"/runs/{running['id']}/cancel").json()["code"] == "RUN_ALREADY_FINISHED"
    assert ops.get_run(store, running["id"])["cancel_reason"] == "cancelled in the web view"
    assert post(client, config, "/deliveries/nope/retry").status_code == 404


def test_refusals_store_nothing(store: Any, client: TestClient, config: WebConfig) -> None:
    job = add_job(store, name="guarded", schedule_kind="every", schedule_every="1h", payload_message="ok")
    before = ops.get_job(store, "guarded")
    no_token = client.post(f"/jobs/{job['id']}/pause", headers={"X-Requested-With": "fetch"})
    assert (no_token.status_code, no_token.json()["code"]) == (403, "WEB_CSRF_FAILED")
    stale = client.post(f"/jobs/{job['id']}/pause", data={"csrf": "x" * 43}, headers={"X-Requested-With": "fetch"})
    assert stale.json()["code"] == "WEB_CSRF_FAILED"
    foreign = client.post(f"/jobs/{job['id']}/pause", data={"csrf": config.csrf_token},
                          headers={"Origin": "http://evil.example", "X-Requested-With": "fetch"})
    assert (foreign.status_code, foreign.json()["code"]) == (403, "WEB_CSRF_FAILED")
    same = client.post(f"/jobs/{job['id']}/run", data={"csrf": config.csrf_token},
                       headers={"Origin": "http://testserver", "X-Requested-With": "fetch"})
    assert same.json()["ok"] is True
    ops.cancel_job(store, "guarded")
    assert client.get("/jobs/nope").status_code == 404
    # approvals: never decided here, whatever the form says; the page shows the CLI command
    gated = add_job(store, name="gated", payload_message="ok", approval_required=True)
    ops.run_job(store, gated["id"])
    refused = post(client, config, "/approvals/abc/approve", approver="root")
    assert (refused.status_code, refused.json()["code"]) == (403, "WEB_DECISION_REFUSED")
    assert "scheduler approvals approve abc" in refused.json()["error"]
    assert {k: v for k, v in ops.get_job(store, "guarded").items() if k != "updated_at"} == \
        {k: v for k, v in before.items() if k != "updated_at"}


def test_read_only_mode_shows_no_action_and_refuses_every_one(store: Any) -> None:
    config = WebConfig(read_only=True)
    job = add_job(store, name="ro", schedule_kind="every", schedule_every="1h", payload_message="ok")
    with TestClient(create_app(store, config)) as client:
        page = client.get("/")
        assert "read-only" in page.text and "data-action" not in page.text and "Run now" not in page.text
        refused = post(client, config, f"/jobs/{job['id']}/pause")
        assert (refused.status_code, refused.json()["code"]) == (403, "WEB_READ_ONLY")
    assert ops.get_job(store, "ro")["state"] == "enabled"


def test_an_access_token_is_required_on_every_request(store: Any) -> None:
    token = "t" * 32
    config = WebConfig(access_token=token)
    add_job(store, name="secretive", payload_message="ok")
    with TestClient(create_app(store, config)) as client:
        for url in ("/", "/runs", "/status", "/outbox", "/approvals"):  # (the static script and style carry no data)
            refused = client.get(url)
            assert refused.status_code == 401 and "WEB_TOKEN_REQUIRED" in refused.text
            assert token not in refused.text
        assert client.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert client.get("/?token=wrong", follow_redirects=False).status_code == 401
        visit = client.get(f"/runs?job=secretive&token={token}", follow_redirects=False)
        assert visit.status_code == 303 and visit.headers["location"] == "/runs?job=secretive"
        cookie = visit.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        page = client.get("/runs?job=secretive")  # the cookie the visit set
        assert page.status_code == 200 and token not in page.text
        assert client.post("/jobs/secretive/run", data={"csrf": config.csrf_token},
                           headers={"X-Requested-With": "fetch"}).json()["ok"] is True
    with TestClient(create_app(store, config)) as stranger:  # no cookie: an action is refused before anything else
        refused = stranger.post("/jobs/secretive/run", data={"csrf": config.csrf_token}, headers={"X-Requested-With": "fetch"})
        assert (refused.status_code, refused.json()["code"]) == (401, "WEB_TOKEN_REQUIRED")
    assert [q["kind"] for q in ops.list_queue(store, job="secretive")] == ["manual"]


def test_output_names_and_targets_are_escaped_and_no_secret_is_shown(store: Any, client: TestClient,
                                                                     dispatcher: Callable[..., Any]) -> None:
    job = add_job(store, name="xss-<b>bold</b>", payload_message="echo:" + XSS, description=XSS,
                  delivery_mode="always", delivery_channel="webhook",
                  delivery_to="http://127.0.0.1:9/hooks/T000/B000/s3cr3tpath?key=s3cr3tkey")
    ops.run_job(store, job["id"])
    d = dispatcher()
    (run,) = finished(store, job)
    d.stop()
    for url in ("/", f"/jobs/{job['id']}", f"/runs/{run['id']}", "/runs", "/outbox"):
        text = client.get(url).text
        assert XSS not in text and "<b>bold</b>" not in text, url
        assert "s3cr3t" not in text, url
    text = client.get(f"/runs/{run['id']}").text
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in text
    assert "http://127.0.0.1:9/…" in client.get(f"/jobs/{job['id']}").text
