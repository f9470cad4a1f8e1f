// E2B volumes with the unmodified `e2b` JavaScript SDK (npm): create, list, the file API
// and a mount at create (crates/rampart-cli/tests/e2b_volumes.rs runs it; see volumes.py).
import { Sandbox, Volume } from 'e2b'

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

await test('js_volume_create_list_mount', async () => {
  const name = `jsvol-${Math.random().toString(16).slice(2, 10)}`
  const vol = await Volume.create(name)
  let sbx
  try {
    check(vol.volumeId === name && vol.name === name, `ids ${vol.volumeId} ${vol.name}`)
    const listed = await Volume.list()
    check(listed.some((v) => v.volumeId === name), `listed ${JSON.stringify(listed)}`)
    const info = await Volume.getInfo(name)
    check(info.name === name, `info ${JSON.stringify(info)}`)
    await vol.writeFile('/hello.txt', 'from js')
    check((await vol.readFile('/hello.txt')) === 'from js', 'read back')
    sbx = await Sandbox.create({ volumeMounts: { '/mnt/js': vol }, timeoutMs: 120_000 })
    const r = await sbx.commands.run('cat /mnt/js/hello.txt && echo -n " and back" > /mnt/js/back.txt')
    check(r.stdout === 'from js', `inside: ${r.stdout}`)
    check((await vol.readFile('/back.txt')) === ' and back', 'written inside, read outside')
    const got = await sbx.getInfo()
    check(JSON.stringify(got.volumeMounts) === JSON.stringify([{ name, path: '/mnt/js' }]),
      `volumeMounts ${JSON.stringify(got.volumeMounts)}`)
    let refused = false
    try {
      await Volume.destroy(name)
    } catch (e) {
      refused = true
    }
    check(refused, 'a mounted volume cannot be destroyed')
    await sbx.kill()
    sbx = undefined
    const entries = (await vol.list('/')).map((e) => e.name).sort()
    check(JSON.stringify(entries) === JSON.stringify(['back.txt', 'hello.txt', 'lost+found']),
      `entries ${JSON.stringify(entries)}`)
  } finally {
    if (sbx) await sbx.kill()
    await Volume.destroy(name)
  }
  check(!(await Volume.list()).some((v) => v.volumeId === name), 'gone after destroy')
})

console.log(`SUMMARY passed=${passed} failed=${failed}`)
process.exit(failed ? 1 : 0)
