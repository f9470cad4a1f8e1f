"""The web console in a real browser (Debian's chromium and chromedriver, driven by Selenium),
against a real daemon. Run by crates/rampart-cli/tests/console.rs, which makes the sandbox
through the API first (a command run, a file written) and passes:

  RAMPART_URL, RAMPART_API_KEY, SANDBOX_ID, EXPECT_FILE (path in the sandbox),
  EXPECT_CONTENT, DOWNLOADS (an empty directory), SHOTS (optional: where screenshots go).

Prints `CHECK <name>` for each thing it saw work; exits non-zero at the first that did not.
Every wait is for an event in the page (an element, a text), bounded by a timeout.
"""

import json
import os
import pathlib
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["RAMPART_URL"].rstrip("/")
KEY = os.environ["RAMPART_API_KEY"]
SID = os.environ["SANDBOX_ID"]
EXPECT_FILE = os.environ["EXPECT_FILE"]
EXPECT_CONTENT = os.environ["EXPECT_CONTENT"]
DOWNLOADS = pathlib.Path(os.environ["DOWNLOADS"])
SHOTS = os.environ.get("SHOTS")

checks = []


def check(name):
    checks.append(name)
    print("CHECK", name, flush=True)


def shot(driver, name):
    if SHOTS:
        pathlib.Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(os.path.join(SHOTS, name + ".png"))


def api(path, method="GET", body=None):
    req = urllib.request.Request(URL + path, method=method)
    req.add_header("Authorization", "Bearer " + KEY)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, data, timeout=30) as r:
        return json.loads(r.read() or b"null")


def main():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1400,900", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.add_experimental_option("prefs", {
        "download.default_directory": str(DOWNLOADS),
        "download.prompt_for_download": False,
    })
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    # The page itself 1400x900 (the window's frame takes some of the window's size).
    driver.set_window_size(1400, 900)
    driver.get(URL + "/health")
    inner = driver.execute_script("return [innerWidth, innerHeight]")
    driver.set_window_size(1400 + 1400 - inner[0], 900 + 900 - inner[1])
    wait = WebDriverWait(driver, 30)
    try:
        run(driver, wait)
    except TimeoutException as e:
        shot(driver, "failure")
        logs = driver.get_log("browser") if hasattr(driver, "get_log") else []
        print("FAILED waiting:", e.msg, "\npage:", driver.find_element(By.TAG_NAME, "body").text[:3000],
              "\nbrowser log:", logs, flush=True)
        raise
    finally:
        driver.quit()
    print(f"ALL {len(checks)} CHECKS PASSED", flush=True)


def text_in(locator, text):
    def f(d):
        try:
            return text in d.find_element(*locator).text
        except Exception:
            return False
    return f


