// The E2B drop-in's last mile (issue 31, items 1-4, 6 and 7) through the unmodified `e2b`
// JavaScript SDK (npm): files the kernel makes read to their end, a boot id per boot, the
// built-in templates by E2B's names, the error of a sandbox killed while a command streams,
// and writes that make their parent directories (the code interpreter's part is
// last_mile_ci.mjs). Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Prints
// `PASS name` / `FAIL name: why` and `SUMMARY passed=N failed=M`, like harness.py. Every wait
// is on an event, with a deadline; nothing is timed.
import { readFileSync } from 'node:fs'
import { Sandbox as Base, Template, TimeoutError } from 'e2b'

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

const RUN = `jslm${Math.random().toString(16).slice(2, 10)}`
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n$/
const HOST_BOOT_ID = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8')

async function bootId(sbx) {
  const viaFiles = await sbx.files.read('/proc/sys/kernel/random/boot_id')
  const viaCat = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout
  check(viaFiles === viaCat, `files ${JSON.stringify(viaFiles)} cat ${JSON.stringify(viaCat)}`)
  check(UUID.test(viaFiles), `boot id ${JSON.stringify(viaFiles)}`)
  return viaFiles
}

await test('js_files_the_kernel_makes_read_to_their_end', async () => {
  const sbx = await Base.create({ timeoutMs: 300_000 })
  try {
    for (const p of ['/proc/sys/kernel/random/boot_id', '/proc/meminfo', '/proc/version']) {
      check((await sbx.files.read(p)).length > 0, `${p} read as empty`)
    }
    const bytes = await sbx.files.read('/proc/version', { format: 'bytes' })
    const cat = (await sbx.commands.run('cat /proc/version')).stdout
    check(Buffer.from(bytes).toString() === cat, 'bytes of /proc/version')
    // A sysfs file (its size is a page, its content shorter), where this kernel has one.
    const sysfs = (await sbx.commands.run('for f in /sys/devices/system/cpu/online ' +
      '/sys/kernel/mm/transparent_hugepage/enabled; do [ -r $f ] && { echo $f; break; }; done')).stdout.trim()
    if (sysfs) {
      const want = (await sbx.commands.run(`cat ${sysfs}`)).stdout
      check(want && (await sbx.files.read(sysfs)) === want, `${sysfs}`)
    }
    await sbx.files.write(`/home/user/empty-${RUN}`, '')
    check((await sbx.files.read(`/home/user/empty-${RUN}`)) === '', 'an empty file')
  } finally {
    await sbx.kill()
  }
})

await test('js_each_boot_has_its_own_boot_id', async () => {
  let a = await Base.create({ timeoutMs: 300_000 })
  const b = await Base.create({ timeoutMs: 300_000 })
  const forks = []
  try {
    const ida = await bootId(a)
    const idb = await bootId(b)
    check(ida !== HOST_BOOT_ID && idb !== HOST_BOOT_ID, "a sandbox reads the host's boot id")
    check(ida !== idb, 'two sandboxes share a boot id')
    check((await a.pause()) === true, 'pause')
    a = await Base.connect(a.sandboxId)
    check((await bootId(a)) === ida, 'a frozen pause changed the boot id')
    check((await a.pause({ keepMemory: false })) === true, 'pause to the filesystem')
    a = await Base.connect(a.sandboxId)
    const again = await bootId(a)
    check(![ida, idb, HOST_BOOT_ID].includes(again), 'a boot from the disk kept a boot id')
    forks.push(...(await a.fork({ count: 1, timeoutMs: 300_000 })))
    check(forks.length === 1 && forks[0] instanceof Base, `forks ${forks}`)
    const forked = await bootId(forks[0])
    check(![ida, idb, again, HOST_BOOT_ID].includes(forked), 'a fork kept a boot id')
    check((await bootId(a)) === again, 'the source changed its boot id')
  } finally {
    for (const s of [a, b, ...forks]) {
      if (s && typeof s.kill === 'function') await s.kill()
    }
  }
})

await test('js_builtin_templates_exist_under_e2b_names', async () => {
  for (const name of ['base', 'code-interpreter-v1', 'code-interpreter']) {
    check((await Template.exists(name)) === true, `exists ${name}`)
    check((await Template.aliasExists(name)) === true, `aliasExists ${name}`)
  }
  check((await Template.exists(`no-such-template-${RUN}`)) === false, 'an unknown template')
})

await test('js_killed_while_a_command_streams', async () => {
  const sbx = await Base.create({ timeoutMs: 300_000 })
  let killed = null
  try {
    await sbx.commands.run('echo up; sleep 600', {
      timeoutMs: 0,
      onStdout: () => {
        killed ??= Base.kill(sbx.sandboxId)
      },
    })
    throw new Error('the command outlived its sandbox')
  } catch (e) {
    check(killed !== null, `the command failed before its output: ${e}`)
    check(e instanceof TimeoutError, `not a TimeoutError: ${e && e.name}: ${e}`)
    check(/killed or reached its end of life/.test(String(e.message)), `error ${e}`)
  } finally {
    if (killed) await killed
  }
})

await test('js_a_write_makes_missing_parents', async () => {
  const sbx = await Base.create({ timeoutMs: 300_000 })
  try {
    const path = `/${RUN}/deeper/a.txt`
    const info = await sbx.files.write(path, 'made')
    check(info.path === path, `written ${JSON.stringify(info)}`)
    check((await sbx.files.read(path)) === 'made', 'read back')
    const owners = (await sbx.commands.run(`stat -c '%U:%G' /${RUN} /${RUN}/deeper ${path}`)).stdout
    check(owners === 'user:user\nuser:user\nuser:user\n', `owners ${JSON.stringify(owners)}`)
  } finally {
    await sbx.kill()
  }
})

console.log(`SUMMARY passed=${passed} failed=${failed}`)
process.exit(failed ? 1 : 0)
