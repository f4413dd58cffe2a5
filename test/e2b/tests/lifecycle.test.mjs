// The sandbox lifecycle through e2b's Sandbox: create, getInfo, setTimeout,
// list with metadata filters and pagination, connect, isRunning, kill, and
// the errors the SDK raises for a bad key and a gone sandbox.
import assert from 'node:assert/strict'
import { after, before } from 'node:test'
import { e2b, run, sandbox, sdk, test } from '../lib/sdk.mjs'

const { Sandbox, AuthenticationError, NotFoundError, TimeoutError } = e2b

let sbx
const meta = { e2eRun: run, file: 'lifecycle', role: 'main', 'odd key?': 'a b&c=d/é' }

before(async () => {
  sbx = await sandbox(Sandbox, { metadata: meta, timeoutMs: 120_000 })
})

const seconds = (a, b) => (b.getTime() - a.getTime()) / 1000

test('Sandbox.create returns a running base sandbox', async () => {
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  assert.equal(await sbx.isRunning(), true)
  const r = await sbx.commands.run('cat /etc/os-release | grep ^ID=')
  assert.equal(r.stdout, 'ID=debian\n')
})

test('getInfo reports id, template, metadata, state and lifetime', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.ok(info.templateId === 'base' || info.name === 'base', `template ${info.templateId} (${info.name})`)
  assert.deepEqual(info.metadata, meta)
  assert.equal(info.state, 'running')
  assert.ok(info.startedAt instanceof Date && info.endAt instanceof Date)
  assert.ok(info.startedAt <= new Date(), `startedAt ${info.startedAt.toISOString()} is in the future`)
  const ttl = seconds(info.startedAt, info.endAt)
  assert.ok(ttl > 100 && ttl <= 121, `endAt - startedAt = ${ttl}s, want 120s`)
  assert.ok(info.cpuCount >= 1, `cpuCount ${info.cpuCount}`)
  assert.ok(info.memoryMB >= 128, `memoryMB ${info.memoryMB}`)
  assert.match(info.envdVersion, /^\d+\.\d+\.\d+$/)

  const same = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(same.sandboxId, sbx.sandboxId)
  assert.deepEqual(same.metadata, meta)
})

test('setTimeout extends and shortens the lifetime', async () => {
  await sbx.setTimeout(600_000)
  const longer = await sbx.getInfo()
  const left = seconds(new Date(), longer.endAt)
  assert.ok(left > 540 && left <= 601, `${left}s left after setTimeout(600s)`)

  await sbx.setTimeout(300_000)
  const shorter = await sbx.getInfo()
  assert.ok(shorter.endAt < longer.endAt, `endAt ${shorter.endAt.toISOString()} not before ${longer.endAt.toISOString()}`)
  assert.equal(await sbx.isRunning(), true)
})

test('setTimeout(0) expires the sandbox now: killed, or paused with onTimeout pause', async () => {
  const doomed = await sandbox(Sandbox, { metadata: { file: 'lifecycle-timeout0', role: 'killed' } })
  await doomed.setTimeout(0)
  assert.equal(await doomed.isRunning(), false)
  await assert.rejects(Sandbox.getInfo(doomed.sandboxId), (err) => err instanceof NotFoundError)

  const napper = await sandbox(Sandbox, {
    metadata: { file: 'lifecycle-timeout0', role: 'paused' },
    lifecycle: { onTimeout: 'pause' },
  })
  await napper.setTimeout(0)
  assert.equal(await napper.isRunning(), false)
  assert.equal((await napper.getInfo()).state, 'paused')
})

async function listAll(opts) {
  const pager = Sandbox.list(opts)
  const pages = []
  while (pager.hasNext) {
    pages.push(await pager.nextItems())
  }
  return pages
}

