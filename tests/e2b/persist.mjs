// Snapshots and fork through the unmodified `e2b` JavaScript SDK (npm): createSnapshot,
// listSnapshots (paged), Sandbox.create from a snapshot, fork, deleteSnapshot. Configured
// only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Prints `PASS name` / `FAIL name: why`
// and `SUMMARY passed=N failed=M`, like harness.py.
import { Sandbox } from 'e2b'

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

const suffix = () => Math.random().toString(16).slice(2, 10)

async function cat(sbx, path) {
  const r = await sbx.commands.run(`cat ${path} 2>/dev/null || echo MISSING`)
  return r.stdout.trim()
}

await test('js_snapshot_list_create_delete', async () => {
  const src = await Sandbox.create({ timeoutMs: 180_000 })
  const made = []
  try {
    await src.files.write('/home/user/js.txt', 'before')
    const names = [`js-a-${suffix()}`, `js-b-${suffix()}`]
    for (const name of names) {
      const info = await src.createSnapshot({ name })
      check(info.snapshotId === name && info.names[0] === name, JSON.stringify(info))
    }
    await src.files.write('/home/user/late.txt', 'after')
    // Pages of one, newest first, following the next token.
    const p = Sandbox.listSnapshots({ sandboxId: src.sandboxId, limit: 1 })
    const seen = []
    while (p.hasNext) {
      const page = await p.nextItems()
      check(page.length === 1, `page ${JSON.stringify(page)}`)
      seen.push(page[0].snapshotId)
    }
    check(JSON.stringify(seen) === JSON.stringify([...names].reverse()), `pages ${seen}`)
    const s = await Sandbox.create(names[0], { timeoutMs: 120_000 })
    made.push(s)
    check((await cat(s, '~/js.txt')) === 'before', 'file from before the snapshot')
    check((await cat(s, '~/late.txt')) === 'MISSING', 'file from after the snapshot')
    for (const name of names) {
      check((await Sandbox.deleteSnapshot(name)) === true, `delete ${name}`)
    }
    check((await Sandbox.deleteSnapshot(names[0])) === false, 'second delete')
    const left = await Sandbox.listSnapshots({ sandboxId: src.sandboxId }).nextItems()
    check(left.length === 0, `left ${JSON.stringify(left)}`)
  } finally {
    for (const s of made) await s.kill()
    await src.kill()
  }
})

await test('js_fork', async () => {
  const src = await Sandbox.create({ timeoutMs: 180_000 })
  const forks = []
  try {
    await src.files.write('/home/user/f.txt', 'parent')
    const out = await src.fork({ count: 2, timeoutMs: 120_000 })
    check(out.length === 2, `forks ${out.length}`)
    for (const f of out) {
      check(!(f instanceof Error), `fork failed: ${f}`)
      forks.push(f)
    }
    check(forks[0].sandboxId !== forks[1].sandboxId && forks[0].sandboxId !== src.sandboxId, 'ids')
    await forks[0].files.write('/home/user/f.txt', 'fork 0')
    check((await cat(forks[0], '~/f.txt')) === 'fork 0', 'fork 0 wrote')
    check((await cat(forks[1], '~/f.txt')) === 'parent', 'fork 1 independent of fork 0')
    check((await cat(src, '~/f.txt')) === 'parent', 'parent independent of its forks')
    let refused = false
    try {
      await Sandbox.fork('nosuchsandbox0000000')
    } catch (e) {
      refused = e.name === 'SandboxNotFoundError'
    }
    check(refused, 'fork of an unknown sandbox')
  } finally {
    for (const f of forks) await f.kill()
    await src.kill()
  }
})

console.log(`SUMMARY passed=${passed} failed=${failed}`)
process.exit(failed ? 1 : 0)
