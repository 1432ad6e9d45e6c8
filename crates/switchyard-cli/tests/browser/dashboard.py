#!/usr/bin/env python3
"""The dashboard's browser test: headless Chromium, driven over the WebDriver protocol
by ChromeDriver, against a live `switchyard serve`. Standard library only.

Run by crates/switchyard-cli/tests/dashboard.rs, which passes the queue configuration in
the environment with:
  SWITCHYARD_BIN   the switchyard binary
  OUT_DIR          where the screenshots go
  CHROMIUM, CHROMEDRIVER  the browser and its driver (default: Debian's paths)

It checks that the page shows the queue counts changing while a worker runs, that the
Replay button puts a dead letter back on its queue, and that a job's page follows it
live over Server-Sent Events; it measures how long after a job ended its last event
reached the page. Exits non-zero with a reason when anything does not hold.
"""

import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

BIN = os.environ["SWITCHYARD_BIN"]
OUT = os.environ["OUT_DIR"]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
TOKEN = os.environ.get("SWITCHYARD_ADMIN_TOKEN", "")
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"

children = []


def log(*args):
    print("dashboard.py:", *args, flush=True)


current = None  # the browser, for a last screenshot when something fails


def fail(reason):
    log("FAILED:", reason)
    browser = current
    if browser is not None:
        globals()["current"] = None
        try:
            browser.screenshot("failure.png")
            log("the page said:", browser.js("return document.body.innerText"))
        except (SystemExit, Exception):  # the browser itself may be what failed
            pass
    raise SystemExit(1)


def spawn(args, **kw):
    p = subprocess.Popen(args, **kw)
    children.append(p)
    return p


def switchyard(*args, stdin=None):
    out = subprocess.run([BIN, *args], input=stdin, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"switchyard {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        fail(f"{method} {url}: {e.code} {e.read().decode(errors='replace')}")


class Browser:
    def __init__(self):
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        spawn([CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        until(lambda: self._ready(), "ChromeDriver to start", 20)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--window-size=1280,1100"]},
        }}}
        self.session = http("POST", self.base + "/session", caps)["value"]["sessionId"]

    def _ready(self):
        try:
            with urllib.request.urlopen(self.base + "/status", timeout=2) as r:
                return json.loads(r.read())["value"]["ready"]
        except (OSError, ValueError, KeyError):
            return False

    def cmd(self, method, path, body=None):
        return http(method, f"{self.base}/session/{self.session}{path}", body)["value"]

    def go(self, url):
        self.cmd("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        return self.cmd("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def click(self, css):
        self.cmd("POST", f"/element/{self.find(css)}/click", {})

    def type(self, css, text):
        self.cmd("POST", f"/element/{self.find(css)}/value", {"text": text})

    def screenshot(self, name):
        path = os.path.join(OUT, name)
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.cmd("GET", "/screenshot")))
        log("screenshot:", path)

    def close(self):
        try:
            http("DELETE", f"{self.base}/session/{self.session}")
        except SystemExit:
            pass


