// The JavaScript twin of harness.py for the E2B SDK compatibility scripts: `test(name, fn)`
// runs one test and prints `PASS name` / `FAIL name: why`; `check(cond, what)` fails it;
// `done()` prints `SUMMARY passed=N failed=M` and exits 1 if any failed.
let passed = 0
let failed = 0

export async function test(name, fn) {
  try {
    await fn()
    passed++
    console.log(`PASS ${name}`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.replace(/\n/g, '\n    ') : e}`)
  }
}

export function check(cond, what) {
  if (!cond) throw new Error(`assertion failed: ${what}`)
}

export function done() {
  console.log(`SUMMARY passed=${passed} failed=${failed}`)
  process.exit(failed ? 1 : 0)
}
