// Tenancy through the SDK: a second API key sees none of the first key's
// sandboxes, and knowing a sandbox id without its access token opens none
// of its data plane.
import assert from 'node:assert/strict'
import { after, before } from 'node:test'
import { ci, e2b, run, sandbox, test } from '../lib/sdk.mjs'

const { Sandbox, NotFoundError } = e2b
const api = process.env.E2B_API_URL
const data = process.env.E2B_SANDBOX_URL

let mine
let otherKey
let otherKeyId
before(async () => {
  mine = await sandbox(ci.Sandbox, { metadata: { file: 'tenancy' } })
  // A second, non-admin key from Kiln's own API (needs E2B_API_KEY to be
  // an admin key, as the one kiln serve prints on its first start is).
  const res = await fetch(`${api}/v1/keys`, {
    method: 'POST',
    headers: { 'X-API-Key': process.env.E2B_API_KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({ name: `e2e-${run}` }),
  })
  assert.equal(res.status, 201, `creating a second key: ${res.status} ${await res.clone().text()}`)
  const key = await res.json()
  otherKeyId = key.id
  otherKey = key.secret
  assert.match(otherKey, /^e2b_[0-9a-f]{40}$/)
})

after(async () => {
  if (!otherKeyId) return
  const res = await fetch(`${api}/v1/keys/${otherKeyId}`, { method: 'DELETE', headers: { 'X-API-Key': process.env.E2B_API_KEY } })
  assert.ok(res.ok, `revoking the second key: ${res.status}`)
})

test("another key cannot list, inspect, connect to, time or kill a sandbox", async () => {
  const as = { apiKey: otherKey }
  const listed = await Sandbox.list({ ...as, query: { metadata: { e2eRun: run, file: 'tenancy' } } }).nextItems()
  assert.deepEqual(listed, [])
  const notFound = (err) => err instanceof NotFoundError
  await assert.rejects(Sandbox.getInfo(mine.sandboxId, as), notFound)
  await assert.rejects(Sandbox.connect(mine.sandboxId, as), notFound)
  await assert.rejects(Sandbox.setTimeout(mine.sandboxId, 1_000, as), notFound)
  assert.equal(await Sandbox.kill(mine.sandboxId, as), false)
  assert.equal(await mine.isRunning(), true)
  assert.equal((await mine.runCode('6 * 7')).text, '42')
})

const routed = (port, token) => ({
  'E2b-Sandbox-Id': mine.sandboxId,
  'E2b-Sandbox-Port': String(port),
  'Content-Type': 'application/json',
  ...(token && { 'X-Access-Token': token }),
})

test('the data plane needs the sandbox access token', async () => {
  for (const token of [undefined, 'not-the-token']) {
    const list = await fetch(`${data}/filesystem.Filesystem/ListDir`, {
      method: 'POST',
      headers: routed(49983, token),
      body: JSON.stringify({ path: '/' }),
    })
    assert.equal(list.status, 401, `ListDir with token ${token}`)
    const file = await fetch(`${data}/files?path=/etc/hostname`, { headers: routed(49983, token) })
    assert.equal(file.status, 401, `GET /files with token ${token}`)
    const exec = await fetch(`${data}/execute`, {
      method: 'POST',
      headers: routed(49999, token),
      body: JSON.stringify({ code: 'print(1)' }),
    })
    assert.equal(exec.status, 401, `/execute with token ${token}`)
  }
  const ok = await fetch(`${data}/filesystem.Filesystem/ListDir`, {
    method: 'POST',
    headers: routed(49983, mine.envdAccessToken),
    body: JSON.stringify({ path: '/home' }),
  })
  assert.equal(ok.status, 200)
  assert.deepEqual((await ok.json()).entries.map((e) => e.name), ['user'])
})
