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


# The explorers (attncourse.explore, drawn by _ext/static/explorers.js): whether each is drawn, and its controls.
EXPLORERS = """(() => [...document.querySelectorAll('figure.attn-explorer')].map(f => ({
  id: f.id, ready: f.dataset.ready === '1',
  controls: [...f.querySelectorAll('.attn-controls input, .attn-controls select')].map(c => c.id)})))()"""
# Move one control the way a mouse user would (the value changes, then its event fires).
MOVE = """((id) => { const c = document.getElementById(id);
  if (c.tagName === 'SELECT') { c.value = String((Number(c.value) + 1) % c.options.length); c.dispatchEvent(new Event('change')); }
  else { c.value = String(Number(c.value) === Number(c.max) ? Number(c.min) : Number(c.max)); c.dispatchEvent(new Event('input')); }
  return c.value; })"""
AXE = ROOT / "tools" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
# WCAG 2.1 A and AA; a violation of impact "serious" or "critical" fails the page.
# resultTypes: axe still runs every rule on every node, but builds a selector for one node only of the results
# we do not read (passes, incomplete, inapplicable): 12% of its time on the chapter pages.
AXE_RUN = """axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']},
  resultTypes: ['violations']})
  .then(r => JSON.stringify(r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
  .map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map(n => n.target.join(' '))}))))"""


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
        self.call("Page.setLifecycleEventsEnabled", enabled=True)

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

    def wait_for(self, event, timeout=30, match=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, e in enumerate(self.events):
                if e.get("method") == event and (match is None or match(e.get("params", {}))):
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
        loader = self.call("Page.navigate", url=url).get("loaderId")
        # The load of *this* navigation: a late event of the previous page must not count (seen on a busy
        # machine as "Inspected target navigated or closed" while waiting for MathJax).
        self.wait_for("Page.lifecycleEvent", match=lambda p: p.get("name") == "load" and p.get("loaderId") == loader)
        for attempt in range(3):
            try:
                self.evaluate("window.MathJax && MathJax.startup && MathJax.startup.promise ? "
                              "MathJax.startup.promise.then(() => true) : true", await_promise=True)
                break
            except RuntimeError as e:
                if "navigated or closed" not in str(e) or attempt == 2:
                    raise
                time.sleep(0.5)
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

    def key(self, key, code=None, key_code=0):
        """Press and release one key in the focused element (what a keyboard user does)."""
        for kind in ("rawKeyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", type=kind, key=key, code=code or key,
                      windowsVirtualKeyCode=key_code, nativeVirtualKeyCode=key_code)

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


def drawn(browser, explorer):
    """What the explorer's figure draws now (its SVG)."""
    return browser.evaluate(f"(document.getElementById({json.dumps(explorer)}).querySelector('.main-svg') || {{}})"
                            ".innerHTML || ''")


def redrawn(browser, explorer, before, timeout=2.0):
    """Whether the explorer's figure differs from ``before`` within ``timeout`` s: asked every 50 ms, so that a quick
    redraw costs no fixed wait and a slow one on a busy machine is not missed."""
    deadline = time.time() + timeout
    while True:
        time.sleep(0.05)
        if drawn(browser, explorer) != before:
            return True
        if time.time() > deadline:
            return False


def explorers(browser, page, keyboard, shots=None, timeout=20):
    """[problems] of the explorers on the open page: each must be drawn, and moving each of its controls
    must change what is drawn, and the pointer over a heat map must show the value of a cell;
    with ``keyboard``, the first explorer's first control is reached with Tab and moved with the arrow keys
    alone.  ``shots``: a folder for a screenshot before and after."""
    problems, deadline = [], time.time() + timeout
    found = json.loads(browser.evaluate(f"JSON.stringify({EXPLORERS})"))
    while found and not all(e["ready"] for e in found) and time.time() < deadline:
        time.sleep(0.2)
        found = json.loads(browser.evaluate(f"JSON.stringify({EXPLORERS})"))
    name = page.replace("/", "_").removesuffix(".html")
    for n, e in enumerate(found):
        if not e["ready"]:
            problems.append(f"explorer {e['id']} was not drawn within {timeout} s")
            continue
        if not e["controls"]:
            problems.append(f"explorer {e['id']} has no control")
        browser.evaluate(f"document.getElementById({json.dumps(e['id'])}).scrollIntoView(); true")
        if shots and n == 0:
            browser.screenshot(Path(shots) / f"{name}-before.png")
        for control in e["controls"]:
            before = drawn(browser, e["id"])
            browser.evaluate(f"({MOVE})({json.dumps(control)})")
            if not redrawn(browser, e["id"], before):
                problems.append(f"explorer {e['id']}: moving {control} did not change the figure")
        if shots and n == 0:
            browser.screenshot(Path(shots) / f"{name}-after.png")
    # Hover: the pointer over a heat map shows the value of the cell under it (tried at points of a 5 x 5 grid
    # over the heat map's own subplot, as some cells may hold no value).
    for e in found:
        if not e["ready"]:
            continue
        box = json.loads(browser.evaluate(
            f"(() => {{ const f = document.getElementById({json.dumps(e['id'])}); f.scrollIntoView({{block: 'center'}});"
            " const t = (f.querySelector('.attn-plot').data || []).find(t => t.type === 'heatmap' && t.visible !== false);"
            " if (!t) return 'null';"
            " const sub = (t.xaxis || 'x') + (t.yaxis || 'y');"
            " const p = f.querySelector(`.nsewdrag[data-subplot='${sub}']`) || f.querySelector('.nsewdrag');"
            " const r = p.getBoundingClientRect();"
            " return JSON.stringify({x: r.x, y: r.y, w: r.width, h: r.height}); })()"))
        if box is None:
            continue
        shown = 0
        for fx, fy in [(0.5, 0.5)] + [(x / 6, y / 6) for x in range(1, 6) for y in range(1, 6)]:
            browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=box["x"] + fx * box["w"], y=box["y"] + fy * box["h"])
            for _ in range(5):                  # up to 0.15 s at each point
                time.sleep(0.03)
                shown = browser.evaluate(f"document.querySelectorAll('#{e['id']} .hoverlayer .hovertext').length")
                if shown:
                    break
            if shown:
                break
        browser.call("Input.dispatchMouseEvent", type="mouseMoved", x=1, y=1)
        if not shown:
            problems.append(f"explorer {e['id']}: hovering its heat map shows no value")
    if keyboard and found and found[0]["controls"]:
        e, control = found[0], found[0]["controls"][0]
        # Focus the figure itself (not a control), then Tab to its first control: reachable from the keyboard.
        browser.evaluate(f"(() => {{ const f = document.getElementById('{e['id']}'); f.tabIndex = -1; f.focus(); }})()")
        browser.key("Tab", key_code=9)
        focused = browser.evaluate("document.activeElement && document.activeElement.id")
        if focused != control:
            problems.append(f"explorer {e['id']}: Tab from the figure reaches {focused!r}, not its control {control}")
        else:
            before = drawn(browser, e["id"])
            # towards the end the control is not at (a range at its maximum moves left, a menu at its last option up)
            at_end = browser.evaluate("(() => { const c = document.activeElement; return c.tagName === 'SELECT' ? "
                                      "c.selectedIndex === c.options.length - 1 : Number(c.value) === Number(c.max); })()")
            is_menu = browser.evaluate("document.activeElement.tagName") == "SELECT"
            key = {(True, False): ("ArrowDown", 40), (True, True): ("ArrowUp", 38),
                   (False, False): ("ArrowRight", 39), (False, True): ("ArrowLeft", 37)}[(is_menu, bool(at_end))]
            for _ in range(2):
                browser.key(key[0], key_code=key[1])
            if not redrawn(browser, e["id"], before):
                problems.append(f"explorer {e['id']}: the arrow keys on {control} did not change the figure")
    return problems, len(found)


