// The unmodified `e2b` JavaScript SDK (npm) against a Rampart daemon: create / run / write /
// read / kill. Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Prints
// `PASS name` / `FAIL name: why` per test and `SUMMARY passed=N failed=M`, like harness.py.
import { Sandbox, TimeoutError } from 'e2b'

let passed = 0
let failed = 0

async function test(name, fn) {
  try {
    await fn()
    passed++
    console.log(`PASS ${name}`)
  } catch (e) {
    failed++
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack.replace(/\n/g, '\n    ') : e}`)
  }
}

function check(cond, what) {
  if (!cond) throw new Error(`assertion failed: ${what}`)
}

await test('js_create_run_write_read_kill', async () => {
  const sbx = await Sandbox.create({ metadata: { suite: 'js' }, envs: { JS_VAR: 'from-js' }, timeoutMs: 120_000 })
  try {
    const r = await sbx.commands.run('echo hello $JS_VAR')
    check(r.exitCode === 0 && r.stdout === 'hello from-js\n', `stdout ${JSON.stringify(r.stdout)}`)
    const w = await sbx.files.write('js/a.txt', 'written by js')
    check(w.path === '/home/user/js/a.txt', `path ${w.path}`)
    const text = await sbx.files.read('js/a.txt')
    check(text === 'written by js', `read ${JSON.stringify(text)}`)
    const ls = await sbx.files.list('js')
    check(ls.length === 1 && ls[0].name === 'a.txt', `list ${JSON.stringify(ls)}`)
    const info = await sbx.getInfo()
    check(info.metadata.suite === 'js', `metadata ${JSON.stringify(info.metadata)}`)
    check(await sbx.isRunning(), 'isRunning')
  } finally {
    await sbx.kill()
  }
  check(!(await sbx.isRunning()), 'still running after kill')
  check((await Sandbox.kill(sbx.sandboxId)) === false, 'second kill returned true')
})

await test('js_background_and_stdin', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 60_000 })
  try {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'via stdin\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    check(r.stdout === 'via stdin\n', `stdout ${JSON.stringify(r.stdout)}`)
    const list = await Sandbox.list({ query: { state: ['running'] } }).nextItems()
    check(list.some((s) => s.sandboxId === sbx.sandboxId), 'not listed')
  } finally {
    await sbx.kill()
  }
})

await test('js_auto_resume_and_metrics', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    const info = await sbx.getInfo()
    check(info.lifecycle && info.lifecycle.autoResume === true && info.lifecycle.onTimeout === 'pause',
      `lifecycle ${JSON.stringify(info.lifecycle)}`)
    await sbx.files.write('/tmp/js-state', 'kept')
    check((await sbx.pause()) !== false, 'pause')
    check((await sbx.getInfo()).state === 'paused', 'not paused')
    // The first request resumes it.
    const r = await sbx.commands.run('cat /tmp/js-state')
    check(r.stdout === 'kept', `stdout ${JSON.stringify(r.stdout)}`)
    check((await sbx.getInfo()).state === 'running', 'not running again')
    const m = await sbx.getMetrics()
    check(m.length >= 1 && m[0].memTotal > 0, `metrics ${JSON.stringify(m)}`)
    const none = await sbx.getMetrics({ end: new Date(Date.now() - 3600_000) })
    check(none.length === 0, `metrics before the sandbox: ${JSON.stringify(none)}`)
  } finally {
    await sbx.kill()
  }
})

await test('js_pause_to_the_filesystem_and_reboot', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 120_000 })
  const running = async (s) =>
    (await s.commands.run("pgrep -f '^sleep 4242$' || true")).stdout.trim() !== ''
  try {
    await sbx.files.write('/home/user/js-disk.txt', 'on disk')
    // A background command runs in `bash -l -c` until bash execs it: wait for the sleep.
    const started = async (s) => {
      const deadline = Date.now() + 20_000
      while (!(await running(s))) {
        check(Date.now() < deadline, 'the background process did not start within 20 s')
        await new Promise((res) => setTimeout(res, 100))
      }
    }
    await sbx.commands.run('sleep 4242', { background: true })
    await started(sbx)
    // keepMemory: false is a pause to the filesystem: connect boots it from its disk.
    check((await sbx.pause({ keepMemory: false })) === true, 'pause to the filesystem')
    check((await sbx.getInfo()).state === 'paused', 'not paused')
    const c = await Sandbox.connect(sbx.sandboxId)
    check((await c.files.read('/home/user/js-disk.txt')) === 'on disk', 'the file is gone')
    check(!(await running(c)), 'a process survived the pause to the filesystem')
    // A frozen pause resumed with onResume: 'reboot' drops the memory too.
    await c.commands.run('sleep 4242', { background: true })
    await started(c)
    check((await c.pause()) === true, 'pause')
    const r = await Sandbox.connect(sbx.sandboxId, { onResume: 'reboot' })
    check((await r.getInfo()).state === 'running', 'not running after the reboot')
    check(!(await running(r)), 'a frozen process survived the reboot')
    check((await r.files.read('/home/user/js-disk.txt')) === 'on disk', 'the file is gone after the reboot')
  } finally {
    await sbx.kill()
  }
})

await test('js_kill_during_run', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 60_000 })
  setTimeout(() => Sandbox.kill(sbx.sandboxId), 1000)
  try {
    await sbx.commands.run('sleep 30')
    throw new Error('the command outlived its sandbox')
  } catch (e) {
    // The stream is cut (as an E2B sandbox's when its VM goes away): the SDK probes the
    // sandbox's health (gone) and raises its TimeoutError saying so.
    check(e instanceof TimeoutError, `not a TimeoutError: ${e}`)
    check(String(e.message).includes('killed or reached its end of life'), `error ${e}`)
  }
})

console.log(`SUMMARY passed=${passed} failed=${failed}`)
process.exit(failed ? 1 : 0)