test('Sandbox.list filters by metadata and paginates', async () => {
  const other = await sandbox(Sandbox, { metadata: { file: 'lifecycle', role: 'other' } })

  const [mine] = await listAll({ query: { metadata: meta } })
  assert.deepEqual(mine.map((s) => s.sandboxId), [sbx.sandboxId])
  const s = mine[0]
  assert.deepEqual(s.metadata, meta)
  assert.equal(s.state, 'running')
  assert.ok(s.startedAt instanceof Date)

  const both = (await listAll({ query: { metadata: { e2eRun: run, file: 'lifecycle' } } })).flat()
  assert.deepEqual(both.map((s) => s.sandboxId).sort(), [sbx.sandboxId, other.sandboxId].sort())

  const pages = await listAll({ query: { metadata: { e2eRun: run, file: 'lifecycle' } }, limit: 1 })
  assert.deepEqual(pages.map((p) => p.length), [1, 1])
  assert.deepEqual(pages.flat().map((s) => s.sandboxId).sort(), [sbx.sandboxId, other.sandboxId].sort())

  const none = (await listAll({ query: { metadata: { e2eRun: run, file: 'no such file' } } })).flat()
  assert.deepEqual(none, [])
})

test('Sandbox.list startedAfter includes a sandbox started at that instant', {
  skip: sdk.label !== 'latest' && `e2b ${sdk.e2b} has no startedAfter`,
}, async () => {
  const { startedAt } = await sbx.getInfo()
  const listed = async (startedAfter) =>
    (await listAll({ query: { startedAfter, metadata: meta } })).flat().map((s) => s.sandboxId)
  assert.deepEqual(await listed(startedAt), [sbx.sandboxId])
  assert.deepEqual(await listed(new Date(startedAt.getTime() + 1)), [])
})

test('Sandbox.connect attaches to a running sandbox by id', async () => {
  await sbx.files.write('/tmp/connect.txt', 'before connect')
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(again.sandboxId, sbx.sandboxId)
  assert.equal(await again.files.read('/tmp/connect.txt'), 'before connect')
  const r = await again.commands.run('echo connected')
  assert.equal(r.stdout, 'connected\n')
})

test('an unknown template is refused with a 404 SandboxError', async () => {
  await assert.rejects(Sandbox.create('no-such-template-e2e', { metadata: { e2eRun: run } }), (err) => {
    assert.ok(err instanceof e2b.SandboxError, `${err?.constructor?.name}: ${err?.message}`)
    assert.match(err.message, /^404: .*no-such-template-e2e/)
    return true
  })
})

test('a malformed or unknown API key is refused with AuthenticationError', async () => {
  await assert.rejects(
    Sandbox.create({ apiKey: 'e2b_' + '0'.repeat(40), metadata: { e2eRun: run } }),
    (err) => err instanceof AuthenticationError
  )
})

test('kill stops the sandbox: isRunning false, kill again false, getInfo/connect not found', async () => {
  const victim = await sandbox(Sandbox, { metadata: { file: 'lifecycle', role: 'victim' } })
  const id = victim.sandboxId
  await victim.kill()
  assert.equal(await victim.isRunning(), false)
  assert.equal(await Sandbox.kill(id), false)
  await assert.rejects(Sandbox.getInfo(id), (err) => err instanceof NotFoundError)
  await assert.rejects(Sandbox.connect(id), (err) => err instanceof NotFoundError)
  // The data plane of a killed sandbox answers 502, which the SDK reports
  // as a gone sandbox for streams and as a timeout for unary calls.
  await assert.rejects(victim.commands.run('true'), (err) => {
    assert.ok(err instanceof NotFoundError, `${err?.constructor?.name}: ${err?.message}`)
    assert.equal(err.message, 'Sandbox is probably not running anymore')
    return true
  })
  await assert.rejects(victim.files.list('/'), (err) => err instanceof TimeoutError)
  const left = (await listAll({ query: { metadata: { e2eRun: run, role: 'victim' } } })).flat()
  assert.deepEqual(left, [])
})

after(() => console.log(`# e2b ${sdk.e2b}, @e2b/code-interpreter ${sdk.codeInterpreter}`))
