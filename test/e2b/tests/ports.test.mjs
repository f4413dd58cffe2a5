// Sandbox ports by URL: the host the SDK's sandbox.getHost(port) builds
// from the domain kiln serve returns (<port>-<id>.<domain>; kiln serve's
// default domain is localhost:<its port>) reaches a server in the
// sandbox from this, the SDK's own, process.
import assert from 'node:assert/strict'
import { e2b, sandbox, test, until } from '../lib/sdk.mjs'
import { get } from '../lib/http.mjs'

test('getHost(port) is on kiln serve and reaches a server in the sandbox', async () => {
  const sbx = await sandbox(e2b.Sandbox)
  const api = new URL(process.env.E2B_API_URL)
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.localhost:${api.port}`)
  await sbx.files.write('/tmp/www/hello.txt', 'hello from the sandbox\n')
  await sbx.commands.run('python3 -m http.server 8000 --directory /tmp/www', { background: true })
  // The ports of a sandbox without public traffic need its traffic token.
  const headers = sbx.trafficAccessToken ? { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken } : {}
  const url = `${api.protocol}//${host}/hello.txt`
  const res = await until(async () => {
    const r = await get(url, headers)
    return r.status === 200 ? r : null
  }, 60_000)
  assert.ok(res, `GET ${url} never answered 200`)
  assert.equal(res.body, 'hello from the sandbox\n')

  // A host under the domain that names no sandbox port is not found.
  const bad = await get(`${api.protocol}//nosandbox.localhost:${api.port}/`, {})
  assert.equal(bad.status, 404)
})
