// E2B network options with the unmodified `e2b` JavaScript SDK (npm), against the test
// internet of crates/rampart-cli/tests/e2b_network.rs (see tests/e2b/network.py).
import { Sandbox, ALL_TRAFFIC } from 'e2b'
import { readFileSync } from 'node:fs'

const A = process.env.E2B_NET_HOST_A
const B = process.env.E2B_NET_HOST_B
const LOG = process.env.E2B_NET_LOG
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

async function reach(sbx, url) {
  const r = await sbx.commands.run(`curl -sS -o /dev/null -w '%{http_code}' --max-time 5 ${url} || true`)
  return Number(r.stdout.trim()) || 0
}

function seen(path) {
  return readFileSync(LOG, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l))
    .filter((v) => v.path === path)
    .map((v) => Object.fromEntries(v.headers.map(([k, val]) => [k.toLowerCase(), val])))
}

await test('js_network_allow_deny_rules_and_update', async () => {
  const tag = Math.random().toString(16).slice(2)
  const sbx = await Sandbox.create({
    timeoutMs: 120_000,
    network: {
      allowOut: [A],
      denyOut: [ALL_TRAFFIC],
      rules: { [A]: [{ transform: { headers: { 'X-Js': 'from-js' } } }] },
    },
  })
  try {
    check((await reach(sbx, `https://${A}/js-${tag}`)) === 200, 'A over https')
    check(seen(`/js-${tag}`)[0]['x-js'] === 'from-js', 'the header was not injected')
    check([0, 403].includes(await reach(sbx, `http://${B}/js-no-${tag}`)), 'B was reached')
    check(seen(`/js-no-${tag}`).length === 0, 'a refused request arrived')
    const info = await sbx.getInfo()
    check(JSON.stringify(info.network || {}).includes(A), `info ${JSON.stringify(info.network)}`)
    await sbx.updateNetwork({ allowOut: [B], denyOut: [ALL_TRAFFIC] })
    check((await reach(sbx, `http://${B}/js-b-${tag}`)) === 200, 'B after the update')
    check([0, 403].includes(await reach(sbx, `http://${A}/js-a-${tag}`)), 'A after the update')
    check(seen(`/js-b-${tag}`)[0]['x-js'] === undefined, 'the old rule stayed')
  } finally {
    await sbx.kill()
  }
})

await test('js_no_internet_access', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 60_000, allowInternetAccess: false })
  try {
    check([0, 403].includes(await reach(sbx, `http://${A}/`)), 'A was reached')
  } finally {
    await sbx.kill()
  }
})

console.log(`SUMMARY passed=${passed} failed=${failed}`)
process.exit(failed ? 1 : 0)
