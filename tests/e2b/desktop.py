"""The unmodified e2b-desktop SDK (PyPI `e2b-desktop`) against a Rampart daemon: the
`desktop` template, driven only through E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL (and
E2B_DOMAIN, so that the stream URL names the daemon's host form).

Writes what the Rust test checks next (the sandbox id, the screenshots' digests, the typed
text's digest, the stream URL) as JSON to the path in RAMPART_DESKTOP_FACTS, and a
screenshot to RAMPART_DESKTOP_SHOT when set.
"""

import hashlib
import json
import os
import struct

from e2b import CommandExitException
from e2b_desktop import Sandbox
from harness import run, test, wait_for

FACTS = {}
TYPED = "echo rampart-desktop-$((6*7))"


def png_size(b):
    assert bytes(b[:8]) == b"\x89PNG\r\n\x1a\n", bytes(b[:16])
    return struct.unpack(">II", bytes(b[16:24]))


def digest(b):
    return hashlib.sha256(bytes(b)).hexdigest()


@test
def a_desktop_is_clicked_typed_into_and_seen():
    s = Sandbox.create(timeout=300)
    FACTS["sandbox"] = s.sandbox_id
    shots = FACTS.setdefault("screenshots", [])
    try:
        assert s.get_screen_size() == (1024, 768), s.get_screen_size()
        first = s.screenshot()
        assert png_size(first) == (1024, 768)
        shots.append(digest(first))

        # The pointer lands where it was moved.
        s.move_mouse(123, 234)
        assert s.get_cursor_position() == (123, 234), s.get_cursor_position()

        # A terminal: the window shows, it takes the keyboard, the screen changes.
        term = s.commands.run("xterm -geometry 80x24+40+40", background=True, timeout=0)
        def windows():
            try:
                return [w for w in s.get_application_windows("xterm") if w]
            except CommandExitException:  # xdotool search finds none yet: exit 1
                return None

        wids = wait_for(windows, 30, "the xterm window")
        title = s.get_window_title(wids[0])
        assert title, wids
        before = s.screenshot()
        shots.append(digest(before))
        s.left_click(200, 150)
        s.write(TYPED)
        s.press("enter")
        # The command ran in the terminal: its output is on screen, so the image changed.
        after = wait_for(
            lambda: (lambda b: b if digest(b) != digest(before) else None)(s.screenshot()),
            20,
            "a screenshot that differs after typing",
        )
        shots.append(digest(after))
        assert png_size(after) == (1024, 768)
        if os.environ.get("RAMPART_DESKTOP_SHOT"):
            with open(os.environ["RAMPART_DESKTOP_SHOT"], "wb") as f:
                f.write(bytes(after))
        FACTS["typed_sha256"] = hashlib.sha256(TYPED.encode()).hexdigest()
        FACTS["typed_chars"] = len(TYPED)

        # The rest of the mouse and keyboard calls run.
        s.right_click(300, 300)
        s.press("esc")
        s.double_click(310, 310)
        s.middle_click()
        s.scroll("down", 2)
        s.scroll("up", 1)
        s.drag((400, 400), (450, 420))
        s.mouse_press("left")
        s.mouse_release("left")
        s.press(["ctrl", "l"])
        s.wait(10)
        assert s.get_current_window_id().strip()

        # The live view: noVNC behind a password, served through the daemon's port proxy.
        s.stream.start(require_auth=True)
        key = s.stream.get_auth_key()
        url = s.stream.get_url(auth_key=key)
        assert "/vnc.html" in url and "password=" + key in url, url
        FACTS["stream_url"] = url
        FACTS["stream_port"] = 6080
        try:
            s.stream.start()
            raise AssertionError("a second stream.start() did not refuse")
        except RuntimeError as e:
            assert "already running" in str(e), e
        term.kill()
    except BaseException:
        s.kill()
        raise


@test
def a_custom_resolution_is_the_screen_size():
    s = Sandbox.create(resolution=(1280, 800), timeout=120)
    try:
        assert s.get_screen_size() == (1280, 800), s.get_screen_size()
        assert png_size(s.screenshot()) == (1280, 800)
    finally:
        s.kill()


if __name__ == "__main__":
    try:
        run()
    finally:
        path = os.environ.get("RAMPART_DESKTOP_FACTS")
        if path:
            with open(path, "w") as f:
                json.dump(FACTS, f)
