"""Playwright (PyPI `playwright`, no browser download) drives the Chromium inside a Rampart
sandbox over its DevTools protocol, through the daemon's port proxy with the sandbox's
access token: `connect_over_cdp` on the HTTP endpoint (Playwright follows the listing) and
on the browser's WebSocket.

Arguments: CDP_URL WS_URL TOKEN ALLOWED_URL DENIED_URL. The sandbox's egress policy allows
ALLOWED_URL's host and not DENIED_URL's.
"""

import sys

from harness import run, test
from playwright.sync_api import sync_playwright

CDP, WS, TOKEN, ALLOWED, DENIED = sys.argv[1:6]
del sys.argv[1:6]
HEADERS = {"X-Rampart-Token": TOKEN}


def drive(endpoint):
    with sync_playwright() as p:
        b = p.chromium.connect_over_cdp(endpoint, headers=HEADERS, timeout=30000)
        try:
            ctx = b.contexts[0] if b.contexts else b.new_context()
            page = ctx.new_page()
            page.goto(ALLOWED, timeout=20000)
            host = ALLOWED.split("/")[2]
            assert page.title() == f"test host {host}", page.title()
            assert page.inner_text("#greeting") == f"hello {host}", page.content()
            try:
                page.goto(DENIED, timeout=20000)
            except Exception as e:  # noqa: BLE001 - Playwright's error names the net error
                assert "net::ERR_" in str(e), e
            else:
                raise AssertionError(f"{DENIED} loaded: {page.content()[:200]}")
            page.close()
        finally:
            b.close()


@test
def playwright_connects_over_the_http_endpoint():
    drive(CDP)


@test
def playwright_connects_over_the_browsers_websocket():
    drive(WS)


@test
def no_token_no_browser():
    with sync_playwright() as p:
        try:
            p.chromium.connect_over_cdp(CDP, timeout=10000)
        except Exception as e:  # noqa: BLE001
            assert "401" in str(e) or "Unexpected status" in str(e), e
        else:
            raise AssertionError("connected without the sandbox's token")


if __name__ == "__main__":
    run()
