// Copies of a sandbox through the SDK: fork, and snapshots that new
// sandboxes start from.
import assert from 'node:assert/strict'
import { after } from 'node:test'
import { e2b, run, sandbox, test, track } from '../lib/sdk.mjs'

const { Sandbox } = e2b

test('fork copies a running sandbox into independent sandboxes', async () => {
  const parent = await sandbox(Sandbox, { metadata: { file: 'copies', role: 'parent' } })
  await parent.files.write('/home/user/inherited.txt', 'from the parent')
  const forks = await parent.fork({ count: 2 })
  assert.equal(forks.length, 2)
  for (const f of forks) {
    assert.ok(!(f instanceof Error), `fork failed: ${f?.message}`)
    track(f)
  }
  const ids = new Set([parent.sandboxId, ...forks.map((f) => f.sandboxId)])
  assert.equal(ids.size, 3)
  for (const [i, f] of forks.entries()) {
    assert.equal(await f.files.read('/home/user/inherited.txt'), 'from the parent')
    await f.files.write('/home/user/inherited.txt', `fork ${i}`)
  }
  assert.equal(await parent.files.read('/home/user/inherited.txt'), 'from the parent')
  assert.equal(await forks[0].files.read('/home/user/inherited.txt'), 'fork 0')
  assert.equal(await forks[1].files.read('/home/user/inherited.txt'), 'fork 1')
})

let snapshotId
after(async () => {
  if (snapshotId) await Sandbox.deleteSnapshot(snapshotId).catch(() => {})
})

test('snapshots: create, list, start sandboxes from one, delete', async () => {
  const origin = await sandbox(Sandbox, { metadata: { file: 'copies', role: 'origin' } })
  await origin.files.write('/home/user/snap.txt', 'in the snapshot')
  const snap = await origin.createSnapshot({ name: `e2e-${run}` })
  snapshotId = snap.snapshotId
  assert.equal(typeof snap.snapshotId, 'string')
  assert.ok(snap.names.some((n) => n.includes(`e2e-${run}`)), `names ${snap.names}`)
  assert.equal(await origin.isRunning(), true)

  const listed = await Sandbox.listSnapshots({ sandboxId: origin.sandboxId }).nextItems()
  assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId])
  assert.deepEqual((await origin.listSnapshots().nextItems()).map((s) => s.snapshotId), [snap.snapshotId])

  const child = await sandbox(Sandbox, { template: snap.snapshotId, metadata: { file: 'copies', role: 'child' } })
  assert.notEqual(child.sandboxId, origin.sandboxId)
  assert.equal(await child.files.read('/home/user/snap.txt'), 'in the snapshot')
  await child.files.write('/home/user/snap.txt', 'changed in the child')
  assert.equal(await origin.files.read('/home/user/snap.txt'), 'in the snapshot')

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  snapshotId = undefined
  await assert.rejects(Sandbox.create(snap.snapshotId, { metadata: { e2eRun: run } }), (err) => /^404: /.test(err.message))
})
