"""The web view in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by Selenium).

One browser, one uvicorn server and one real dispatcher for the module, on a SQLite file (the
route tests cover PostgreSQL). The paths are given explicitly, so Selenium Manager never tries
to download a browser; without them the module skips, saying which is missing. Each test checks
that the page did not reload (a marker set on ``window`` survives) where the issue asks for it.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from scheduler_toolkit.settings import reload_settings
from scheduler_web import WebConfig, create_app
from scheduler_web.server import bind_socket

from scheduler.api import ops
from scheduler.testing import RunningDispatcher, add_job, isolate_settings, run_rows, wait_for
from scheduler.testing.http import LoopbackHTTPServer, Reply

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
MISSING = [p for p in (CHROMIUM, CHROMEDRIVER) if not (os.path.isfile(p) and os.access(p, os.X_OK))]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"no {' and no '.join(MISSING)}: apt-get install chromium"
                                                      " chromium-driver to run the browser tests")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install scheduler-web[test])")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

WAIT_S = 20
XSS = "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">"


class WebServer:
    """``scheduler web``'s app served by uvicorn in a thread, on a free loopback port."""

    def __init__(self, store: Any, config: WebConfig) -> None:
        sock = bind_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(create_app(store, config), log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=10, what="uvicorn start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The module's database, receiver, dispatcher, server and browser.

    The webhook channel has no signing secret here (every test runs with isolated settings), so each
    delivery fails (``WEBHOOK_NOT_CONFIGURED``) before it reaches the receiver: a failed part to retry.
    """
    tmp = tmp_path_factory.mktemp("web-browser")
    with pytest.MonkeyPatch.context() as mp:
        isolate_settings(mp, tmp / "xdg-config")
        receiver = LoopbackHTTPServer()
        receiver.default("/hook", Reply(status=400, json={"error": "bad"}))
        store = ops.open_store(str(tmp / "scheduler.db"))
        dispatcher = RunningDispatcher(store)
        config = WebConfig(refresh_ms=400)
        server = WebServer(store, config)
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900",
                    f"--user-data-dir={tmp / 'chromium-profile'}"):
            options.add_argument(arg)
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
        driver.implicitly_wait(0)
        try:
            yield {"store": store, "server": server, "driver": driver, "receiver": receiver, "tmp": tmp}
        finally:
            driver.quit()
            server.stop()
            dispatcher.stop()
            store.close()
            receiver.close()
            reload_settings()
    shutil.rmtree(tmp / "chromium-profile", ignore_errors=True)


def wait(driver: Any, condition: Any, what: str) -> Any:
    """``condition(driver)`` once truthy (within ``WAIT_S``); the failure names ``what``."""
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, message=f"waiting for {what}")


def mark(driver: Any) -> None:
    """Set a marker on ``window`` that a reload would drop."""
    driver.execute_script("window.__noReload = 'still here';")


def not_reloaded(driver: Any) -> bool:
    return driver.execute_script("return window.__noReload;") == "still here"


def test_jobs_page_lists_the_jobs(world: dict[str, Any]) -> None:
    store, driver = world["store"], world["driver"]
    add_job(store, name="listed", schedule_kind="every", schedule_every="1h", payload_message="ok")
    driver.get(world["server"].url + "/")
    row = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-job="listed"]'), "the job's row")[0]
    assert "every 1h" in row.text and row.find_element(By.CSS_SELECTOR, "[data-state]").text == "enabled"


def test_run_now_shows_the_run_appear_and_finish_without_reload_then_its_output(world: dict[str, Any]) -> None:
    store, driver = world["store"], world["driver"]
    job = add_job(store, name="clicked", payload_message="sleep:1;echo:clicked output")
    driver.get(f"{world['server'].url}/jobs/{job['id']}")
    mark(driver)
    assert driver.find_elements(By.CSS_SELECTOR, "#job-runs tr[data-run]") == []
    driver.find_element(By.XPATH, "//section[@id='job-head']//button[text()='Run now']").click()
    wait(driver, lambda d: "queued a run of clicked" in d.find_element(By.ID, "flash").text, "the action's message")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '#job-runs tr[data-run] td[data-status="running"]'), "the run running")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, '#job-runs tr[data-run] td[data-status="ok"]'), "the run finished ok")
    assert not_reloaded(driver)
    (run,) = run_rows(store, job["id"])
    driver.find_element(By.CSS_SELECTOR, f'#job-runs tr[data-run="{run["id"]}"] a').click()
    wait(driver, lambda d: d.find_elements(By.ID, "run-status"), "the run page")
    assert driver.find_element(By.ID, "run-status").get_attribute("data-status") == "ok"
    assert driver.find_element(By.ID, "stdout").text == "clicked output"
    assert ops.run_output(store, run["id"])["streams"]["stdout"]["sha256"] in driver.find_element(By.ID, "run-output").text
    timeline = driver.find_element(By.ID, "run-events").text
    assert all(e["kind"] in timeline for e in ops.run_events(store, run["id"]))


def test_output_is_shown_and_an_xss_payload_renders_as_text(world: dict[str, Any]) -> None:
    store, driver = world["store"], world["driver"]
    job = add_job(store, name="xss", payload_message="echo:" + XSS, description=XSS)
    ops.run_job(store, job["id"])
    (run,) = wait_for(lambda: [r for r in run_rows(store, job["id"]) if r["status"] == "ok"], timeout=WAIT_S, what="run ok")
    driver.get(f"{world['server'].url}/runs/{run['id']}")
    stdout = wait(driver, lambda d: d.find_elements(By.ID, "stdout"), "the output")[0]
    assert stdout.text == XSS
    driver.get(world["server"].url + "/")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-job="xss"]'), "the jobs page")
    assert XSS in driver.find_element(By.CSS_SELECTOR, 'tr[data-job="xss"]').text
    assert driver.execute_script("return window.__xss === undefined;")


def test_pause_and_resume_a_job_without_reload(world: dict[str, Any]) -> None:
    store, driver = world["store"], world["driver"]
    job = add_job(store, name="pausable", schedule_kind="every", schedule_every="1h", payload_message="ok")
    driver.get(f"{world['server'].url}/jobs/{job['id']}")
    mark(driver)
    driver.find_element(By.XPATH, "//section[@id='job-head']//button[text()='Pause']").click()
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#job-head [data-state]").text == "paused", "paused")
    assert ops.get_job(store, "pausable")["state"] == "paused"
    driver.find_element(By.XPATH, "//section[@id='job-head']//button[text()='Resume']").click()
    wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#job-head [data-state]").text == "enabled", "enabled again")
    assert ops.get_job(store, "pausable")["state"] == "enabled" and not_reloaded(driver)


def test_a_failed_delivery_part_is_shown_and_retried(world: dict[str, Any]) -> None:
    store, driver, receiver = world["store"], world["driver"], world["receiver"]
    job = add_job(store, name="delivers", payload_message="echo:report", delivery_mode="always", delivery_channel="webhook",
                  delivery_to=f"{receiver.url}/hook")
    ops.run_job(store, job["id"])
    wait_for(lambda: (parts := ops.list_deliveries(store, job=job["id"])) and all(p["status"] == "failed" for p in parts),
             timeout=WAIT_S, what="the part failed")
    (part,) = ops.list_deliveries(store, job=job["id"])
    driver.get(world["server"].url + "/outbox")
    mark(driver)
    row = wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-part="{part["id"]}"][data-part-status="failed"]'),
               "the failed part")[0]
    assert part["error_code"] in row.text
    row.find_element(By.XPATH, ".//button[text()='Retry']").click()
    wait(driver, lambda d: "re-armed delivery part" in d.find_element(By.ID, "flash").text, "the retry's message")
    wait_for(lambda: ops.get_delivery(store, part["id"])["last_attempt_at"] != part["last_attempt_at"], timeout=WAIT_S,
             what="the part attempted again")
    assert not_reloaded(driver)
