#!/usr/bin/env python3
"""Opens a `cpuprof report` page in Debian's headless Chromium and measures it from the DOM.

Chromium is driven through ChromeDriver's W3C WebDriver protocol (plain HTTP and JSON, so
nothing beyond Python's standard library and the two Debian packages chromium and
chromium-driver): real clicks and real key presses, as a user would. Prints `key value`
lines for the caller (tests/report_html.rs, bench/report_load.py) to judge.

    report_page.py known PAGE SCREENSHOT      widths of hot_a/hot_b, zoom on hot_a, search
    report_page.py diff PAGE SCREENSHOT       classes of hot_b's frames in the differential graph
    report_page.py load PAGE [RUNS]           load time (ms) as the page measures it, per run

Exits non-zero, with the reason on stderr, when the browser cannot be driven."""
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
# Without the networking flags Chromium tries to reach Google's hosts at every start (refused
# on a closed machine); --no-sandbox because CI runs as root.
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000"]


class Browser:
    def __init__(self):
        for path in (CHROMIUM, CHROMEDRIVER):
            if not os.access(path, os.X_OK):
                sys.exit(f"{path} not found: install Debian's chromium and chromium-driver")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.profile_dir = tempfile.mkdtemp(prefix="report-page-chromium-")
        self.driver = subprocess.Popen([CHROMEDRIVER, f"--port={self.port}"], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                self.call("GET", "/status")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.time() > deadline or self.driver.poll() is not None:
                    self.close()
                    sys.exit("chromedriver did not start")
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": CHROMIUM, "args": FLAGS + [f"--user-data-dir={self.profile_dir}"]}}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.load(response)["value"]
        except urllib.error.HTTPError as e:
            sys.exit(f"webdriver {method} {path}: {e.code} {e.read()[:2000]!r}")

    def s(self, method, path, body=None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def open(self, page):
        self.s("POST", "/url", {"url": "file://" + os.path.abspath(page)})
        deadline = time.time() + 60
        while not self.js("return document.body && document.body.dataset.ready === '1'"):
            if time.time() > deadline:
                sys.exit(f"{page}: the page never became ready")
            time.sleep(0.05)

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def element(self, script, *args):
        """The element a script returns (a WebDriver reference, for real clicks and keys)."""
        found = self.js(script, *args)
        if not found:
            sys.exit(f"no element: {script}")
        return next(iter(found.values()))

    def click(self, element):
        self.s("POST", f"/element/{element}/click", {})

    def type(self, element, text):
        self.s("POST", f"/element/{element}/value", {"text": text})

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.s("GET", "/screenshot")))

    def close(self):
        try:
            if getattr(self, "session", None):
                self.call("DELETE", f"/session/{self.session}")
        finally:
            self.driver.terminate()
            self.driver.wait()
            shutil.rmtree(self.profile_dir, ignore_errors=True)


# Percentages of the main graph's width taken by each function's frames (ancestors of the
# zoomed frame excluded), read from the laid-out DOM.
WIDTHS = """
const flame = document.getElementById('flame');
const full = flame.clientWidth;
const out = {};
for (const el of flame.querySelectorAll('.fr:not(.anc)')) {
  const name = el.textContent;
  if (!name) continue;
  out[name] = (out[name] || 0) + 100 * el.getBoundingClientRect().width / full;
}
return out;"""

FRAME = """
for (const el of document.querySelectorAll('#flame .fr:not(.anc)'))
  if (el.textContent === arguments[0]) return el;
return null;"""


def show(key, value):
    print(f"{key} {value:.3f}" if isinstance(value, float) else f"{key} {value}")


