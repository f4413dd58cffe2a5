// Pausing and resuming through the SDK (pause, then connect resumes), with
// files, processes and a code interpreter's memory kept; lifecycle on
// timeout (kill, pause, autoResume); getMetrics.
import assert from 'node:assert/strict'
import { before } from 'node:test'
import { ci, e2b, run, sandbox, sdk, test, until } from '../lib/sdk.mjs'

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

  // Without its memory the kernel starts over, and works.
  assert.equal(await resumed.pause({ keepMemory: false }), true)
  const rebooted = await ci.Sandbox.connect(code.sandboxId)
  // The Python kernel starts cold here: minutes on a loaded 2-core host.
  assert.equal((await rebooted.runCode('remembered', { timeoutMs: 300_000 })).error?.name, 'NameError')
  assert.equal((await rebooted.runCode('6 * 7')).text, '42')
})

// expiryWait bounds how long after its timeout a sandbox may take to be
// killed or paused: seconds on a quiet host, but the kill (runsc kill and
// delete, network and mounts) or the pause's checkpoint took over a minute
// with the rest of the suite loading a 2-core host (CI 19, CI 20).
const expiryWait = 180_000

test('a sandbox is killed when its timeout expires', async () => {
  const short = await sandbox(Sandbox, { timeoutMs: 3_000, metadata: { file: 'pause', role: 'expiring' } })
  assert.ok(await until(async () => !(await short.isRunning()), expiryWait), 'still running after its timeout')
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
  }, expiryWait)
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
  const paused = await until(async () => (await sleeper.getInfo()).state === 'paused', expiryWait)
  assert.ok(paused, 'not auto-paused at its timeout')
  assert.equal((await sleeper.commands.run('cat /home/user/wake.txt')).stdout, 'awake')
  assert.equal((await sleeper.getInfo()).state, 'running')
})

// sleeping reports whether the sandbox runs a command started as
// commands.run('sleep 600').
const sleeping = async (sbx) => (await sbx.commands.list()).some((p) => p.args.join(' ').includes('sleep 600'))

test('pause({ keepMemory: false }) keeps the files; connect boots the sandbox afresh on them', async () => {
  const disk = await sandbox(Sandbox, { metadata: { file: 'pause', role: 'files-only' } })
  await disk.files.write('/home/user/disk.txt', 'on disk')
  await disk.commands.run('sleep 600', { background: true })
  assert.equal(await sleeping(disk), true)

  assert.equal(await disk.pause({ keepMemory: false }), true)
  assert.equal((await disk.getInfo()).state, 'paused')
  assert.equal(await disk.isRunning(), false)
  const back = await Sandbox.connect(disk.sandboxId)
  assert.equal((await back.getInfo()).state, 'running')
  assert.equal(await back.files.read('/home/user/disk.txt'), 'on disk')
  assert.equal(await sleeping(back), false, 'a process outlived a pause without memory')
  assert.equal((await back.commands.run('echo $KILN_SANDBOX_ID alive')).stdout, `${disk.sandboxId} alive\n`)
})

test('lifecycle onTimeout pause with keepMemory false (autoPauseMemory) pauses keeping only the files', async () => {
  const napper = await sandbox(Sandbox, {
    timeoutMs: 120_000,
    lifecycle: { onTimeout: { action: 'pause', keepMemory: false } },
    metadata: { file: 'pause', role: 'files-only-napper' },
  })
  await napper.files.write('/home/user/nap.txt', 'zzz')
  await napper.commands.run('sleep 600', { background: true })
  await napper.setTimeout(1_000)
  assert.ok(await until(async () => (await napper.getInfo()).state === 'paused', expiryWait), 'not paused at its timeout')
  const awake = await Sandbox.connect(napper.sandboxId, { timeoutMs: 60_000 })
  assert.equal(await awake.files.read('/home/user/nap.txt'), 'zzz')
  assert.equal(await sleeping(awake), false, 'a process outlived an auto-pause without memory')
})

test('connect with onResume reboot boots a sandbox paused with its memory afresh', {
  skip: sdk.label !== 'latest' && `e2b ${sdk.e2b} has no onResume`,
}, async () => {
  const box = await sandbox(Sandbox, { metadata: { file: 'pause', role: 'reboot' } })
  await box.files.write('/home/user/boot.txt', 'kept')
  await box.commands.run('sleep 600', { background: true })
  assert.equal(await box.pause(), true)
  const back = await Sandbox.connect(box.sandboxId, { onResume: 'reboot' })
  assert.equal(await back.files.read('/home/user/boot.txt'), 'kept')
  assert.equal(await sleeping(back), false, 'a process outlived a reboot')
})
