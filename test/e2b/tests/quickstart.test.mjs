// E2B's two quick-start programs (examples/), run as they are with node
// against kiln: their output must be what they print on E2B.
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { ci, sandbox, sdkDir, test } from '../lib/sdk.mjs'

const examples = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'examples')

// node runs the program from stdin with the SDK project as its working
// directory, so its bare imports resolve to that project's SDK install.
function runExample(name) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, ['--input-type=module'], { cwd: sdkDir, stdio: ['pipe', 'pipe', 'pipe'] })
    let out = ''
    let err = ''
    p.stdout.on('data', (d) => (out += d))
    p.stderr.on('data', (d) => (err += d))
    p.on('error', reject)
    p.on('close', (code) => resolve({ code, out, err }))
    p.stdin.end(fs.readFileSync(path.join(examples, name)))
  })
}

test('quick start 1 prints hello world and the listing of /', async () => {
  const { code, out, err } = await runExample('quickstart-hello.mjs')
  assert.equal(code, 0, err)
  const [logs, ...names] = out.trimEnd().split('\n')
  assert.equal(logs, "{ stdout: [ 'hello world\\n' ], stderr: [] }")

  // The same template's / as ls sees it in a sandbox of our own.
  const sbx = await sandbox(ci.Sandbox, { metadata: { file: 'quickstart' } })
  const ls = await sbx.commands.run('ls -A /')
  assert.deepEqual([...names].sort(), ls.stdout.trim().split(/\s+/).sort())
  for (const d of ['bin', 'etc', 'home', 'tmp', 'usr']) assert.ok(names.includes(d), `${d} not in ${names}`)
})

test('quick start 2 counts three r in strawberry', async () => {
  const { code, out, err } = await runExample('quickstart-strawberry.mjs')
  assert.equal(code, 0, err)
  assert.equal(out, '3\n')
})

