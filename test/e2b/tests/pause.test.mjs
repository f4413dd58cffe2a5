// Pausing and resuming through the SDK (pause, then connect resumes), with
// files, processes and a code interpreter's memory kept; lifecycle on
// timeout (kill, pause, autoResume); getMetrics.
import assert from 'node:assert/strict'
import { before } from 'node:test'
import { ci, e2b, run, sandbox, test, until } from '../lib/sdk.mjs'

const { Sandbox } = e2b

let sbx
const meta = { file: 'pause' }
before(async () => {
  sbx = await sandbox(Sandbox, { metadata: meta })
})

test('getMetrics reports CPU, memory and disk', async () => {
  const metrics = await until(async () => {
    const m = await sbx.getMetrics()
    return m.length > 0 && m
  })
  assert.ok(metrics, 'no metrics')
  const m = metrics.at(-1)
  assert.ok(m.timestamp instanceof Date)
  assert.equal(m.cpuCount, 1)
  assert.ok(m.cpuUsedPct >= 0)
  assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, `mem ${m.memUsed}/${m.memTotal}`)
  assert.ok(m.diskTotal > 0 && m.diskUsed <= m.diskTotal, `disk ${m.diskUsed}/${m.diskTotal}`)

  // start and end bound the samples: none from a window an hour ago.
  const hour = 3600_000
  const old = await sbx.getMetrics({ start: new Date(Date.now() - 2 * hour), end: new Date(Date.now() - hour) })
  assert.deepEqual(old, [])
  const recent = await sbx.getMetrics({ start: new Date(Date.now() - hour), end: new Date(Date.now() + hour) })
  assert.equal(recent.length, 1)
})

test('pause, list as paused, connect resumes with files and processes', async () => {
  await sbx.files.write('/home/user/kept.txt', 'across the pause')
  const bg = await sbx.commands.run('sleep 600', { background: true })

  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.equal((await sbx.getInfo()).state, 'paused')
  assert.equal(await sbx.pause(), false) // already paused
  const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { e2eRun: run, ...meta } } }).nextItems()
  assert.deepEqual(paused.map((s) => [s.sandboxId, s.state]), [[sbx.sandboxId, 'paused']])
  const running = await Sandbox.list({ query: { state: ['running'], metadata: { e2eRun: run, ...meta } } }).nextItems()
  assert.deepEqual(running, [])

  const resumed = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await resumed.isRunning(), true)
  assert.equal((await resumed.getInfo()).state, 'running')
  assert.equal(await resumed.files.read('/home/user/kept.txt'), 'across the pause')
  assert.ok((await resumed.commands.list()).some((p) => p.pid === bg.pid), `pid ${bg.pid} gone after resume`)
})

test('a code interpreter keeps its variables across pause and resume', async () => {
  const code = await sandbox(ci.Sandbox, { metadata: { file: 'pause', role: 'code' } })
  await code.runCode('import random\nremembered = random.random()')
  const before = (await code.runCode('remembered')).text
  assert.equal(await code.pause(), true)
  const resumed = await ci.Sandbox.connect(code.sandboxId)
  assert.equal((await resumed.runCode('remembered')).text, before)
})

test('a sandbox is killed when its timeout expires', async () => {
  const short = await sandbox(Sandbox, { timeoutMs: 3_000, metadata: { file: 'pause', role: 'expiring' } })
  assert.ok(await until(async () => !(await short.isRunning()), 60_000), 'still running after its timeout')
  await assert.rejects(Sandbox.getInfo(short.sandboxId), (err) => err instanceof e2b.NotFoundError)
})

test('lifecycle onTimeout pause pauses at expiry and connect resumes it', async () => {
  const napper = await sandbox(Sandbox, {
    timeoutMs: 120_000,
    lifecycle: { onTimeout: 'pause' },
    metadata: { file: 'pause', role: 'napper' },
  })
  assert.deepEqual((await napper.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
  await napper.files.write('/home/user/nap.txt', 'zzz')
  await napper.setTimeout(1_000)
  const state = await until(async () => {
    const s = (await napper.getInfo()).state
    return s === 'paused' && s
  }, 60_000)
  assert.equal(state, 'paused')
  assert.equal(await napper.isRunning(), false)
  const awake = await Sandbox.connect(napper.sandboxId, { timeoutMs: 60_000 })
  assert.equal((await awake.getInfo()).state, 'running')
  assert.equal(await awake.files.read('/home/user/nap.txt'), 'zzz')
})

test('lifecycle autoResume: a data-plane request resumes a paused sandbox', async () => {
  const sleeper = await sandbox(Sandbox, {
    timeoutMs: 120_000,
    lifecycle: { onTimeout: 'pause', autoResume: true },
    metadata: { file: 'pause', role: 'sleeper' },
  })
  assert.deepEqual((await sleeper.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: true })
  await sleeper.files.write('/home/user/wake.txt', 'awake')

  assert.equal(await sleeper.pause(), true)
  assert.equal((await sleeper.getInfo()).state, 'paused')
  assert.equal(await sleeper.files.read('/home/user/wake.txt'), 'awake')
  assert.equal((await sleeper.getInfo()).state, 'running')

  await sleeper.setTimeout(1_000)
  const paused = await until(async () => (await sleeper.getInfo()).state === 'paused', 60_000)
  assert.ok(paused, 'not auto-paused at its timeout')
  assert.equal((await sleeper.commands.run('cat /home/user/wake.txt')).stdout, 'awake')
  assert.equal((await sleeper.getInfo()).state, 'running')
})
