// Sandbox networking through the SDKs, against a server with the default
// network settings (networking on where the host can, egress open): the
// Go harness runs kiln serve's networking in a test world of its own and
// names its sites in KILN_TEST_* (e2b_test.go, worldEnv). A sandbox
// reaches the world's internet by name and address unless
// allowInternetAccess is false; denyOut/allowOut and updateNetwork limit
// it; the host and the metadata service are never reachable; ports follow
// allowPublicTraffic and maskRequestHost.
import assert from 'node:assert/strict'
import { e2b, sandbox, test, until } from '../lib/sdk.mjs'
import { get, portURL } from '../lib/http.mjs'

const env = process.env
const world = env.KILN_TEST_SITE_IP
  ? {
      siteName: env.KILN_TEST_SITE_NAME,
      siteIP: env.KILN_TEST_SITE_IP,
      body: env.KILN_TEST_SITE_BODY,
      otherIP: env.KILN_TEST_OTHER_SITE_IP,
      hostService: env.KILN_TEST_HOST_SERVICE,
      metadata: env.KILN_TEST_METADATA_IP,
    }
  : null
const opts = world ? {} : { skip: "needs the Go harness's test world (KILN_TEST_* variables, e2b_test.go)" }

// probe fetches each URL from inside sbx; the answer maps URL → body, or
// "blocked" when it cannot connect (refused, reset, unresolved).
const probeScript = `
import json, sys, urllib.request
out = {}
for u in sys.argv[1:]:
    try:
        out[u] = urllib.request.urlopen(u, timeout=5).read().decode()
    except Exception:
        out[u] = "blocked"
print(json.dumps(out))
`
async function probe(sbx, ...urls) {
  await sbx.files.write('/tmp/probe.py', probeScript)
  const r = await sbx.commands.run(`python3 /tmp/probe.py ${urls.map((u) => `'${u}'`).join(' ')}`, { timeoutMs: 60_000 })
  return JSON.parse(r.stdout)
}

const site = () => `http://${world.siteName}/`
const siteIP = () => `http://${world.siteIP}/`
const other = () => `http://${world.otherIP}/`

test('a default sandbox reaches the internet by name and address', opts, async () => {
  const sbx = await sandbox(e2b.Sandbox)
  const got = await probe(sbx, site(), siteIP(), other())
  assert.deepEqual(got, { [site()]: world.body, [siteIP()]: world.body, [other()]: 'cidr' })
})

test('allowInternetAccess: false has no internet', opts, async () => {
  const sbx = await sandbox(e2b.Sandbox, { allowInternetAccess: false })
  const got = await probe(sbx, site(), siteIP())
  assert.deepEqual(got, { [site()]: 'blocked', [siteIP()]: 'blocked' })
})

test("network denyOut 0.0.0.0/0 with allowOut reaches only what allowOut names", opts, async () => {
  const sbx = await sandbox(e2b.Sandbox, { network: { denyOut: ['0.0.0.0/0'], allowOut: [world.siteIP] } })
  const got = await probe(sbx, siteIP(), other())
  assert.deepEqual(got, { [siteIP()]: world.body, [other()]: 'blocked' })
})

test('updateNetwork changes egress live', opts, async () => {
  const sbx = await sandbox(e2b.Sandbox)
  assert.equal((await probe(sbx, other()))[other()], 'cidr')
  await sbx.updateNetwork({ denyOut: ['0.0.0.0/0'], allowOut: [world.siteIP] })
  assert.deepEqual(await probe(sbx, siteIP(), other()), { [siteIP()]: world.body, [other()]: 'blocked' })
  await sbx.updateNetwork({ allowInternetAccess: false })
  assert.deepEqual(await probe(sbx, siteIP(), other()), { [siteIP()]: 'blocked', [other()]: 'blocked' })
  await sbx.updateNetwork({})
  assert.deepEqual(await probe(sbx, siteIP(), other()), { [siteIP()]: world.body, [other()]: 'cidr' })
})

test('the host, the API and the metadata service are unreachable', opts, async () => {
  const sbx = await sandbox(e2b.Sandbox)
  const api = new URL(env.E2B_API_URL)
  const urls = [
    `http://${world.hostService}/`, // the world's host: the machine kiln runs on
    `http://10.11.0.1/`, // the sandbox's gateway (its router)
    `http://127.0.0.1:${api.port}/health`, // kiln's API address (loopback is the sandbox's own)
    `http://${world.metadata}/`, // cloud metadata (link-local)
  ]
  const got = await probe(sbx, ...urls)
  assert.deepEqual(got, Object.fromEntries(urls.map((u) => [u, 'blocked'])))
})

// hostEcho is an HTTP server (port) answering every GET with the request's
// Host header.
const hostEcho = `
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        b = self.headers.get("Host", "").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
http.server.HTTPServer(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
`
async function serveHost(sbx, port) {
  await sbx.files.write('/tmp/host_echo.py', hostEcho)
  await sbx.commands.run(`python3 /tmp/host_echo.py ${port}`, { background: true })
}

// answer polls url until it answers a status other than 502 (the server in
// the sandbox is not up yet) and returns it.
async function answer(url, headers = {}) {
  const r = await until(async () => {
    const r = await get(url, headers)
    return r.status !== 502 ? r : null
  }, 60_000)
  assert.ok(r, `${url} never answered`)
  return r
}

test('allowPublicTraffic: false needs the traffic access token', opts, async () => {
  const sbx = await sandbox(e2b.Sandbox, { network: { allowPublicTraffic: false } })
  assert.ok(sbx.trafficAccessToken, 'no trafficAccessToken')
  await serveHost(sbx, 8000)
  const url = portURL(sbx, 8000)
  const withToken = await answer(url, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
  assert.equal(withToken.status, 200)
  assert.equal((await get(url)).status, 403)
  assert.equal((await get(url, { 'e2b-traffic-access-token': 'not-the-token' })).status, 403)

  // Public (the default): no token needed.
  const pub = await sandbox(e2b.Sandbox)
  await serveHost(pub, 8000)
  assert.equal((await answer(portURL(pub, 8000))).status, 200)
})

test('maskRequestHost is the Host the sandbox sees', opts, async () => {
  const sbx = await sandbox(e2b.Sandbox, { network: { maskRequestHost: 'app.internal:${PORT}' } })
  await serveHost(sbx, 8000)
  const r = await answer(portURL(sbx, 8000))
  assert.equal(r.body, 'app.internal:8000')

  const plain = await sandbox(e2b.Sandbox)
  await serveHost(plain, 8000)
  assert.equal((await answer(portURL(plain, 8000))).body, plain.getHost(8000))

  await assert.rejects(sandbox(e2b.Sandbox, { network: { maskRequestHost: 'http://app.internal/' } }), /mask host/)
})
