"""A tiny test runner for the E2B SDK compatibility scripts (no pytest needed).

Each script registers test functions with @test; run() executes them in order (or only the
ones named on the command line), prints `PASS name` / `FAIL name: why` per test and a final
`SUMMARY passed=N failed=M`, and exits 1 if any failed. Only E2B_API_KEY, E2B_API_URL and
E2B_SANDBOX_URL configure the SDK.
"""

import asyncio
import inspect
import sys
import time
import traceback

_TESTS = []


def test(fn):
    _TESTS.append(fn)
    return fn


def wait_for(pred, timeout=20.0, what="condition"):
    """Polls pred() until it is true or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


async def await_for(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = await pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def run():
    only = set(sys.argv[1:])
    passed = failed = 0
    for fn in _TESTS:
        name = fn.__name__
        if only and name not in only:
            continue
        try:
            if inspect.iscoroutinefunction(fn):
                asyncio.run(fn())
            else:
                fn()
        except BaseException as e:  # noqa: BLE001 - report everything, go on
            if isinstance(e, KeyboardInterrupt):
                raise
            failed += 1
            detail = "".join(traceback.format_exception(e)).strip().replace("\n", "\n    ")
            print(f"FAIL {name}: {e!r}\n    {detail}", flush=True)
        else:
            passed += 1
            print(f"PASS {name}", flush=True)
    print(f"SUMMARY passed={passed} failed={failed}", flush=True)
    sys.exit(1 if failed else 0)
