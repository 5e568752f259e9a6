"""Open every page of the built site in headless Chromium and report what a reader would find broken.

    python tools/browser_check.py [--html _build/html] [--screenshots DIR]

A page fails on: a JavaScript exception or console error, a resource that did not load (image,
script, stylesheet, font), an image with no pixels, a formula MathJax did not typeset, typeset
as an error or typeset with a backslash showing (a macro read as text: ``\\text{max\\_lr}``), or
a link to a page or anchor of the site that does not exist.  The search page must
list, for each key term of SEARCHES, the chapter that teaches it (the Chinese edition's search page for
Chinese terms).  With --screenshots, chapter 02 is saved in light and in dark mode, and in Chinese.  Exit status 0 when nothing failed.

Chromium is driven over its DevTools protocol (websocket-client, already a Jupyter dependency);
Debian's `chromium` package provides the browser.
"""
import argparse
import base64
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import websocket

ROOT = Path(__file__).resolve().parent.parent
# A key term and the page a reader searching for it must be offered.
SEARCHES = {"softmax": "site/ch02/attention.html", "RoPE": "site/ch04/positional.html",
            "LayerNorm": "site/ch05/transformer.html", "KV cache": "site/ch06/llm.html",
            "Swin": "site/ch07/vision.html", "router": "site/ch08/moe.html",
            # the Chinese edition's own search (jieba segments the words; the glossary's terms are words)
            "注意力": "zh/site/ch02/attention.html", "位置编码": "zh/site/ch04/positional.html"}
SCREENSHOT_PAGE = "site/ch02/attention.html"
SCREENSHOT_PAGE_ZH = "zh/site/ch02/attention.html"   # saved as ch02-zh.png: Chinese glyphs, not boxes

# Run in the page once it has loaded and MathJax has finished: what a reader would see broken.
INSPECT = """(() => {
  const images = [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src);
  const untypeset = [...document.querySelectorAll('.math')].filter(e => !e.querySelector('mjx-container'))
      .map(e => e.textContent.slice(0, 80));
  const mathErrors = [...document.querySelectorAll('mjx-merror')]
      .map(e => e.getAttribute('data-mjx-error') || e.textContent.slice(0, 80));
  // A backslash in typeset math is a macro MathJax printed as text (\\_ inside \\text{} without textmacros).
  const backslashes = [...document.querySelectorAll('mjx-container')].filter(e => e.textContent.includes('\\\\'))
      .map(e => e.textContent.slice(0, 80));
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
  return JSON.stringify({images, untypeset, mathErrors, backslashes, links, title: document.title});
})()"""


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


class Browser:
    """One headless Chromium and one tab, spoken to over the DevTools protocol."""

    def __init__(self, binary):
        self.profile = tempfile.mkdtemp(prefix="attncourse-chromium-")
        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             "--remote-debugging-port=0", "--remote-allow-origins=*", f"--user-data-dir={self.profile}",
             "--window-size=1280,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        port = None
        deadline = time.time() + 60
        while time.time() < deadline and port is None:
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                break
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            port = m and int(m.group(1))
        if port is None:
            self.close()
            raise RuntimeError(f"{binary} did not start its DevTools endpoint")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()   # keep its pipe drained
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.next_id, self.events = 0, []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, event, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, e in enumerate(self.events):
                if e.get("method") == event:
                    return self.events.pop(i)
            self.ws.settimeout(max(0.1, deadline - time.time()))
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
        raise TimeoutError(f"no {event} within {timeout} s")

    def evaluate(self, expression, await_promise=False):
        res = self.call("Runtime.evaluate", expression=expression, awaitPromise=await_promise, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression[:60]}...: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def open(self, url):
        """Load ``url``, wait for its load event and for MathJax; return the problems the browser reported."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        self.evaluate("window.MathJax && MathJax.startup && MathJax.startup.promise ? "
                      "MathJax.startup.promise.then(() => true) : true", await_promise=True)
        time.sleep(0.2)                         # late console messages
        self.ws.settimeout(0.2)
        try:
            while True:
                self.events.append(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            pass
        self.ws.settimeout(60)
        problems = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                problems.append(f"JavaScript exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                problems.append("console error: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error" and not p["entry"].get("url", "").endswith(
                    "/favicon.ico"):       # the browser asks for one on its own; the book declares none
                problems.append(f"browser error: {p['entry']['text']} {p['entry'].get('url', '')}".strip())
            elif m == "Network.loadingFailed" and not p.get("canceled"):
                problems.append(f"failed to load ({p.get('errorText')}): request {p.get('requestId')}")
        return problems

    def screenshot(self, path):
        Path(path).write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self):
        try:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def serve(html):
    """The built site over HTTP on a free local port (search and MathJax fetch files, as on a real host)."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(html)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def broken_links(links, base, html, ids):
    """Links into the site whose page or anchor does not exist."""
    bad = []
    for link in links:
        if not link.startswith(base):
            continue                             # another site: not this test's business (and not reachable)
        url = urllib.parse.urlsplit(link)
        rel = urllib.parse.unquote(url.path)[1:] or "index.html"
        target = html / rel
        if target.is_dir():
            target, rel = target / "index.html", rel.rstrip("/") + "/index.html"
        if not target.exists():
            bad.append(f"link to a missing page: {link}")
        elif url.fragment and target.suffix == ".html":
            if rel not in ids:
                ids[rel] = set(re.findall(r'\bid="([^"]+)"', target.read_text(errors="replace")))
            if urllib.parse.unquote(url.fragment) not in ids[rel]:
                bad.append(f"link to a missing anchor: {link}")
    return bad


