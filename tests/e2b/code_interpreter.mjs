// The unmodified `@e2b/code-interpreter` JavaScript SDK (npm) against a Rampart daemon: every
// language in a stateful session, errors, env vars, cwd, streaming, a chart and pandas data.
// Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Prints `PASS name` /
// `FAIL name: why` per test and `SUMMARY passed=N failed=M`, like harness.py.
import { Sandbox } from '@e2b/code-interpreter'

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

const sbx = await Sandbox.create({ envs: { CI_JS_ENV: 'from-create' }, timeoutMs: 600_000 })

// language -> [define, use, want (text; null: printed "42\n"), error code, error name,
//              code showing CI_JS_ENV, its want (null: printed), code showing the cwd]
const LANGS = {
  python: ['v = 20', 'v * 2 + 2', '42', '1 / 0', 'ZeroDivisionError',
    "import os; os.getenv('CI_JS_ENV')", '{}', 'import os; os.getcwd()'],
  javascript: ['let v = 20', 'v * 2 + 2', '42', 'null.x', 'TypeError',
    'process.env.CI_JS_ENV', '{}', 'process.cwd()'],
  typescript: ['const v: number = 20', 'v * 2 + 2', '42', "throw new RangeError('r')", 'RangeError',
    "Deno.env.get('CI_JS_ENV')", '{}', 'Deno.cwd()'],
  r: ['v <- 20', 'v * 2 + 2', '[1] 42', "stop('bad')", 'ERROR',
    "Sys.getenv('CI_JS_ENV')", '[1] "{}"', 'getwd()'],
  java: ['int v = 20;', 'v * 2 + 2', '42', 'Integer.parseInt("x")', 'NumberFormatException',
    'System.getenv("CI_JS_ENV")', '{}', 'System.getProperty("user.dir")'],
  bash: ['v=20', 'echo $((v * 2 + 2))', null, 'false', 'ExitCode',
    'echo $CI_JS_ENV', null, 'pwd'],
}

function shown(e, want) {
  return want === null ? e.logs.stdout.join('') : e.text
}

for (const [lang, [define, use, want, err, errName, env, envWant, cwdCode]] of Object.entries(LANGS)) {
  await test(`js_sdk_${lang}_session`, async () => {
    const cwd = `/tmp/ci-js-${lang}`
    const ctx = await sbx.createCodeContext({ language: lang, cwd, requestTimeoutMs: 120_000 })
    check(ctx.language === lang && ctx.cwd === cwd, `context ${JSON.stringify(ctx)}`)
    try {
      let e = await sbx.runCode(define, { context: ctx, timeoutMs: 120_000 })
      check(!e.error, `define: ${JSON.stringify(e.error)}`)
      e = await sbx.runCode(use, { context: ctx })
      check(shown(e, want) === (want ?? '42\n'), `use: ${JSON.stringify(shown(e, want))}`)
      const out = []
      e = await sbx.runCode(env, { context: ctx, onStdout: (m) => out.push(m) })
      const val = 'from-create'
      check(shown(e, envWant) === (envWant === null ? `${val}\n` : envWant.replace('{}', val)),
        `sandbox env: ${JSON.stringify(shown(e, envWant))}`)
      if (envWant === null) check(out.map((m) => m.line).join('') === `${val}\n`, `onStdout ${JSON.stringify(out)}`)
      e = await sbx.runCode(env, { context: ctx, envs: { CI_JS_ENV: 'per-run' } })
      check(shown(e, envWant) === (envWant === null ? 'per-run\n' : envWant.replace('{}', 'per-run')),
        `per-run env: ${JSON.stringify(shown(e, envWant))}`)
      e = await sbx.runCode(env, { context: ctx })
      check(shown(e, envWant).includes(val), `env not restored: ${JSON.stringify(shown(e, envWant))}`)
      const errors = []
      e = await sbx.runCode(err, { context: ctx, onError: (x) => errors.push(x) })
      check(e.error && e.error.name === errName, `error ${JSON.stringify(e.error)}`)
      check(typeof e.error.traceback === 'string' && e.error.traceback.length > 0, 'traceback')
      check(errors.length === 1, `onError ${errors.length}`)
      e = await sbx.runCode(cwdCode, { context: ctx })
      const cwdWant = lang === 'bash' ? null : lang === 'r' ? `[1] "${cwd}"` : cwd
      check(shown(e, cwdWant) === (cwdWant ?? `${cwd}\n`), `cwd ${JSON.stringify(shown(e, cwdWant))}`)
      const listed = await sbx.listCodeContexts()
      check(listed.some((c) => c.id === ctx.id && c.language === lang), 'not listed')
    } finally {
      await sbx.removeCodeContext(ctx)
    }
  })
}

await test('js_sdk_language_option_and_aliases', async () => {
  let e = await sbx.runCode('const fromJs = 6', { language: 'js' })
  check(!e.error, JSON.stringify(e.error))
  e = await sbx.runCode('fromJs * 7', { language: 'javascript' })
  check(e.text === '42', `js alias: ${e.text}`)
  e = await sbx.runCode("let t: string = 'ts'; t + t", { language: 'ts' })
  check(e.text === 'tsts', `ts: ${e.text}`)
  e = await sbx.runCode('x <- c(1, 2, 3); mean(x)', { language: 'r' })
  check(e.text === '[1] 2', `r: ${e.text}`)
  e = await sbx.runCode('"j".repeat(3)', { language: 'java' })
  check(e.text === 'jjj', `java: ${e.text}`)
  e = await sbx.runCode('echo bash-ok', { language: 'bash' })
  check(e.logs.stdout.join('') === 'bash-ok\n', `bash: ${JSON.stringify(e.logs)}`)
})

await test('js_sdk_chart_and_data', async () => {
  let e = await sbx.runCode(
    'import matplotlib.pyplot as plt\n' +
    "plt.bar(['a', 'b'], [1, 2], label='g'); plt.title('T'); plt.ylabel('n (kg)'); plt.show()")
  check(!e.error, JSON.stringify(e.error))
  const r = e.results.find((x) => x.chart)
  check(r && r.png, `formats ${JSON.stringify(e.results.map((x) => x.formats()))}`)
  const c = r.chart
  check(c.type === 'bar' && c.title === 'T' && c.y_label === 'n (kg)' && c.y_unit === 'kg', JSON.stringify(c))
  check(JSON.stringify(c.elements) === JSON.stringify([
    { label: 'a', group: 'g', value: 1 }, { label: 'b', group: 'g', value: 2 }]), JSON.stringify(c.elements))
  e = await sbx.runCode("import pandas as pd; pd.DataFrame({'a': [1, 2]})")
  check(JSON.stringify(e.results[0].data) === '{"a":[1,2]}', JSON.stringify(e.results[0].data))
})

await sbx.kill()
console.log(`SUMMARY passed=${passed} failed=${failed}`)
