// The E2B drop-in's last mile, the code interpreter's part (issue 31, items 5 and 7), through
// the unmodified `@e2b/code-interpreter` JavaScript SDK (npm): the default contexts, a context
// in /root, Java's environment and printed lines, chart details, PIL images. Configured only
// by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Prints `PASS name` / `FAIL name: why` and
// `SUMMARY passed=N failed=M`, like harness.py.
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

const RUN = `jslmci${Math.random().toString(16).slice(2, 10)}`

await test('js_code_interpreter_lists_python_and_javascript_from_the_start', async () => {
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  try {
    const langs = (await sbx.listCodeContexts()).map((c) => c.language)
    check(langs.includes('python') && langs.includes('javascript'), `contexts ${langs}`)
    const r = await sbx.runCode('1 + 1', { language: 'js', timeoutMs: 120_000, requestTimeoutMs: 120_000 })
    check(!r.error && r.text === '2', `js ${r.text} ${JSON.stringify(r.error)}`)
  } finally {
    await sbx.kill()
  }
})

const ci = await Sandbox.create({ envs: { TEST_ENV_VAR: 'supertest' }, timeoutMs: 900_000 })

await test('js_code_context_in_root', async () => {
  const ctx = await ci.createCodeContext({ language: 'python', cwd: '/root', requestTimeoutMs: 120_000 })
  try {
    const contexts = await ci.listCodeContexts()
    const last = contexts[contexts.length - 1]
    check(last.id === ctx.id && last.language === 'python' && last.cwd === '/root',
      `last ${JSON.stringify(last)}`)
    const r = await ci.runCode('import os; os.getcwd()', { context: ctx, timeoutMs: 120_000 })
    check(r.text === '/root', `cwd ${r.text} ${JSON.stringify(r.error)}`)
  } finally {
    await ci.removeCodeContext(ctx.id)
  }
})

await test('js_java_environment_and_lines', async () => {
  // The first run starts the Java kernel (a JVM, and JShell's own): generous deadlines.
  let r = await ci.runCode('System.out.println("Hello, World!")',
    { language: 'java', timeoutMs: 180_000, requestTimeoutMs: 180_000 })
  check(r.logs.stdout[0] === 'Hello, World!', `stdout ${JSON.stringify(r.logs.stdout)}`)
  r = await ci.runCode('System.getProperty("TEST_ENV_VAR")', { language: 'java' })
  check(r.results[0]?.text.trim() === 'supertest', `sandbox env ${JSON.stringify(r.results)}`)
  r = await ci.runCode('System.getProperty("FOO")', { language: 'java', envs: { FOO: 'bar' } })
  check(r.results[0]?.text.trim() === 'bar', `run env ${JSON.stringify(r.results)}`)
  r = await ci.runCode('System.getProperty("FOO", "default")', { language: 'java' })
  check(r.results[0]?.text.trim() === 'default', `after ${JSON.stringify(r.results)}`)
  r = await ci.runCode('System.getProperty("TEST_ENV_VAR")', { language: 'java', envs: { TEST_ENV_VAR: 'overwrite' } })
  check(r.results[0]?.text.trim() === 'overwrite', `overwrite ${JSON.stringify(r.results)}`)
  r = await ci.runCode('System.getProperty("TEST_ENV_VAR")', { language: 'java' })
  check(r.results[0]?.text.trim() === 'supertest', `restored ${JSON.stringify(r.results)}`)
})

await test('js_chart_details', async () => {
  let r = await ci.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(8, 8))
ax.pie([90, 10], labels=["No", "No, in blue"], autopct='%1.1f%%', startangle=90)
ax.axis('equal')
plt.title('Will I wake up early tomorrow?')
plt.show()
`, { timeoutMs: 180_000 })
  let chart = r.results[0]?.chart
  check(chart && chart.type === 'pie', `pie ${JSON.stringify(chart)}`)
  check(chart.elements[0].angle === 324 && chart.elements[1].angle === 36,
    `angles ${chart.elements.map((e) => e.angle)}`)
  r = await ci.runCode(`
import matplotlib.pyplot as plt
import numpy as np
plt.xlabel("A")
plt.ylabel("B")
plt.scatter(np.random.rand(5), np.random.rand(5), label='Dataset 1')
plt.show()
`, { timeoutMs: 180_000 })
  chart = r.results[0]?.chart
  check(chart && chart.type === 'scatter' && chart.title === null, `scatter ${JSON.stringify(chart && chart.title)}`)
  r = await ci.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, color='blue', fill=False, linewidth=2))
ax.add_artist(plt.Circle((0, 0), 2, color='red', fill=False, linewidth=2))
ax.grid(True)
plt.title('Two Concentric Circles')
plt.show()
`, { timeoutMs: 180_000 })
  chart = r.results[0]?.chart
  check(chart && chart.type === 'unknown' && chart.title === 'Two Concentric Circles' &&
    chart.elements.length === 0, `unknown ${JSON.stringify(chart)}`)
})

await test('js_pil_show_and_save', async () => {
  const image = `
    import numpy
    from PIL import Image

    imarray = numpy.random.rand(16,16,3) * 255
    image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')
    `
  let r = await ci.runCode(`${image}\n    image.show()\n    print("done")\n`, { timeoutMs: 180_000 })
  check(r.results[0]?.png, `show ${JSON.stringify(r.error)} ${r.results.length}`)
  r = await ci.runCode(`${image}\n    image.save("/tmp/${RUN}.png")\n    print("done")\n`, { timeoutMs: 180_000 })
  check(r.results[0]?.png, `save ${JSON.stringify(r.error)} ${r.results.length}`)
})

await ci.kill()

console.log(`SUMMARY passed=${passed} failed=${failed}`)
process.exit(failed ? 1 : 0)