def search_finds(browser, base, term, page, timeout=20):
    """Whether the site's search page lists ``page`` among its results for ``term``."""
    site = "zh/" if page.startswith("zh/") else ""       # each language searches its own index
    browser.open(f"{base}{site}search.html?q={urllib.parse.quote(term)}")
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = json.loads(browser.evaluate(
            "JSON.stringify({done: !!document.querySelector('#search-results .search-summary, p.search-summary'),"
            " hits: [...document.querySelectorAll('#search-results a')].map(a => a.href)})"))
        if state["done"]:
            return any(urllib.parse.urlsplit(h).path.lstrip("/") == page for h in state["hits"]), state["hits"]
        time.sleep(0.2)
    return False, []


def check(html, screenshots=None, log=print):
    """{page or check: [problems]} for the whole site."""
    html = Path(html).resolve()
    if not (html / "intro.html").exists() and not (html / "index.html").exists():
        raise SystemExit(f"no built site in {html}: run `make site` first")
    binary = find_chromium()
    if binary is None:
        raise SystemExit("no Chromium found: install Debian's `chromium` package (apt-get install chromium)")
    server = serve(html)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    pages = sorted(str(p.relative_to(html)) for p in html.rglob("*.html")
                   if "_static" not in p.parts and "_sources" not in p.parts and p.name not in ("genindex.html", "search.html"))
    browser, failures, ids = Browser(binary), {}, {}
    try:
        for page in pages:
            problems = browser.open(base + page)
            seen = json.loads(browser.evaluate(INSPECT))
            problems += [f"image did not load: {src}" for src in seen["images"]]
            problems += [f"formula not typeset: {t!r}" for t in seen["untypeset"]]
            problems += [f"MathJax error: {t}" for t in seen["mathErrors"]]
            problems += [f"formula shows a backslash (write \\mathrm{{max\\_lr}}, not \\text{{max\\_lr}}): {t!r}"
                         for t in seen["backslashes"]]
            problems += broken_links(seen["links"], base, html, ids)
            log(f"{'ok ' if not problems else 'BAD'} {page}")
            if problems:
                failures[page] = problems
        for term, page in SEARCHES.items():
            found, hits = search_finds(browser, base, term, page)
            log(f"{'ok ' if found else 'BAD'} search {term!r} -> {page}")
            if not found:
                failures[f"search {term!r}"] = [f"{page} not among the {len(hits)} results"]
        if screenshots:
            out = Path(screenshots)
            out.mkdir(parents=True, exist_ok=True)
            for mode in ("light", "dark"):
                browser.open(base + SCREENSHOT_PAGE)
                # The theme keeps the reader's choice in localStorage and applies it to <html data-theme>.
                browser.evaluate(f"localStorage.setItem('theme', '{mode}'); localStorage.setItem('mode', '{mode}');"
                                 f"document.documentElement.dataset.theme = '{mode}';"
                                 f"document.documentElement.dataset.mode = '{mode}'; true")
                time.sleep(0.3)
                browser.screenshot(out / f"ch02-{mode}.png")
                log(f"screenshot {out / f'ch02-{mode}.png'}")
            if (html / SCREENSHOT_PAGE_ZH).exists():
                browser.open(base + SCREENSHOT_PAGE_ZH)
                browser.screenshot(out / "ch02-zh.png")
                log(f"screenshot {out / 'ch02-zh.png'}")
    finally:
        browser.close()
        server.shutdown()
    return failures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", default=str(ROOT / "_build" / "html"))
    ap.add_argument("--screenshots", default=None, help="save chapter 02 in light and dark mode here")
    args = ap.parse_args(argv)
    failures = check(args.html, args.screenshots)
    for where, problems in failures.items():
        print(f"\n{where}:")
        for p in problems:
            print(f"  {p}")
    print(f"\n{'no problems' if not failures else f'{len(failures)} page(s) or search(es) with problems'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