def known(browser, page, screenshot):
    browser.open(page)
    widths = browser.js(WIDTHS)
    show("width_hot_a", widths.get("hot_a", 0.0))
    show("width_hot_b", widths.get("hot_b", 0.0))
    show("functions_in_table", browser.js("return document.querySelectorAll('#toptable tbody a.fn').length"))
    browser.click(browser.element(FRAME, "hot_a"))
    zoomed = browser.js(WIDTHS)
    show("zoomed_hot_a", zoomed.get("hot_a", 0.0))
    show("zoomed_hot_b", zoomed.get("hot_b", 0.0))
    show("ancestors_after_zoom", browser.js("return document.querySelectorAll('#flame .fr.anc').length"))
    show("callers_shown", browser.js("return !document.getElementById('selected').hidden"))
    show("callers_of", browser.js("return document.querySelector('#selected .selname').textContent"))
    browser.click(browser.element("return document.getElementById('reset')"))
    show("reset_hot_b", browser.js(WIDTHS).get("hot_b", 0.0))
    browser.type(browser.element("return document.getElementById('search')"), "hot_b")
    matched = "return document.getElementById('matched').dataset"
    deadline = time.time() + 10
    while browser.js(matched + ".samples") is None:
        if time.time() > deadline:
            sys.exit("the search reported no total")
        time.sleep(0.05)
    show("search_samples", browser.js(matched + ".samples"))
    show("search_percent", float(browser.js(matched + ".percent")))
    show("search_highlighted",
         browser.js("return [...document.querySelectorAll('#flame .fr.m')].map(e => e.textContent).join(',')"))
    browser.screenshot(screenshot)
    show("screenshot", screenshot)


def diff(browser, page, screenshot):
    browser.open(page)
    classes = browser.js("""
return [...document.querySelectorAll('#flame .fr')].filter(e => e.textContent === arguments[0])
  .map(e => e.className).join(';');""", "hot_b")
    show("hot_b_classes", classes)
    show("table_grown",
         browser.js("return [...document.querySelectorAll('table.diff tr.grown a.fn')].map(a => a.textContent).join(',')"))
    browser.screenshot(screenshot)
    show("screenshot", screenshot)


PICK = """
const s = document.getElementById('labels');
for (const o of s.options) if (o.textContent === arguments[0] || o.textContent.startsWith(arguments[0] + ' ')) s.value = o.value;
s.dispatchEvent(new Event('change'));
return s.value;"""


def labels(browser, page, screenshot):
    """The label picker: its options, and per endpoint the widths of serve and validate and the
    share the page states."""
    browser.open(page)
    show("picker_shown", browser.js("return !document.getElementById('picker').hidden"))
    show("options", browser.js("return [...document.querySelectorAll('#labels option')].map(o => o.textContent).join(';')"))
    for value in ("/a", "/b"):
        browser.js(PICK, "endpoint=" + value)
        widths = browser.js(WIDTHS)
        show(f"serve{value}", widths.get("serve", 0.0))
        show(f"validate{value}", widths.get("validate", 0.0))
        show(f"share{value}", browser.js("return document.getElementById('labelshare').textContent"))
    browser.screenshot(screenshot)
    browser.js(PICK, "all")
    show("validate_all", browser.js(WIDTHS).get("validate", 0.0))
    show("screenshot", screenshot)


def load(browser, page, runs):
    """Per run: when the page's script had drawn everything (its `cpuprof-ready` mark), when the
    load event ended (the same for a page without that mark, e.g. an SVG), and frames drawn."""
    for _ in range(runs):
        browser.s("POST", "/url", {"url": "file://" + os.path.abspath(page)})
        timing = "return performance.getEntriesByType('navigation')[0].loadEventEnd"
        deadline = time.time() + 120
        while not browser.js(timing):
            if time.time() > deadline:
                sys.exit(f"{page}: never loaded")
            time.sleep(0.05)
        ready = browser.js("const m = performance.getEntriesByName('cpuprof-ready')[0]; return m ? m.startTime : null")
        frames = browser.js("return document.querySelectorAll('#flame .fr').length")
        ready_text = "-" if ready is None else f"{ready:.1f}"
        print(f"load ready_ms {ready_text} loaded_ms {browser.js(timing):.1f} frames_drawn {frames}")


def main():
    mode, page = sys.argv[1], sys.argv[2]
    browser = Browser()
    try:
        if mode == "known":
            known(browser, page, sys.argv[3])
        elif mode == "diff":
            diff(browser, page, sys.argv[3])
        elif mode == "labels":
            labels(browser, page, sys.argv[3])
        elif mode == "load":
            load(browser, page, int(sys.argv[3]) if len(sys.argv) > 3 else 3)
        else:
            sys.exit(f"unknown mode {mode}")
    finally:
        browser.close()


if __name__ == "__main__":
    main()
