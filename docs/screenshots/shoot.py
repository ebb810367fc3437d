"""Screenshots of a local TensorBoard with headless Chromium (Playwright driving the system
browser; nothing but 127.0.0.1 is fetched).

    python docs/screenshots/shoot.py profiler http://127.0.0.1:6006 OPERATOR.png TRACE.png [WEBCOMPONENTS_JS]
    python docs/screenshots/shoot.py scalars http://127.0.0.1:6007 SCALARS.png

The profiler plugin loads two scripts from the internet: Google Charts (its pie and bar charts)
and the webcomponents.js 0.7.24 polyfill (its trace viewer). Offline, the charts' loader is
answered by gcharts_stub.js (each chart box then says it was not drawn; tables and the trace
viewer are the plugin's own) and the polyfill by the file given (npm package webcomponents.js@0.7.24,
webcomponents.min.js). Every other outside request is aborted.
"""

import sys
from pathlib import Path
from typing import Any, Dict

from playwright.sync_api import Frame, Page, Route, sync_playwright

HERE = Path(__file__).parent
LOCAL = "http://127.0.0.1"


def _router(answers: Dict[str, str]) -> Any:
    def route(r: Route) -> None:
        url = r.request.url
        if url.startswith(LOCAL):
            r.continue_()
            return
        for suffix, body in answers.items():
            if url.endswith(suffix):
                r.fulfill(status=200, content_type="application/javascript", body=body)
                return
        r.abort()

    return route


def _scroll_args_into_view(trace: Frame) -> None:
    """Scrolls the trace viewer's selection panel to its end, where flopcount's args are."""
    trace.evaluate("""() => {
      const walk = (root) => { const all = root.querySelectorAll('*');
        for (let i = 0; i < all.length; i++) { const el = all[i];
          if (el.tagName === 'TR-UI-A-ANALYSIS-VIEW') el.scrollTop = el.scrollHeight;
          if (el.shadowRoot) walk(el.shadowRoot); } };
      walk(document);
    }""")


def profiler(page: Page, url: str, operator_png: str, trace_png: str) -> None:
    page.goto(url + "/#pytorch_profiler")
    plugin = page.wait_for_selector("iframe").content_frame()
    assert plugin is not None
    plugin.click("text=Overview")  # the Views selector
    plugin.click("li:has-text('Operator')")
    plugin.wait_for_selector("text=aten::mkldnn_convolution")
    plugin.wait_for_timeout(2000)
    page.screenshot(path=operator_png)

    plugin.click("text=Operator >> nth=0")
    plugin.click("li:has-text('Trace')")
    plugin.wait_for_timeout(15000)  # the trace viewer imports the trace
    trace = next(f for f in page.frames if "trace_embedding" in f.url)
    find = trace.locator("tr-ui-find-control input[type=text]").first
    find.click()
    find.type("aten::conv2d")
    find.press("Enter")  # selects the first match: its details open below the timeline
    trace.wait_for_timeout(2000)
    handle = trace.locator("tr-ui-b-drag-handle").last.bounding_box()
    assert handle is not None
    x = handle["x"] + handle["width"] / 2
    page.mouse.move(x, handle["y"] + handle["height"] / 2)
    page.mouse.down()
    page.mouse.move(x, 420, steps=10)  # a taller details panel
    page.mouse.up()
    trace.wait_for_timeout(1000)
    _scroll_args_into_view(trace)
    trace.wait_for_timeout(1000)
    page.screenshot(path=trace_png)


def scalars(page: Page, url: str, png: str) -> None:
    page.goto(url + "/#scalars&tagFilter=flopcount&_smoothingWeight=0")
    page.wait_for_selector("text=Ignore outliers in chart scaling")
    page.click("text=Ignore outliers in chart scaling")  # draw every point, the largest included
    page.wait_for_timeout(8000)
    page.screenshot(path=png)


def main() -> None:
    what, url = sys.argv[1], sys.argv[2]
    answers = {"gstatic.com/charts/loader.js": (HERE / "gcharts_stub.js").read_text()}
    if what == "profiler" and len(sys.argv) > 5:
        answers["webcomponentsjs/0.7.24/webcomponents.min.js"] = Path(sys.argv[5]).read_text()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"], timeout=60000
        )
        height = 1400 if what == "profiler" else 780
        page = browser.new_page(viewport={"width": 1600, "height": height})
        page.set_default_timeout(60000)
        page.route("**/*", _router(answers))
        if what == "profiler":
            profiler(page, url, sys.argv[3], sys.argv[4])
        else:
            scalars(page, url, sys.argv[3])
        browser.close()


if __name__ == "__main__":
    main()