def until(check, what, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    fail(f"gave up waiting for {what} after {timeout}s")


QUEUE_ROW = """
const tr = document.querySelector(`#queues tbody tr[data-queue="${arguments[0]}"]`);
if (!tr) return null;
const n = (c) => Number(tr.querySelector("td." + c).textContent);
return {ready: n("ready"), reserved: n("reserved"), delayed: n("delayed"), dead: n("dead")};
"""


def main():
    os.makedirs(OUT, exist_ok=True)
    serve = spawn([BIN, "serve", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    line = serve.stdout.readline().strip()
    url = line.rsplit(" ", 1)[-1].rstrip("/")
    if not url.startswith("http://"):
        fail(f"serve said {line!r}")
    log("serving", url)

    queue = "invoices-" + uuid.uuid4().hex[:8]
    jobs = 40
    switchyard("publish", "--queue", queue, "--kind", "invoice",
               stdin="".join('{"n": %d}\n' % i for i in range(jobs)))
    bad = switchyard("publish", "--queue", queue, "--kind", "bad", "--payload", "{}").strip()

    browser = Browser()
    globals()["current"] = browser
    try:
        browser.go(url + "/")
        first = until(lambda: browser.js(QUEUE_ROW, queue), "the queue's row")
        if first["ready"] != jobs + 1:
            until(lambda: (browser.js(QUEUE_ROW, queue) or {}).get("ready") == jobs + 1,
                  f"{jobs + 1} ready on the page")
        log("page shows", browser.js(QUEUE_ROW, queue))

        # A worker: invoices take 0.25 s each, two at a time; the bad one fails for good.
        handler = ('if [ "$SWITCHYARD_KIND" = bad ]; then echo "no such invoice" >&2; exit 3; fi; '
                   'sleep 0.25; echo \'{"sent": true}\'')
        worker = spawn([BIN, "work", "--queue", queue, "--exec", handler, "--concurrency", "2",
                        "--max-attempts", "1", "--drain"], stdout=subprocess.DEVNULL)
        seen = []
        deadline = time.time() + 60
        while time.time() < deadline:
            row = browser.js(QUEUE_ROW, queue)
            if row and (not seen or seen[-1] != row):
                seen.append(row)
            if row and row["ready"] == 0 and row["reserved"] == 0 and row["dead"] == 1:
                break
            time.sleep(0.1)
        else:
            fail(f"the page never showed the queue drained; it showed {seen}")
        if worker.wait(timeout=60) != 0:
            fail("the worker failed")
        readies = [r["ready"] for r in seen]
        log("ready counts the page showed while the worker ran:", readies)
        if len(set(readies)) < 3:
            fail(f"the counts did not change as jobs ran: {seen}")
        if readies != sorted(readies, reverse=True):
            fail(f"the ready count went up while draining: {readies}")

        # The dead letter, with its error, and its Replay button.
        row = f'#dead tbody tr[data-id="{bad}"]'
        until(lambda: browser.js(f"return document.querySelector('{row}') !== null"), "the dead letter's row")
        error = browser.js(f"return document.querySelector('{row} td.err').textContent")
        if "no such invoice" not in error:
            fail(f"the dead letter's error shows {error!r}")
        browser.screenshot("dashboard-dead-letter.png")
        if TOKEN:
            browser.type("#token", TOKEN)
        browser.click(f'{row} button.replay')
        until(lambda: browser.js(f"return document.querySelector('{row}') === null"),
              "the dead letter to leave the table")
        until(lambda: (browser.js(QUEUE_ROW, queue) or {}).get("dead") == 0
              and browser.js(QUEUE_ROW, queue)["ready"] == 1, "the replayed message back on its queue")
        message = browser.js("return document.getElementById('dead-message').textContent")
        if "Replayed" not in message:
            fail(f"the page said {message!r} after the replay")
        log("replayed with the button:", message)
        status = http("GET", f"{url}/api/jobs/{bad}")
        if status["state"] != "pending":
            fail(f"the replayed job's status is {status['state']}")
        time.sleep(1.2)  # one more refresh, for the screenshot
        browser.screenshot("dashboard.png")

        # A job's page follows it live; how long after the job ended does its last
        # event reach the page?
        live = "reports-" + uuid.uuid4().hex[:8]
        handler = 'sleep 1; echo "{\\"done_at_ms\\": $(date +%s%3N)}"'
        spawn([BIN, "work", "--queue", live, "--exec", handler], stdout=subprocess.DEVNULL)
        latencies = []
        for _ in range(7):
            job = switchyard("publish", "--queue", live, "--kind", "report", "--payload", "{}").strip()
            browser.go(f"{url}/#job/{job}")
            until(lambda: browser.js("return document.getElementById('job-state').textContent") == "completed",
                  f"job {job} to show completed", 30)
            ms = browser.js("return document.getElementById('job-latency').dataset.ms")
            states = browser.js("return [...document.querySelectorAll('#job-log li')].map(li => li.dataset.state)")
            order = {"pending": 0, "running": 1, "completed": 2}
            if [order[s] for s in states] != sorted(order[s] for s in states) or states[-1] != "completed":
                fail(f"job events out of order: {states}")
            latencies.append(int(ms))
            log(f"job {job}: events {states}, last one {ms} ms after the job ended")
        browser.screenshot("job.png")
        log(f"SSE completion latency ms: median {statistics.median(latencies)}, "
            f"min {min(latencies)}, max {max(latencies)}, runs {latencies}")
        with open(os.path.join(OUT, "latency.json"), "w") as f:
            json.dump({"latencies_ms": latencies, "median_ms": statistics.median(latencies)}, f)
    finally:
        browser.close()


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in reversed(children):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
