// The filesystem through e2b's sandbox.files: text, bytes, blobs and
// streams byte-exact, list/exists/getInfo/makeDir/rename/remove, watchDir,
// and the signed uploadUrl/downloadUrl used with plain fetch.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { before } from 'node:test'
import { e2b, sandbox, test, until } from '../lib/sdk.mjs'

const { Sandbox, FileNotFoundError, NotFoundError, FileType, InvalidArgumentError } = e2b

let sbx
before(async () => {
  sbx = await sandbox(Sandbox, { metadata: { file: 'files' } })
})

const sha256 = (b) => createHash('sha256').update(b).digest('hex')

test('files.write and files.read round-trip text', async () => {
  const text = 'héllo wörld ✓\nline 2\n'
  const info = await sbx.files.write('/home/user/hello.txt', text)
  assert.equal(info.path, '/home/user/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.equal(info.type, FileType.FILE)
  assert.equal(await sbx.files.read('/home/user/hello.txt'), text)
  const cat = await sbx.commands.run('cat /home/user/hello.txt; stat -c %U /home/user/hello.txt')
  assert.equal(cat.stdout, text + 'user\n')
})

test('relative paths resolve against the home directory', async () => {
  const info = await sbx.files.write('relative/dir/note.txt', 'rel')
  assert.equal(info.path, '/home/user/relative/dir/note.txt')
  assert.equal(await sbx.files.read('/home/user/relative/dir/note.txt'), 'rel')
  assert.equal(await sbx.files.read('relative/dir/note.txt'), 'rel')
})

test('bytes and blobs are byte-exact', async () => {
  const all = new Uint8Array(4096).map((_, i) => i % 256)
  await sbx.files.write('/home/user/bytes.bin', all.buffer)
  const back = await sbx.files.read('/home/user/bytes.bin', { format: 'bytes' })
  assert.ok(back instanceof Uint8Array)
  assert.deepEqual(Buffer.from(back), Buffer.from(all))
  const blob = await sbx.files.read('/home/user/bytes.bin', { format: 'blob' })
  assert.deepEqual(Buffer.from(await blob.arrayBuffer()), Buffer.from(all))
  const sum = await sbx.commands.run('sha256sum /home/user/bytes.bin')
  assert.equal(sum.stdout.split(' ')[0], sha256(all))

  await sbx.files.write('/home/user/blob.bin', new Blob([all.subarray(0, 10)]))
  assert.deepEqual([...(await sbx.files.read('/home/user/blob.bin', { format: 'bytes' }))], [...all.subarray(0, 10)])

  await sbx.files.write('/home/user/empty.txt', '')
  assert.equal(await sbx.files.read('/home/user/empty.txt'), '')
  assert.equal((await sbx.files.read('/home/user/empty.txt', { format: 'bytes' })).length, 0)
})

test('streams are written and read whole', async () => {
  const data = randomBytes(3 * 1024 * 1024 + 17)
  const chunk = 256 * 1024
  let off = 0
  const source = new ReadableStream({
    pull(c) {
      if (off >= data.length) return c.close()
      c.enqueue(new Uint8Array(data.subarray(off, off + chunk)))
      off += chunk
    },
  })
  await sbx.files.write('/home/user/stream.bin', source)
  const sum = await sbx.commands.run('sha256sum /home/user/stream.bin')
  assert.equal(sum.stdout.split(' ')[0], sha256(data))

  const stream = await sbx.files.read('/home/user/stream.bin', { format: 'stream' })
  const parts = []
  for await (const p of stream) parts.push(p)
  assert.equal(sha256(Buffer.concat(parts)), sha256(data))
})

test('writing many files at once', async () => {
  const infos = await sbx.files.write([
    { path: '/home/user/multi/a.txt', data: 'A' },
    { path: '/home/user/multi/b/c.txt', data: 'C' },
  ])
  assert.deepEqual(infos.map((i) => i.path).sort(), ['/home/user/multi/a.txt', '/home/user/multi/b/c.txt'])
  assert.equal(await sbx.files.read('/home/user/multi/b/c.txt'), 'C')

  // Relative paths in a multi-file upload resolve against the home
  // directory, as a single file's do.
  const rel = await sbx.files.write([
    { path: 'multi-rel/a.txt', data: 'a' },
    { path: 'multi-rel/b/c.txt', data: 'c' },
  ])
  assert.deepEqual(rel.map((i) => i.path).sort(), ['/home/user/multi-rel/a.txt', '/home/user/multi-rel/b/c.txt'])
  assert.equal(await sbx.files.read('/home/user/multi-rel/b/c.txt'), 'c')
})

test('list, exists, getInfo, makeDir, rename and remove', async () => {
  assert.equal(await sbx.files.makeDir('/home/user/d/sub'), true)
  assert.equal(await sbx.files.makeDir('/home/user/d/sub'), false)
  await sbx.files.write('/home/user/d/a.txt', 'hello')
  await sbx.files.write('/home/user/d/sub/b.txt', 'bb')

  const entries = await sbx.files.list('/home/user/d')
  assert.deepEqual(
    entries.map((e) => [e.name, e.type, e.path]).sort(),
    [
      ['a.txt', FileType.FILE, '/home/user/d/a.txt'],
      ['sub', FileType.DIR, '/home/user/d/sub'],
    ]
  )
  const a = entries.find((e) => e.name === 'a.txt')
  assert.equal(a.size, 5)
  assert.equal(a.owner, 'user')
  assert.equal(a.permissions, '-rw-r--r--')
  assert.ok(a.modifiedTime instanceof Date)

  const deep = await sbx.files.list('/home/user/d', { depth: 2 })
  assert.deepEqual(deep.map((e) => e.path).sort(), ['/home/user/d/a.txt', '/home/user/d/sub', '/home/user/d/sub/b.txt'])

  assert.equal(await sbx.files.exists('/home/user/d/a.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/d/nope.txt'), false)
  const info = await sbx.files.getInfo('/home/user/d/sub')
  assert.equal(info.type, FileType.DIR)
  assert.equal(info.name, 'sub')

  const moved = await sbx.files.rename('/home/user/d/a.txt', '/home/user/d/moved/a2.txt')
  assert.equal(moved.path, '/home/user/d/moved/a2.txt')
  assert.equal(await sbx.files.exists('/home/user/d/a.txt'), false)
  assert.equal(await sbx.files.read('/home/user/d/moved/a2.txt'), 'hello')

  await sbx.files.remove('/home/user/d')
  assert.equal(await sbx.files.exists('/home/user/d'), false)
  await sbx.files.remove('/home/user/d') // removing what is gone is no error
})

test('missing paths raise FileNotFoundError', async () => {
  const missing = (err) => err instanceof FileNotFoundError || err instanceof NotFoundError
  await assert.rejects(sbx.files.read('/home/user/no/such.txt'), missing)
  await assert.rejects(sbx.files.list('/home/user/no/such'), missing)
  await assert.rejects(sbx.files.getInfo('/home/user/no/such'), missing)
  await assert.rejects(sbx.files.rename('/home/user/no/such', '/home/user/x'), missing)
  await assert.rejects(sbx.files.read('/home/user'), (err) => err instanceof InvalidArgumentError)
})

test('watchDir reports creates, writes and removes', async () => {
  await sbx.files.makeDir('/home/user/watched/sub')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/watched', (e) => events.push(e))
  try {
    await sbx.files.write('/home/user/watched/new.txt', 'one')
    await sbx.commands.run('echo more >> /home/user/watched/new.txt; rm /home/user/watched/new.txt')
    const seen = () => new Set(events.filter((e) => e.name === 'new.txt').map((e) => e.type))
    await until(() => seen().has('remove'))
    assert.ok(seen().has('create') || seen().has('write'), `events ${JSON.stringify(events)}`)
    assert.ok(seen().has('write'), `events ${JSON.stringify(events)}`)
    assert.ok(seen().has('remove'), `events ${JSON.stringify(events)}`)
  } finally {
    await handle.stop()
  }
})

test('watchDir with recursive sees nested files', async () => {
  await sbx.files.makeDir('/home/user/rwatch/inner')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/rwatch', (e) => events.push(e), { recursive: true })
  try {
    await sbx.files.write('/home/user/rwatch/inner/deep.txt', 'x')
    const got = await until(() => events.some((e) => e.name === 'inner/deep.txt'))
    assert.ok(got, `events ${JSON.stringify(events)}`)
  } finally {
    await handle.stop()
  }
})

test('signed uploadUrl and downloadUrl work with plain fetch', async () => {
  const up = await sbx.uploadUrl('/home/user/via-url.txt')
  assert.match(up, /[?&]signature=v1_/)
  const form = new FormData()
  form.append('file', new Blob(['uploaded through a URL\n']), 'via-url.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.clone().text())
  assert.equal(await sbx.files.read('/home/user/via-url.txt'), 'uploaded through a URL\n')

  const down = await sbx.downloadUrl('/home/user/via-url.txt')
  assert.match(down, /[?&]signature=v1_/)
  const got = await fetch(down)
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'uploaded through a URL\n')

  const forged = new URL(down)
  forged.searchParams.set('path', '/etc/shadow')
  const denied = await fetch(forged)
  assert.equal(denied.status, 401)
  const expiring = await sbx.downloadUrl('/home/user/via-url.txt', { useSignatureExpiration: 60 })
  assert.match(expiring, /[?&]signature_expiration=\d+/)
  assert.equal(await (await fetch(expiring)).text(), 'uploaded through a URL\n')
})

test('file metadata is stored on write and returned by getInfo and list', async () => {
  const meta = { owner: 'e2e', 'run-id': '42' }
  const info = await sbx.files.write('/home/user/meta/tagged.txt', 'tagged', { metadata: meta })
  assert.deepEqual(info.metadata, meta)
  assert.deepEqual((await sbx.files.getInfo('/home/user/meta/tagged.txt')).metadata, meta)
  const [entry] = await sbx.files.list('/home/user/meta')
  assert.deepEqual(entry.metadata, meta)
  // A rename keeps it and answers it.
  const moved = await sbx.files.rename('/home/user/meta/tagged.txt', '/home/user/meta/renamed.txt')
  assert.deepEqual(moved.metadata, meta)
  await sbx.files.rename('/home/user/meta/renamed.txt', '/home/user/meta/tagged.txt')
  // A write without metadata clears it, as on E2B.
  await sbx.files.write('/home/user/meta/tagged.txt', 'plain')
  assert.equal((await sbx.files.getInfo('/home/user/meta/tagged.txt')).metadata, undefined)
})

test('gzip uploads and downloads and octet-stream writes are byte-exact', async () => {
  const data = Buffer.from('zipped line\n'.repeat(10_000))
  await sbx.files.write('/home/user/gz.txt', data.buffer.slice(data.byteOffset, data.byteOffset + data.length), { gzip: true })
  const sum = await sbx.commands.run('sha256sum /home/user/gz.txt')
  assert.equal(sum.stdout.split(' ')[0], sha256(data))
  assert.equal(await sbx.files.read('/home/user/gz.txt', { gzip: true }), data.toString())
  const bytes = await sbx.files.read('/home/user/gz.txt', { format: 'bytes', gzip: true })
  assert.equal(sha256(bytes), sha256(data))

  await sbx.files.write('/home/user/octet.bin', new Uint8Array([0, 1, 2, 255]).buffer, { useOctetStream: true })
  assert.deepEqual([...(await sbx.files.read('/home/user/octet.bin', { format: 'bytes' }))], [0, 1, 2, 255])
})

test('watchDir with includeEntry carries the entry of created files', async () => {
  await sbx.files.makeDir('/home/user/ewatch')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/ewatch', (e) => events.push(e), { includeEntry: true })
  try {
    await sbx.files.write('/home/user/ewatch/e.txt', 'abc')
    const ev = await until(() => events.find((e) => e.name === 'e.txt' && e.entry?.size === 3))
    assert.ok(ev, `events ${JSON.stringify(events)}`)
    assert.equal(ev.entry.path, '/home/user/ewatch/e.txt')
    assert.equal(ev.entry.type, FileType.FILE)
    assert.equal(ev.entry.owner, 'user')
  } finally {
    await handle.stop()
  }
})
