// Host-form URLs over HTTPS with the unmodified `e2b` JavaScript SDK (npm), as tls.py does
// with the Python SDK (`crates/rampart-cli/tests/e2b_tls.rs`). The daemon serves HTTPS on
// 127.0.0.1:RAMPART_TLS_PORT with a wildcard certificate for `*.test.example` from a test CA
// (NODE_EXTRA_CA_CERTS). The SDK is configured by E2B_API_KEY, E2B_API_URL and its own
// `proxy` option only: a CONNECT proxy here sends every `<name>.test.example:443` to the
// daemon and refuses every other destination, so nothing leaves the machine. Prints
// `PASS name` / `FAIL name: why` and `SUMMARY passed=N failed=M` (harness.mjs).
import net from 'node:net'
import { Sandbox } from 'e2b'
import { ProxyAgent, fetch } from 'undici'
import { check, done, test } from './harness.mjs'

const DOMAIN = 'test.example'
const DAEMON_PORT = Number(process.env.RAMPART_TLS_PORT)
const SEEN = []

const proxy = net.createServer((down) => {
  let head = Buffer.alloc(0)
  const onData = (b) => {
    head = Buffer.concat([head, b])
    const end = head.indexOf('\r\n\r\n')
    if (end < 0) return
    down.off('data', onData)
    const [method, target] = head.subarray(0, end).toString('latin1').split(' ')
    const i = target.lastIndexOf(':')
    const host = target.slice(0, i)
    const ok = method === 'CONNECT' && target.slice(i + 1) === '443' &&
      (host === DOMAIN || host.endsWith('.' + DOMAIN))
    SEEN.push([host, ok])
    if (!ok) {
      down.end('HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n')
      return
    }
    const up = net.connect(DAEMON_PORT, '127.0.0.1', () => {
      down.write('HTTP/1.1 200 Connection established\r\n\r\n')
      const rest = head.subarray(end + 4)
      if (rest.length) up.write(rest)
      up.pipe(down)
      down.pipe(up)
    })
    up.on('error', () => down.destroy())
    down.on('error', () => up.destroy())
  }
  down.on('data', onData)
})
await new Promise((r) => proxy.listen(0, '127.0.0.1', r))
const PROXY = `http://127.0.0.1:${proxy.address().port}`
const WEB = new ProxyAgent({ uri: PROXY, proxyTunnel: true })
const opts = { proxy: PROXY, timeoutMs: 120_000 }


async function get(url, headers = {}) {
  const r = await fetch(url, { dispatcher: WEB, headers })
  return { status: r.status, text: await r.text() }
}

/** A web server in the sandbox on `port`, answering `hello <Host>` (waits until it does). */
async function servePort(sbx, port = 8000) {
  await sbx.files.write(
    '/tmp/web.py',
    'import http.server\n' +
      'class H(http.server.BaseHTTPRequestHandler):\n' +
      '    def do_GET(self):\n' +
      "        b = ('hello ' + self.headers.get('Host', '')).encode()\n" +
      '        self.send_response(200)\n' +
      "        self.send_header('Content-Length', str(len(b)))\n" +
      '        self.end_headers()\n' +
      '        self.wfile.write(b)\n' +
      `http.server.ThreadingHTTPServer(('127.0.0.1', ${port}), H).serve_forever()\n`,
  )
  await sbx.commands.run('python3 /tmp/web.py', { background: true })
  const deadline = Date.now() + 30_000
  for (;;) {
    const r = await sbx.commands.run(`curl -s localhost:${port}/ || true`)
    if (r.stdout.startsWith('hello')) return
    check(Date.now() < deadline, 'the server inside answers within 30 s')
    await new Promise((res) => setTimeout(res, 100))
  }
}

await test('envd_and_a_public_port_at_the_host_form', async () => {
  const sbx = await Sandbox.create(opts)
  try {
    check(sbx.sandboxDomain === DOMAIN, `domain ${sbx.sandboxDomain}`)
    const r = await sbx.commands.run('echo hello over tls')
    check(r.stdout === 'hello over tls\n', r.stdout)
    await sbx.files.write('/home/user/tls/a.txt', 'written over https')
    check((await sbx.files.read('/home/user/tls/a.txt')) === 'written over https', 'read back')
    await servePort(sbx)
    const host = sbx.getHost(8000)
    check(host === `8000-${sbx.sandboxId}.${DOMAIN}`, host)
    const page = await get(`https://${host}/`)
    check(page.status === 200 && page.text === 'hello localhost:8000', JSON.stringify(page))
    const envd = await get(`https://${sbx.getHost(49983)}/files?path=/etc/hostname`)
    check(envd.status === 401, `envd without its token: ${envd.status}`)
    check(SEEN.every(([, ok]) => ok), JSON.stringify(SEEN))
  } finally {
    await sbx.kill()
  }
})

await test('a_private_sandbox_needs_the_traffic_token', async () => {
  const sbx = await Sandbox.create({ ...opts, network: { allowPublicTraffic: false } })
  try {
    await servePort(sbx)
    const url = `https://${sbx.getHost(8000)}/`
    const none = await get(url)
    check(none.status === 403, `without the token: ${none.status} ${none.text}`)
    const token = sbx.trafficAccessToken
    check(token, 'a traffic access token')
    const ok = await get(url, { 'e2b-traffic-access-token': token })
    check(ok.status === 200 && ok.text === 'hello localhost:8000', JSON.stringify(ok))
  } finally {
    await sbx.kill()
  }
})

await test('mask_request_host_on_the_host_form', async () => {
  const sbx = await Sandbox.create({
    ...opts,
    network: { maskRequestHost: '${PORT}-myapp.example.com' },
  })
  try {
    await servePort(sbx)
    const page = await get(`https://${sbx.getHost(8000)}/`)
    check(page.status === 200 && page.text === 'hello 8000-myapp.example.com', JSON.stringify(page))
  } finally {
    await sbx.kill()
  }
})

proxy.close()
await WEB.close()
done()