def run(driver, wait):
    driver.get(URL + "/console")
    wait.until(EC.visibility_of_element_located((By.ID, "login-key")))
    assert driver.current_url.endswith("/console/"), driver.current_url
    shot(driver, "login")
    check("login page")

    # A wrong key: a clear error, still on the login page, nothing stored.
    box = driver.find_element(By.ID, "login-key")
    box.send_keys("rampart_" + "0" * 40 + Keys.ENTER)
    wait.until(EC.visibility_of_element_located((By.ID, "login-error")))
    err = driver.find_element(By.ID, "login-error").text
    assert "not accepted" in err, err
    assert driver.execute_script("return sessionStorage.length") == 0
    check("wrong key refused: " + err[:70])
    box.clear()
    box.send_keys("not a key at all" + Keys.ENTER)
    wait.until(text_in((By.ID, "login-error"), "malformed"))
    assert driver.execute_script("return sessionStorage.length") == 0
    check("malformed key refused")

    box.clear()
    box.send_keys(KEY + Keys.ENTER)
    row = (By.CSS_SELECTOR, f'#sandbox-table tr[data-id="{SID}"]')
    wait.until(EC.presence_of_element_located(row))
    check("signed in; the sandbox made through the API is listed")
    # Live figures: a CPU percentage appears once two samples were taken.
    wait.until(lambda d: "%" in d.find_element(*row).text)
    cells = driver.find_element(*row).text
    assert "running" in cells and "base" in cells, cells
    check("list shows state, template, limits, live CPU and memory: " + " | ".join(cells.split("\n")))
    shot(driver, "sandboxes")

    # The key lives in this tab's session only.
    assert KEY not in driver.current_url
    assert driver.execute_script("return sessionStorage.getItem('rampart.key')") == KEY
    assert driver.execute_script("return localStorage.length") == 0
    assert driver.execute_script("return document.cookie") == ""
    check("key in sessionStorage only: not in the URL, localStorage or a cookie")

    driver.find_element(*row).click()
    wait.until(text_in((By.ID, "sandbox-id"), SID))
    wait.until(text_in((By.ID, "tab-content"), "CPU time"))
    shot(driver, "sandbox")
    check("sandbox page with live figures")

    # The audit timeline: the command run through the API, its exit, the verification.
    driver.find_element(By.CSS_SELECTOR, '[data-tab="audit"]').click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, '#timeline .ev[data-type="exec"]')))
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, '#timeline .ev[data-type="exit"]')))
    execs = driver.find_elements(By.CSS_SELECTOR, '#timeline .ev[data-type="exec"]')
    assert any("console-check" in e.text for e in execs), [e.text for e in execs]
    wait.until(lambda d: "verify ok" in d.find_element(By.ID, "verify-result").get_attribute("class")
               or "verify bad" in d.find_element(By.ID, "verify-result").get_attribute("class"))
    verdict = driver.find_element(By.ID, "verify-result").text
    assert verdict.startswith("Verified"), verdict
    check("timeline shows the exec and its exit; " + verdict[:90])
    shot(driver, "audit")

    # The in-browser verifier can fail: a changed record is caught, naming it.
    tampered = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        (async () => {
          const h = {Authorization: 'Bearer ' + sessionStorage.getItem('rampart.key')};
          const sid = arguments[0];
          const text = await (await fetch('/v1/sandboxes/' + sid + '/audit/bundle', {headers: h})).text();
          const b = JSON.parse(text);
          const e = b.events.find((e) => e.body.type === 'exec');
          e.body.argv = ['bash', '-c', 'something else'];
          try { await RampartVerify.verifyBundle(JSON.stringify(b)); return 'VERIFIED'; }
          catch (err) { return err.message; }
        })().then(done, (e) => done('ERROR ' + e));
    """, SID)
    assert "does not match its hash" in tampered, tampered
    check("a tampered bundle fails in the browser: " + tampered)

    # The terminal: type a command, see its output.
    driver.find_element(By.CSS_SELECTOR, '[data-tab="terminal"]').click()
    wait.until(text_in((By.ID, "term-status"), "Connected"))
    ta = driver.find_element(By.CSS_SELECTOR, "#terminal .xterm-helper-textarea")
    ta.send_keys("echo from-the-console-$((6*7)); id -un" + Keys.ENTER)
    wait.until(text_in((By.CSS_SELECTOR, "#terminal .xterm-rows"), "from-the-console-42"))
    rows = driver.find_element(By.CSS_SELECTOR, "#terminal .xterm-rows").text
    assert "user" in rows, rows
    check("typed into the terminal and saw the output")
    shot(driver, "terminal")
    ta.send_keys("exit" + Keys.ENTER)
    wait.until(text_in((By.ID, "term-status"), "exited with code 0"))
    check("the shell's exit shown")

    # Files: list the directory, download the file made through the API.
    driver.find_element(By.CSS_SELECTOR, '[data-tab="files"]').click()
    parent = EXPECT_FILE.rsplit("/", 1)[0]
    # The tab renders once its listing arrives: wait for it, do not assume it is there.
    path = wait.until(EC.presence_of_element_located((By.ID, "file-path")))
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "#file-table tbody tr")))
    path.clear()
    path.send_keys(parent + Keys.ENTER)
    fr = (By.CSS_SELECTOR, f'#file-table tr[data-path="{EXPECT_FILE}"]')
    wait.until(EC.presence_of_element_located(fr))
    shot(driver, "files")
    driver.find_element(*fr).find_element(By.CSS_SELECTOR, "[data-download]").click()
    name = EXPECT_FILE.rsplit("/", 1)[1]
    target = DOWNLOADS / name
    wait.until(lambda d: target.exists() and target.read_text() == EXPECT_CONTENT)
    check(f"downloaded {EXPECT_FILE} ({len(EXPECT_CONTENT)} bytes, same content)")

    # Upload: a file from this machine appears in the sandbox.
    up = DOWNLOADS / "from-browser.txt"
    up.write_text("uploaded through the console\n")
    driver.find_element(By.ID, "file-upload").send_keys(str(up))
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, f'#file-table tr[data-path="{parent}/from-browser.txt"]')))
    check("uploaded a file into the sandbox")

    # Network: the policy is shown and can be changed; the change is real.
    driver.find_element(By.CSS_SELECTOR, '[data-tab="network"]').click()
    wait.until(lambda d: d.find_element(By.ID, "policy-mode").get_attribute("value") == "allowlist")
    allow = driver.find_element(By.ID, "policy-allow")
    assert "example.com" in allow.get_attribute("value")
    allow.send_keys(Keys.END, "\npypi.org")
    driver.find_element(By.ID, "policy-save").click()
    wait.until(text_in((By.ID, "banner"), "applied"))
    got = api(f"/v1/sandboxes/{SID}/network")["policy"]["allow"]
    assert "pypi.org" in got, got
    check("policy edited in the console: " + ", ".join(got))
    shot(driver, "network")

    # A bad policy: the daemon's reason, shown; nothing changed.
    allow.send_keys("\nnot a host!!")
    driver.find_element(By.ID, "policy-save").click()
    wait.until(text_in((By.ID, "banner"), "Policy"))
    assert "not a host!!" not in api(f"/v1/sandboxes/{SID}/network")["policy"]["allow"]
    check("a bad policy refused with the reason: " + driver.find_element(By.ID, "banner").text[:80])

    driver.find_element(By.CSS_SELECTOR, '[data-tab="ports"]').click()
    wait.until(text_in((By.ID, "ports-table"), "8000"))
    check("ports listed with their URLs")
    shot(driver, "ports")

    for page, text in (("snapshots", "console-snap"), ("volumes", "console-vol"), ("templates", "code-interpreter-v1")):
        driver.get(URL + "/console/#/" + page)
        wait.until(text_in((By.ID, "view"), text))
        check(f"{page} listed")
        if page == "templates":
            shot(driver, "templates")
    driver.get(URL + "/console/#/usage")
    wait.until(text_in((By.ID, "view"), "vCPU-seconds"))
    wait.until(text_in((By.ID, "view"), SID))
    check("usage page with the sandbox")
    shot(driver, "usage")

    # Approvals: a command another key asked for is held; approved here, it runs.
    held = os.environ.get("HELD_REQUEST")
    if held:
        driver.get(URL + "/console/#/approvals")
        row = (By.XPATH, f'//table[@id="approvals-table"]//tr[td/code[text()="{held}"]]')
        wait.until(EC.presence_of_element_located(row))
        shot(driver, "approvals")
        driver.find_element(*row).find_element(By.CSS_SELECTOR, "[data-approve]").click()
        wait.until(EC.alert_is_present())
        alert = driver.switch_to.alert
        alert.send_keys("checked in the console")
        alert.accept()
        wait.until(text_in((By.ID, "banner"), "approved"))
        wait.until(lambda d: not d.find_elements(*row))
        check(f"approved the held `{held}` in the console")

    # An unknown sandbox: a clear page, not a crash.
    driver.get(URL + "/console/#/sandboxes/nosuchsandbox000000")
    wait.until(text_in((By.ID, "view"), "No sandbox"))
    check("unknown sandbox id shown as such")

    driver.find_element(By.ID, "logout").click()
    wait.until(EC.visibility_of_element_located((By.ID, "login-key")))
    assert driver.execute_script("return sessionStorage.length") == 0
    check("signed out: the key is gone from the tab")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print("FAILED:", e, flush=True)
        sys.exit(1)
