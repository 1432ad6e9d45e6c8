#!/usr/bin/env python3
"""The dashboard's browser test: headless Chromium, driven over the WebDriver protocol
by ChromeDriver, against a live `switchyard serve`. Standard library only.

Run by crates/switchyard-cli/tests/dashboard.rs, which passes the queue configuration in
the environment with:
  SWITCHYARD_BIN   the switchyard binary
  OUT_DIR          where the screenshots go
  CHROMIUM, CHROMEDRIVER  the browser and its driver (default: Debian's paths)

It checks that the page shows the queue counts changing while a worker runs and a chart
with time and rate axes; that the Replay button, and a replay of three selected dead
letters, put them back on their queue after a confirmation; that the job list filters
by state and finds a job by its id; that a job's page shows its payload, result and
each failed attempt's error; that a running worker is listed and dropped once it
stops; and that a job's page follows it live over Server-Sent Events, measuring how
long after a job ended its last event reached the page. Exits non-zero with a reason
when anything does not hold.
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


CONFIRMS = """
window.confirmed = window.confirmed || [];
window.confirm = (question) => { window.confirmed.push(question); return true; };
"""


def click(browser, css):
    """Clicks in the page itself: the page redraws its tables every second, and an
    element found by one WebDriver call may be gone by the next."""
    if not browser.js(f"const e = document.querySelector({json.dumps(css)}); if (!e) return false; e.click(); return true;"):
        fail(f"nothing to click at {css}")


def last_confirm(browser):
    return browser.js("return (window.confirmed || []).slice(-1)[0] || ''")


def text_of(browser, css):
    return browser.js(f"const e = document.querySelector({json.dumps(css)}); return e ? e.textContent : null;")


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
        browser.js(CONFIRMS)
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
        ticks = browser.js("return [...document.querySelectorAll('#chart text')].map(t => t.textContent)")
        if "now" not in ticks or "jobs/s" not in ticks or "−5 min" not in ticks:
            fail(f"the chart has no time and rate axes: {ticks}")
        bars = browser.js("return document.querySelectorAll('#chart rect.ok').length")
        if bars == 0:
            fail("the chart shows no completed jobs")
        browser.screenshot("dashboard.png")

        # The dead letter, with its error, and its Replay button (confirmed first).
        browser.go(url + "/#dead")
        browser.js(CONFIRMS)
        row = f'#dead tbody tr[data-id="{bad}"]'
        until(lambda: text_of(browser, row + " td.err") is not None, "the dead letter's row")
        error = text_of(browser, row + " td.err")
        if "no such invoice" not in error:
            fail(f"the dead letter's error shows {error!r}")
        browser.screenshot("dashboard-dead-letter.png")
        if TOKEN:
            browser.type("#token", TOKEN)
            browser.js("document.getElementById('token').dispatchEvent(new Event('change'))")
        click(browser, f"{row} button.replay")
        if bad not in last_confirm(browser):
            fail(f"the replay was not confirmed first: {last_confirm(browser)!r}")
        until(lambda: text_of(browser, row) is None, "the dead letter to leave the table")
        until(lambda: "Replayed" in (text_of(browser, "#dead-message") or ""), "the replay's message")
        status = http("GET", f"{url}/api/jobs/{bad}")
        if status["state"] != "pending":
            fail(f"the replayed job's status is {status['state']}")
        log("replayed with the button:", text_of(browser, "#dead-message"))

        # Three dead letters replayed at once, as a selection.
        bulk = "bulk-" + uuid.uuid4().hex[:8]
        ids = switchyard("publish", "--queue", bulk, "--kind", "broken",
                         stdin='{"row": 1}\n{"row": 2}\n{"row": 3}\n').split()
        switchyard("work", "--queue", bulk, "--exec", "echo 'row rejected' >&2; exit 1",
                   "--max-attempts", "1", "--drain")
        browser.go(url + "/#dead")
        browser.js(CONFIRMS)
        for i in ids:
            until(lambda: text_of(browser, f'#dead tbody tr[data-id="{i}"]') is not None, f"dead letter {i}")
        for i in ids:
            click(browser, f'#dead tbody tr[data-id="{i}"] input.pick')
        until(lambda: text_of(browser, "#replay-selected") == "Replay 3 selected", "three selected")
        click(browser, '#dead tbody tr[data-id="%s"] td.payload summary' % ids[0])
        time.sleep(1.2)  # a redraw: what the operator opened stays open
        if not browser.js('return document.querySelector(\'#dead tbody tr[data-id="%s"] td.payload details\').open' % ids[0]):
            fail("the opened payload closed when the page redrew")
        payload = text_of(browser, '#dead tbody tr[data-id="%s"] td.payload pre' % ids[0])
        if '"row": 1' not in payload:
            fail(f"the dead letter's payload shows {payload!r}")
        browser.screenshot("dead-letters-selected.png")
        click(browser, "#replay-selected")
        if "3 dead letters" not in last_confirm(browser):
            fail(f"the bulk replay was not confirmed: {last_confirm(browser)!r}")
        until(lambda: all(text_of(browser, f'#dead tbody tr[data-id="{i}"]') is None for i in ids),
              "the three dead letters to leave the table")
        message = text_of(browser, "#dead-message")
        if message != "Replayed 3 dead letters.":
            fail(f"the page said {message!r} after the bulk replay")
        stats = http("GET", f"{url}/api/stats")
        ready = next((q["ready"] for q in stats["queues"] if q["queue"] == bulk), None)
        if ready != 3:
            fail(f"{bulk} has {ready} ready after the bulk replay, not 3")
        log("bulk replay:", message)

        # The job list, filtered by state: the three are pending again; a job that failed
        # twice before it succeeded is completed, with both errors on its page.
        flaky_queue = "flaky-" + uuid.uuid4().hex[:8]
        flaky = switchyard("publish", "--queue", flaky_queue, "--kind", "flaky",
                           "--payload", '{"invoice": 42, "customer": "ACME"}').strip()
        switchyard("work", "--queue", flaky_queue, "--exec",
                   'if [ "$SWITCHYARD_ATTEMPT" -lt 3 ]; then echo "gateway timeout, attempt $SWITCHYARD_ATTEMPT" >&2; exit 1; fi; '
                   'echo \'{"charged": true}\'',
                   "--max-attempts", "3", "--backoff-base", "10ms", "--backoff-max", "20ms", "--drain")
        browser.go(f"{url}/#jobs?queue={bulk}&state=pending")
        until(lambda: browser.js("return document.querySelectorAll('#joblist tbody tr').length") == 3,
              "three pending jobs in the list")
        states = browser.js("return [...document.querySelectorAll('#joblist tbody tr')].map(tr => tr.dataset.state)")
        if states != ["pending"] * 3:
            fail(f"the pending filter shows {states}")
        tab = text_of(browser, '#state-tabs button[data-state="pending"]')
        if tab != "pending3":
            fail(f"the pending tab says {tab!r}")
        browser.screenshot("jobs-pending.png")
        browser.go(f"{url}/#jobs?state=completed&q={flaky[:30]}")
        until(lambda: browser.js("return [...document.querySelectorAll('#joblist tbody tr')].map(tr => tr.dataset.id)") == [flaky],
              "the flaky job found by its id among the completed")
        browser.go(f"{url}/#job/{flaky}")
        until(lambda: browser.js("return document.querySelectorAll('#attempts tbody tr').length") == 2,
              "the job's two failed attempts")
        errors = browser.js("return [...document.querySelectorAll('#attempts tbody tr pre')].map(p => p.textContent)")
        if not ("gateway timeout, attempt 1" in errors[0] and "gateway timeout, attempt 2" in errors[1]):
            fail(f"the attempts show {errors}")
        payload = text_of(browser, "#job-payload")
        if '"customer": "ACME"' not in payload:
            fail(f"the job's payload shows {payload!r}")
        if text_of(browser, "#job-state") != "completed" or '"charged": true' not in text_of(browser, "#job-result"):
            fail("the job page does not show the completed job and its result")
        if ":" not in (text_of(browser, "#job-worker") or ""):
            fail(f"the job page names no worker: {text_of(browser, '#job-worker')!r}")
        browser.screenshot("job-attempts.png")

        # Running workers: a live `work` process is listed, and gone once it stops.
        idle = "idle-" + uuid.uuid4().hex[:8]
        live_worker = spawn([BIN, "work", "--queue", idle, "--exec", "true", "--concurrency", "3"],
                            stdout=subprocess.DEVNULL)
        browser.go(url + "/#workers")
        wrow = f'#workers tbody tr[data-pid="{live_worker.pid}"]'
        until(lambda: text_of(browser, wrow) is not None, "the running worker in the list", 30)
        cells = browser.js(f"return [...document.querySelectorAll('{wrow} td')].map(td => td.textContent)")
        if cells[2] != idle or cells[3] != "3":
            fail(f"the worker's row shows {cells}")
        browser.screenshot("workers.png")
        live_worker.send_signal(signal.SIGTERM)
        if live_worker.wait(timeout=30) != 0:
            fail("the idle worker did not stop cleanly")
        until(lambda: text_of(browser, wrow) is None, "the stopped worker to leave the list", 30)
        log("workers list: showed pid", live_worker.pid, "and dropped it after it stopped")

        # Flow control: pause a queue with the form, see that a worker starts nothing,
        # resume it with the row's button; cancel a running job from its page.
        held = "held-" + uuid.uuid4().hex[:8]
        waiting = switchyard("publish", "--queue", held, "--kind", "w", "--payload", "{}").strip()
        browser.go(url + "/")
        browser.js(CONFIRMS)
        until(lambda: browser.js("return !document.getElementById('flow').hidden"), "the flow control panel")
        browser.type("#pause-queue", held)
        click(browser, "#pause-form button")
        prow = "#paused tbody tr"
        until(lambda: held in (text_of(browser, prow) or ""), "the paused queue in the panel")
        spawn([BIN, "work", "--queue", held, "--exec", "true"], stdout=subprocess.DEVNULL)
        time.sleep(2)
        if http("GET", f"{url}/api/jobs/{waiting}")["state"] != "pending":
            fail("a job of the paused queue ran")
        browser.screenshot("flow-control.png")
        click(browser, f"{prow} button")
        until(lambda: http("GET", f"{url}/api/jobs/{waiting}")["state"] == "completed",
              "the resumed queue's job to complete", 30)
        until(lambda: text_of(browser, prow) is None, "the resumed queue to leave the panel")
        log("paused and resumed", held, "from the dashboard")
        slow = "slow-" + uuid.uuid4().hex[:8]
        long_job = switchyard("publish", "--queue", slow, "--kind", "s", "--payload", "{}").strip()
        spawn([BIN, "work", "--queue", slow, "--exec", "sleep 60", "--grace", "1s"],
              stdout=subprocess.DEVNULL)
        browser.go(f"{url}/#job/{long_job}")
        browser.js(CONFIRMS)
        until(lambda: text_of(browser, "#job-state") == "running", "the slow job running", 30)
        click(browser, "#job-cancel")
        if long_job not in last_confirm(browser):
            fail(f"the cancel was not confirmed first: {last_confirm(browser)!r}")
        until(lambda: text_of(browser, "#job-state") == "cancelled", "the job to end cancelled", 15)
        log("cancelled", long_job, "from its page")

        # A job's page follows it live; how long after the job ended does its last
        # event reach the page?
        live = "reports-" + uuid.uuid4().hex[:8]
        handler = 'sleep 1; echo "{\\"done_at_ms\\": $(date +%s%3N)}"'
        spawn([BIN, "work", "--queue", live, "--exec", handler], stdout=subprocess.DEVNULL)
        latencies = []
        for _ in range(7):
            job = switchyard("publish", "--queue", live, "--kind", "report", "--payload", "{}").strip()
            browser.go(f"{url}/#job/{job}")
            until(lambda: text_of(browser, "#job-state") == "completed", f"job {job} to show completed", 30)
            arrived = int(browser.js("return document.body.dataset.lastEventAt"))
            done_at = http("GET", f"{url}/api/jobs/{job}")["result"]["done_at_ms"]
            states = browser.js("return [...document.querySelectorAll('#job-log li')].map(li => li.dataset.state)")
            order = {"pending": 0, "running": 1, "completed": 2}
            if [order[s] for s in states] != sorted(order[s] for s in states) or states[-1] != "completed":
                fail(f"job events out of order: {states}")
            latencies.append(arrived - done_at)
            log(f"job {job}: events {states}, last one {arrived - done_at} ms after the job ended")
        if browser.js("return document.body.innerText.includes('after the job ended')"):
            fail("a diagnostic row is on the job page")
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
