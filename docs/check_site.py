"""Check the built docs site in headless Chromium: no page scrolls sideways or lets content run out
of its column, and no page requests anything from outside the site.

    mkdocs build --strict --site-dir /tmp/site && python docs/check_site.py /tmp/site

Each page is loaded once from a local server at 1400 px, checked, narrowed to 390 px (a phone, as
DevTools' device toolbar does: the layout reflows to the new media queries) and checked again,
through the Chrome DevTools protocol (aiohttp's WebSocket client). Reported per page and width: an element of the
content column that ends right of the column without a scrolling box around it, a page wider than
the window, and every request whose URL is not on the local server (fonts, scripts, images,
analytics). The search index is not fetched: the search plugin's web worker downloads and indexes
it on every page load, which changes no layout and is a large part of the load; its
request is on the site. Exit status 1 when anything is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import aiohttp

WIDTHS = (1400, 390)
HEIGHT = 900
NOT_FETCHED = ("*/search/search_index.json",)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
OVERFLOW_SCRIPT = r"""
(async () => {
  for (let frame = 0; frame < 2; frame++) await new Promise(done => requestAnimationFrame(done));
  const doc = document.documentElement, found = [];
  if (doc.scrollWidth > doc.clientWidth + 1) found.push(`the page scrolls sideways (${doc.scrollWidth} px in a ${doc.clientWidth} px window)`);
  const column = document.querySelector('.md-content');
  if (!column) return found;
  const edge = column.getBoundingClientRect().right;
  for (const el of column.querySelectorAll('*')) {
    const box = el.getBoundingClientRect();
    if (box.width === 0 || box.right <= edge + 1) continue;
    let scrolls = false;
    for (let up = el.parentElement; up && up !== column; up = up.parentElement) {
      if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(up).overflowX)) { scrolls = true; break; }
    }
    if (!scrolls) {
      const text = el.textContent.replace(/\s+/g, ' ').trim().slice(0, 50);
      found.push(`<${el.tagName.toLowerCase()}> ends at ${Math.round(box.right)} px, right of the column (${Math.round(edge)} px): "${text}"`);
    }
  }
  return found.slice(0, 8);
})()
"""


def find_chromium() -> str | None:
    """The path of a Chromium or Chrome binary on the PATH, if any."""
    return next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``site`` on a free local port in a daemon thread; returns the server and its origin."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class Page:
    """One browser tab driven over its DevTools WebSocket."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket, self.next_id, self.requests = socket, 0, []
        self.waiting: dict[int, asyncio.Future] = {}
        self.loaded = asyncio.Event()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.socket:
            data = json.loads(message.data)
            if "id" in data and data["id"] in self.waiting:
                self.waiting.pop(data["id"]).set_result(data)
            elif data.get("method") == "Network.requestWillBeSent":
                self.requests.append(data["params"]["request"]["url"])
            elif data.get("method") == "Page.loadEventFired":
                self.loaded.set()

    async def window(self, width: int) -> None:
        """Set the window to ``width`` px (a phone's, with mobile emulation, under 600 px)."""
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=HEIGHT, deviceScaleFactor=1,
                        mobile=width < 600)

    async def call(self, method: str, **params: object) -> dict:
        self.next_id += 1
        future = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = future
        await self.socket.send_str(json.dumps({"id": self.next_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, 60)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})


async def check_pages(port: int, origin: str, pages: list[str]) -> list[str]:
    """Load every page once in one tab and check it at every width; the problems found, one line each."""
    problems = []
    async with aiohttp.ClientSession() as session:
        async with session.put(f"http://127.0.0.1:{port}/json/new?about:blank") as reply:
            target = await reply.json(content_type=None)
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
            page = Page(socket)
            await page.call("Page.enable")
            await page.call("Network.enable")
            await page.call("Network.setBlockedURLs", urls=list(NOT_FETCHED))
            for path in pages:
                page.requests.clear()
                page.loaded.clear()
                await page.window(WIDTHS[0])
                await page.call("Page.navigate", url=f"{origin}/{path}")
                await asyncio.wait_for(page.loaded.wait(), 60)
                for width in WIDTHS:
                    await page.window(width)  # the loaded page narrowed: the layout reflows to the new media queries
                    found = await page.call("Runtime.evaluate", expression=OVERFLOW_SCRIPT, returnByValue=True,
                                            awaitPromise=True)
                    for line in found["result"].get("value", []):
                        problems.append(f"{path} at {width} px: {line}")
                for url in page.requests:
                    if not url.startswith((origin, "data:", "blob:", "about:")):
                        problems.append(f"{path}: requests {url}, outside the site")
            page.reader.cancel()
    return problems


def check_site(site: Path, chromium: str) -> list[str]:
    """Serve ``site``, run headless ``chromium`` over every HTML page, return the problems."""
    pages = sorted(str(p.relative_to(site)) for p in site.rglob("*.html") if p.name != "404.html")
    server, origin = serve(site)
    profile = tempfile.mkdtemp(prefix="site-check-")
    browser = subprocess.Popen(
        [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
         f"--user-data-dir={profile}", "--disable-background-networking", "--disable-component-update",
         "--no-first-run", "--disable-sync", "--disable-default-apps", "--disable-extensions", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.is_file() and port_file.read_text().strip():
                break
            if browser.poll() is not None:
                raise RuntimeError(f"{chromium} exited with status {browser.returncode} before it listened")
            threading.Event().wait(0.1)
        port = int(port_file.read_text().split()[0])
        return asyncio.run(check_pages(port, origin, pages))
    finally:
        browser.terminate()
        browser.wait(30)
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the folder mkdocs build wrote")
    parser.add_argument("--chromium", default=os.environ.get("CHROMIUM") or find_chromium(),
                        help="the browser binary (default: chromium on the PATH, or $CHROMIUM)")
    args = parser.parse_args(argv)
    if not args.chromium:
        parser.error("no Chromium found: install it (apt-get install chromium) or pass --chromium PATH")
    if not (args.site / "index.html").is_file():
        parser.error(f"{args.site} holds no index.html: build the site first (mkdocs build --site-dir {args.site})")
    problems = check_site(args.site, args.chromium)
    for line in problems:
        print(line)
    pages = sum(1 for p in args.site.rglob("*.html") if p.name != "404.html")
    print(f"{pages} pages at {' and '.join(f'{w} px' for w in WIDTHS)}: "
          + (f"{len(problems)} problems" if problems else "no overflow, no request outside the site"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
