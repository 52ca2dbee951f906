"""Screenshots of the web view's main pages for docs/web.md, taken in Debian's headless Chromium with Selenium.

    python plugins/scheduler-web/screenshots.py .demo/scheduler.db docs/web

``DB`` is the ``make run`` demo database (or any other); the view is served read-write on a free
loopback port for the duration, and one PNG is written per page. Not a test: a maintainer's tool.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import uvicorn
from scheduler_web import WebConfig, create_app
from scheduler_web.server import bind_socket
from selenium import webdriver
from selenium.webdriver.common.by import By

from scheduler.api import ops

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def main(db: str, out: str) -> int:
    """Serve ``db``, open each page, save ``OUT/<page>.png``."""
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    store = ops.open_store(db, create=False)
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app(store, WebConfig(refresh_ms=0)), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,860", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        jobs = ops.list_jobs(store)
        evidenced = next((j for j in jobs if j.get("evidence")), jobs[0])
        run = ops.list_runs(store, job=evidenced["id"], limit=1)[0]
        pages = {"jobs": "/", "job": f"/jobs/{evidenced['id']}", "runs": "/runs", "run": f"/runs/{run['id']}?verify=1",
                 "outbox": "/outbox", "status": "/status?doctor=1"}
        for name, path in pages.items():
            driver.get(url + path)
            driver.find_element(By.TAG_NAME, "main")
            driver.save_screenshot(str(target / f"{name}.png"))
            print(target / f"{name}.png")
    finally:
        driver.quit()
        server.should_exit = True
        thread.join(10)
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
