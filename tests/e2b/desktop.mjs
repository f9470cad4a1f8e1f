// The unmodified `@e2b/desktop` SDK (npm) against a Rampart daemon's `desktop` template:
// create, screenshot, pointer, keyboard, windows. Configured only by E2B_API_KEY,
// E2B_API_URL and E2B_SANDBOX_URL. Prints `PASS name` / `FAIL name: why` per test and
// `SUMMARY passed=N failed=M`, like harness.py.
import { Sandbox } from '@e2b/desktop'

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

function pngSize(b) {
  const u = Buffer.from(b)
  check(u.subarray(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])), 'a PNG')
  return [u.readUInt32BE(16), u.readUInt32BE(20)]
}

await test('js_desktop_screenshot_pointer_keys', async () => {
  const d = await Sandbox.create({ resolution: [1024, 768], timeoutMs: 180_000 })
  try {
    const size = await d.getScreenSize()
    check(size.width === 1024 && size.height === 768, `screen ${JSON.stringify(size)}`)
    const [w, h] = pngSize(await d.screenshot())
    check(w === 1024 && h === 768, `png ${w}x${h}`)
    await d.moveMouse(321, 123)
    const pos = await d.getCursorPosition()
    check(pos.x === 321 && pos.y === 123, `cursor ${JSON.stringify(pos)}`)
    await d.commands.run('xterm -geometry 60x10+10+10', { background: true, timeoutMs: 0 })
    let wins = []
    for (let i = 0; i < 100 && wins.filter((x) => x).length === 0; i++) {
      try {
        wins = await d.getApplicationWindows('xterm')
      } catch {
        wins = []
      }
      if (wins.filter((x) => x).length === 0) await new Promise((r) => setTimeout(r, 200))
    }
    check(wins.filter((x) => x).length > 0, 'the xterm window')
    await d.leftClick(100, 60)
    await d.write('echo from js')
    await d.press('enter')
    await d.press(['ctrl', 'l'])
    await d.rightClick(500, 500)
    await d.press('esc')
    await d.scroll('down', 2)
  } finally {
    await d.kill()
  }
})

console.log(`SUMMARY passed=${passed} failed=${failed}`)
process.exit(failed ? 1 : 0)
