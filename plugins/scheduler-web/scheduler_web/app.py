"""The web view's ASGI application: pages and actions over ``scheduler.api.ops``, and the rules that keep it safe.

Pages (GET, live-refreshed by ``static/web.js``, which re-fetches the page and swaps its
``data-live`` regions): ``/`` jobs, ``/jobs/{job}``, ``/runs`` (filters, keyset pages),
``/runs/{run}``, ``/approvals``, ``/outbox``, ``/status``. Actions (POST, each the operation the
CLI command calls, so recorded the same way: as the OS account that runs the server):
run now, pause, resume, cancel a run, retry a failed delivery part. Approvals are never
decided here (``WEB_DECISION_REFUSED``): the page shows the CLI command, whose caller's OS
identity is what the approval rule checks (docs/web.md says why).

Safety: an access token, when configured, is required on every request (``Authorization:
Bearer``, or the ``HttpOnly``, ``SameSite=Strict`` cookie a ``?token=`` visit sets): else
401 ``WEB_TOKEN_REQUIRED``. Every action needs the per-process CSRF token in its form
(``csrf``) and, when the browser sends one, an ``Origin`` of this host (else 403
``WEB_CSRF_FAILED``); read-only mode refuses every action (403 ``WEB_READ_ONLY``) and shows
none. Templates autoescape; a Content-Security-Policy allows only this origin's script.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import attrs
import jinja2
from scheduler_toolkit.run_ids import short_run_id
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from scheduler.api import SchedulerError, ops
from scheduler.api.store import Store
from scheduler_web import views

HERE = Path(__file__).resolve().parent
#: The cookie holding the access token once a ``?token=`` visit has set it.
TOKEN_COOKIE = "scheduler_web_token"
#: Run statuses a run page keeps refreshing for (anything else has ended).
LIVE_RUN_STATUSES = frozenset({"pending", "running", "awaiting_approval", "approved", "recovery_blocked"})
#: How many runs the runs page shows at most per page.
MAX_PAGE = 500
#: HTTP status of each refusal code (anything else: 409).
STATUS_OF = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "WEB_TOKEN_REQUIRED": 401, "WEB_CSRF_FAILED": 403,
             "WEB_READ_ONLY": 403, "WEB_DECISION_REFUSED": 403}
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
                                " connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@attrs.frozen
class WebConfig:
    """How one web view process behaves: read-only or not, the access token, its CSRF token, the refresh interval."""

    read_only: bool = False
    #: Required on every request when set (``scheduler web`` sets it from ``--token-file`` / ``$SCHEDULER_WEB_TOKEN``).
    access_token: str | None = None
    #: The per-process token every action's form must carry (new for each process: a restart invalidates old pages).
    csrf_token: str = attrs.field(factory=lambda: secrets.token_urlsafe(32))
    #: How often pages re-fetch their live regions, in milliseconds (0: never).
    refresh_ms: int = 1500


Handler = Callable[[Request], Any]


def create_app(store: Store, config: WebConfig | None = None) -> Starlette:
    """The ASGI application serving ``store`` (kept open; both stores are safe to share between threads)."""
    config = config or WebConfig()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    env.filters["tojson_pretty"] = lambda value: json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)
    env.filters["mask"] = views.mask_target
    env.filters["short"] = lambda value, n=8: (str(value)[:n] if value else "")
    env.filters["short_run"] = lambda value: (short_run_id(str(value)) if value else "")
    templates = Jinja2Templates(env=env)

    def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        context.setdefault("live", config.refresh_ms)
        context.setdefault("message", request.query_params.get("msg"))
        context.update(config=config, path=request.url.path, request_query=str(request.url.query))
        response = templates.TemplateResponse(request, name, context, status_code=status_code)
        response.headers.update(SECURITY_HEADERS)
        return response

    def refusal(request: Request, exc: SchedulerError) -> Response:
        status = STATUS_OF.get(exc.code, 409)
        if _wants_json(request):
            return JSONResponse({"ok": False, "error": exc.message, "code": exc.code}, status_code=status,
                                headers=SECURITY_HEADERS)
        return render(request, "error.html", status_code=status, error=exc, live=0)

    def access_refusal(request: Request) -> Response | None:
        """None when the request may go on; else the 401 (or the redirect that stores a ``?token=`` in its cookie)."""
        token = config.access_token
        if token is None:
            return None
        given = request.query_params.get("token")
        if given is not None and request.method == "GET" and hmac.compare_digest(given.encode(), token.encode()):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            response = RedirectResponse(request.url.path + (f"?{urlencode(rest)}" if rest else ""), status_code=303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/")
            return response
        header = request.headers.get("authorization", "")
        offered = header[len("Bearer "):] if header.startswith("Bearer ") else request.cookies.get(TOKEN_COOKIE, "")
        if offered and hmac.compare_digest(offered.encode(), token.encode()):
            return None
        return refusal(request, SchedulerError("WEB_TOKEN_REQUIRED", "this web view needs its access token: open it once"
                                                                     " as /?token=TOKEN, or send Authorization: Bearer TOKEN"))

    def page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            refused = access_refusal(request)
            if refused is not None:
                return refused
            try:
                return await run_in_threadpool(handler, request)
            except SchedulerError as exc:
                return refusal(request, exc)
        return endpoint

    def action(handler: Callable[[Request, dict[str, str]], tuple[str, str]]) -> Callable[[Request], Awaitable[Response]]:
        """A POST that changes state: access, CSRF and read-only checks, then ``handler`` -> (message, where to go)."""
        async def endpoint(request: Request) -> Response:
            refused = access_refusal(request)
            if refused is not None:
                return refused
            form = {k: str(v) for k, v in (await request.form()).items()}
            try:
                check_csrf(request, form, config)
                if config.read_only:
                    raise SchedulerError("WEB_READ_ONLY", "this web view is read-only (--read-only): use the CLI")
                message, where = await run_in_threadpool(handler, request, form)
            except SchedulerError as exc:
                return refusal(request, exc)
            if _wants_json(request):
                return JSONResponse({"ok": True, "message": message, "location": where}, headers=SECURITY_HEADERS)
            back = _local_path(form.get("next")) or where
            return RedirectResponse(back + ("&" if "?" in back else "?") + urlencode({"msg": message}), status_code=303)
        return endpoint

    # -- pages ---------------------------------------------------------------------------------

    def jobs_page(request: Request) -> Response:
        state = request.query_params.get("state") or None
        jobs = ops.list_jobs(store, state=state)
        for job in jobs:
            job["schedule_words"] = views.schedule_words(job)
        return render(request, "jobs.html", jobs=jobs, state=state or "")

    def job_page(request: Request) -> Response:
        job = ops.get_job(store, request.path_params["job"])
        runs = ops.list_runs(store, job=job["id"], limit=50)
        return render(request, "job.html", job=job, spec=views.masked_job(job), words=views.schedule_words(job), runs=runs,
                      chart=views.duration_chart(runs), fires=ops.next_runs(store, job["id"], 5)["fires"])

    def runs_page(request: Request) -> Response:
        q = request.query_params
        job = q.get("job") or None
        status = q.get("status") or None
        before = q.get("before") or None
        since, until = views.parse_instant(q.get("since"), "since"), views.parse_instant(q.get("until"), "until")
        limit = _int(q.get("limit"), 50, 1, MAX_PAGE)
        runs = ops.list_runs(store, job=job, status=status, limit=limit + 1, before=before, since_ms=since, until_ms=until)
        more = len(runs) > limit
        runs = runs[:limit]
        names = ops.job_names(store) if runs else {}
        older = None
        if more:
            keep = [(k, v) for k, v in q.multi_items() if k not in ("before", "msg")]
            older = "/runs?" + urlencode([*keep, ("before", runs[-1]["id"])])
        return render(request, "runs.html", runs=runs, names=names, older=older, filters={
            "job": job or "", "status": status or "", "since": q.get("since") or "", "until": q.get("until") or "",
            "limit": limit}, statuses=ops_statuses(), paged=before is not None)

    def run_page(request: Request) -> Response:
        run = ops.get_run(store, request.path_params["run"])
        job = _job_or_none(run["job_id"])
        events = ops.run_events(store, run["id"])
        output: dict[str, Any] | None = None
        output_error: SchedulerError | None = None
        try:
            output = ops.run_output(store, run["id"])
        except SchedulerError as exc:
            output_error = exc
        evidence: dict[str, Any] | None = None
        evidence_error: SchedulerError | None = None
        declared = bool(job and (job.get("evidence") or job.get("evidence_ref")))
        if request.query_params.get("verify") and run["status"] not in LIVE_RUN_STATUSES:
            try:
                evidence = ops.verify_evidence(store, run["id"])
            except SchedulerError as exc:
                evidence_error = exc
        parts = ops.list_deliveries(store, run=run["id"])
        approvals = [a for a in ops.list_approvals(store, job=run["job_id"], limit=100) if a.get("run_id") == run["id"]]
        live = config.refresh_ms if run["status"] in LIVE_RUN_STATUSES else 0
        return render(request, "run.html", run=run, job=job, events=events, output=output, output_error=output_error,
                      evidence=evidence, evidence_error=evidence_error, evidence_declared=declared,
                      verified=bool(request.query_params.get("verify")), parts=parts, approvals=approvals, live=live,
                      cancellable=run["status"] in LIVE_RUN_STATUSES)

    def approvals_page(request: Request) -> Response:
        return render(request, "approvals.html", approvals=ops.list_approvals(store, pending=True))

    def outbox_page(request: Request) -> Response:
        failed = ops.list_deliveries(store, status="failed", limit=200)
        pending = ops.list_deliveries(store, status="pending", limit=200)
        return render(request, "outbox.html", failed=failed, pending=pending)

    def status_page(request: Request) -> Response:
        """The status (live); ``doctor`` checks only on request (``?doctor=1``): they re-verify artifacts and evidence,
        seconds on a big history, so the page never runs them on every refresh."""
        status = ops.status(store)
        doctor = ops.doctor(store) if request.query_params.get("doctor") else None
        dispatchers = [lease for lease in status["leases"] if lease["live"] and lease["name"] != "maintenance"]
        return render(request, "status.html", status=status, doctor=doctor, dispatchers=dispatchers,
                      live=0 if doctor is not None else config.refresh_ms)

    def _job_or_none(job_id: str) -> dict[str, Any] | None:
        try:
            return ops.get_job(store, job_id)
        except SchedulerError as exc:
            if exc.code == "NOT_FOUND":
                return None
            raise

    # -- actions -------------------------------------------------------------------------------

    def run_now(request: Request, form: dict[str, str]) -> tuple[str, str]:
        job = ops.get_job(store, request.path_params["job"])
        ops.run_job(store, job["id"])
        return f"queued a run of {job['name']}", f"/jobs/{job['id']}"

    def pause(request: Request, form: dict[str, str]) -> tuple[str, str]:
        job = ops.pause_job(store, request.path_params["job"])
        return f"paused {job['name']}", f"/jobs/{job['id']}"

    def resume(request: Request, form: dict[str, str]) -> tuple[str, str]:
        job = ops.resume_job(store, request.path_params["job"])
        return f"resumed {job['name']}", f"/jobs/{job['id']}"

    def cancel(request: Request, form: dict[str, str]) -> tuple[str, str]:
        done = ops.cancel_run(store, request.path_params["run"], reason=form.get("reason") or "cancelled in the web view")
        return f"run {short_run_id(done['run_id'])}: {done['outcome']}", f"/runs/{done['run_id']}"

    def retry(request: Request, form: dict[str, str]) -> tuple[str, str]:
        part = ops.retry_delivery(store, request.path_params["part"])
        return f"re-armed delivery part {part['id']}", "/outbox"

    def decide(request: Request, form: dict[str, str]) -> tuple[str, str]:
        ref = request.path_params["approval"]
        verb = "approve" if request.path_params["decision"] == "approve" else "reject"
        raise SchedulerError("WEB_DECISION_REFUSED", f"approvals are decided with the CLI, as the OS account the approval's"
                                                     f" scope names: scheduler approvals {verb} {ref}")

    routes = [
        Route("/", page(jobs_page), methods=["GET"]),
        Route("/jobs/{job:path}/run", action(run_now), methods=["POST"]),
        Route("/jobs/{job:path}/pause", action(pause), methods=["POST"]),
        Route("/jobs/{job:path}/resume", action(resume), methods=["POST"]),
        Route("/jobs/{job:path}", page(job_page), methods=["GET"]),
        Route("/runs", page(runs_page), methods=["GET"]),
        Route("/runs/{run}/cancel", action(cancel), methods=["POST"]),
        Route("/runs/{run}", page(run_page), methods=["GET"]),
        Route("/approvals", page(approvals_page), methods=["GET"]),
        Route("/approvals/{approval}/{decision}", action(decide), methods=["POST"]),
        Route("/outbox", page(outbox_page), methods=["GET"]),
        Route("/deliveries/{part:path}/retry", action(retry), methods=["POST"]),
        Route("/status", page(status_page), methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)


def ops_statuses() -> tuple[str, ...]:
    """The run statuses the runs filter offers (those ``list_runs`` accepts)."""
    return ("pending", "running", "ok", "error", "timeout", "cancelled", "crashed", "skipped", "awaiting_approval",
            "approved", "recovery_blocked")


def check_csrf(request: Request, form: dict[str, str], config: WebConfig) -> None:
    """Refuse an action without this process's CSRF token, or one a browser sent from another origin (``WEB_CSRF_FAILED``)."""
    given = form.get("csrf", "")
    if not given or not hmac.compare_digest(given.encode(), config.csrf_token.encode()):
        raise SchedulerError("WEB_CSRF_FAILED", "the form's CSRF token is missing or stale (reload the page)")
    origin = request.headers.get("origin")
    if origin and origin != "null":
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc != host:
            raise SchedulerError("WEB_CSRF_FAILED", f"a request from {origin} may not act on this web view")
    elif origin == "null":
        raise SchedulerError("WEB_CSRF_FAILED", "a request from an opaque origin may not act on this web view")


def _wants_json(request: Request) -> bool:
    """Whether the caller is ``web.js`` (or a script) asking for a JSON answer instead of a page or redirect."""
    return request.headers.get("x-requested-with") == "fetch" or "application/json" in request.headers.get("accept", "")


def _local_path(value: str | None) -> str | None:
    """``value`` when it is a path on this site (``/...``, not ``//host``): where an action may send the browser back."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return None


def _int(text: str | None, default: int, low: int, high: int) -> int:
    """A bounded integer query parameter (``INVALID_ARGUMENT`` when it is not one)."""
    if text is None or text == "":
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise SchedulerError("INVALID_ARGUMENT", f"limit: expected an integer from {low} to {high}, got {text!r}")
    return int(text)