def accessibility(browser):
    """[problems]: axe-core's serious and critical WCAG 2.1 A/AA violations on the open page."""
    if not AXE.exists():
        return [f"axe-core is not installed ({AXE.relative_to(ROOT)}): npm ci --prefix tools/axe"]
    if not browser.evaluate("typeof axe !== 'undefined'"):
        browser.evaluate(AXE.read_text(encoding="utf-8") + "; true")
    found = json.loads(browser.evaluate(AXE_RUN, await_promise=True))
    return [f"accessibility ({v['impact']}): {v['id']}: {v['help']} at {'; '.join(v['nodes'])}" for v in found]


def check(html, screenshots=None, log=print, counts=None):
    """{page or check: [problems]} for the whole site; ``counts`` (a dict) receives {page: explorers moved}."""
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
    explorer_count = {} if counts is None else counts
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
            moved, count = explorers(browser, page, keyboard=True, shots=screenshots)
            problems += moved
            problems += accessibility(browser)
            explorer_count[page] = count
            log(f"{'ok ' if not problems else 'BAD'} {page}" + (f" ({count} explorers moved)" if count else ""))
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


def check_pages(root, pages, screenshots=None):
    """{page: [problems]} for pages outside the site, served from ``root`` (the class report, with its links to
    the feedback pages): JavaScript errors, images, links within ``root`` and axe-core's serious problems."""
    binary = find_chromium()
    if binary is None:
        raise SystemExit("no Chromium found: install Debian's `chromium` package (apt-get install chromium)")
    root = Path(root).resolve()
    server = serve(root)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser, failures = Browser(binary), {}
    try:
        for page in pages:
            problems = browser.open(base + page)
            seen = json.loads(browser.evaluate(INSPECT))
            problems += [f"image did not load: {src}" for src in seen["images"]]
            problems += broken_links(seen["links"], base, root, {})
            problems += accessibility(browser)
            if screenshots:
                Path(screenshots).mkdir(parents=True, exist_ok=True)
                browser.screenshot(Path(screenshots) / (page.replace("/", "_") + ".png"))
            if problems:
                failures[page] = problems
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
