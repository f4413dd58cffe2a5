// Volumes through the stock SDK: E2B's Volume class (create, list,
// getInfo, destroy, and its file methods on the volume content API) and
// Sandbox.create's volumeMounts, on Kiln's volumes. The SDK sends content
// requests to E2B_VOLUME_API_URL (a user points it at kiln serve, as
// E2B_API_URL); this file defaults it to E2B_API_URL when unset.
import assert from 'node:assert/strict'
import { after } from 'node:test'
import { e2b, run, sandbox, test } from '../lib/sdk.mjs'

process.env.E2B_VOLUME_API_URL ||= process.env.E2B_API_URL

const { Sandbox, Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } = e2b
// An SDK without the Volume class (older releases) has nothing to test.
const skip = Volume ? false : 'this e2b SDK has no Volume class'

const made = []
after(() => Promise.all(made.map((id) => Volume.destroy(id).catch(() => {}))))
const create = async (name) => {
  const vol = await Volume.create(`${name}-${run}`)
  made.push(vol.volumeId)
  return vol
}

test('create, list, getInfo and destroy a volume', { skip }, async () => {
  const vol = await create('meta')
  assert.ok(vol.volumeId && vol.token, `created ${JSON.stringify(vol)}`)
  assert.equal(vol.name, `meta-${run}`)
  const listed = await Volume.list()
  assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === vol.name), JSON.stringify(listed))
  const info = await Volume.getInfo(vol.volumeId)
  assert.equal(info.name, vol.name)
  assert.equal(info.token, vol.token)
  await assert.rejects(Volume.create(vol.name), VolumeError) // names are unique per key
  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
})

test("a volume's files: write, read, list, stat, metadata, remove", { skip }, async () => {
  const vol = await create('files')
  const written = await vol.writeFile('/notes/hello.txt', 'hello volume')
  assert.equal(written.type, 'file')
  assert.equal(written.size, 12)
  assert.equal(written.uid, 1000) // the sandbox's user owns what the API writes
  assert.equal(await vol.readFile('/notes/hello.txt'), 'hello volume')
  const bytes = new Uint8Array([0, 1, 2, 255, 254])
  await vol.writeFile('/bin.dat', bytes.buffer)
  assert.deepEqual(await vol.readFile('/bin.dat', { format: 'bytes' }), bytes)

  const dir = await vol.makeDir('/a/b/c', { force: true })
  assert.equal(dir.type, 'directory')
  await assert.rejects(vol.makeDir('/x/y'), VolumePathNotFoundError) // no parents without force
  const names = (await vol.list('/', { depth: 3 })).map((e) => e.path).sort()
  for (const p of ['/a', '/a/b', '/a/b/c', '/bin.dat', '/notes', '/notes/hello.txt']) {
    assert.ok(names.includes(p), `${p} in ${names}`)
  }
  const top = (await vol.list('/')).map((e) => e.name).sort()
  assert.deepEqual(top, ['a', 'bin.dat', 'notes'])

  const info = await vol.getInfo('/notes/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.ok(info.mtime instanceof Date && info.mtime.getTime() > Date.now() - 3_600_000)
  const changed = await vol.updateMetadata('/notes/hello.txt', { mode: 0o600 })
  assert.equal(changed.mode & 0o777, 0o600)

  assert.equal(await vol.exists('/notes/hello.txt'), true)
  await vol.remove('/notes')
  assert.equal(await vol.exists('/notes/hello.txt'), false)
  await assert.rejects(vol.readFile('/notes/hello.txt'), VolumePathNotFoundError)
  await assert.rejects(vol.getInfo('/nope'), VolumePathNotFoundError)

  // The content API takes the volume's token only.
  const forged = new Volume(vol.volumeId, vol.name, 'not-the-token')
  await assert.rejects(forged.readFile('/bin.dat'), e2b.AuthenticationError)
})

test('sandboxes mount a volume, share it, and it outlives them', { skip }, async () => {
  const vol = await create('shared')
  await vol.writeFile('/seed.txt', 'from the API')
  const one = await sandbox(Sandbox, { volumeMounts: { '/mnt/vol': vol } })
  const two = await sandbox(Sandbox, { volumeMounts: { '/data': vol.name } })

  const info = await Sandbox.getInfo(one.sandboxId)
  assert.deepEqual(info.volumeMounts, [{ name: vol.name, path: '/mnt/vol' }])

  const r = await one.commands.run('cat /mnt/vol/seed.txt && echo from-one > /mnt/vol/one.txt && id -u')
  assert.equal(r.stdout, 'from the API1000\n')
  assert.equal((await two.commands.run('cat /data/one.txt')).stdout, 'from-one\n')
  assert.equal(await vol.readFile('/one.txt'), 'from-one\n')

  // In use: not deleted. A sandbox with volumes is not paused (409, which
  // the SDK answers false) and keeps running.
  await assert.rejects(Volume.destroy(vol.volumeId), VolumeError)
  assert.equal(await one.pause(), false)
  assert.equal(await one.isRunning(), true)
  assert.equal((await one.commands.run('cat /mnt/vol/seed.txt')).stdout, 'from the API')

  await one.kill()
  await two.kill()
  assert.equal(await vol.readFile('/one.txt'), 'from-one\n')
  const three = await sandbox(Sandbox, { volumeMounts: { '/home/user/v': vol } })
  assert.equal((await three.commands.run('cat ~/v/one.txt')).stdout, 'from-one\n')
  await three.kill()
  assert.equal(await Volume.destroy(vol.volumeId), true)
})

test('create refuses an unknown volume and a bad mount path', { skip }, async () => {
  const vol = await create('bad')
  for (const mounts of [{ '/data': `no-such-volume-${run}` }, { relative: vol }, { '/proc/x': vol }]) {
    await assert.rejects(Sandbox.create({ volumeMounts: mounts, metadata: { e2eRun: run } }), (err) => {
      assert.match(String(err.message), /volume|path|400/i)
      return true
    })
  }
})
