// E2B's template builder (Template, "Build System 2.0") against kiln
// serve's builder: fromTemplate/fromBaseImage, runCmd, copy (an upload to
// the URL kiln serve hands out), setEnvs, setWorkdir, setStartCmd with a
// ready check, Template.build with its logs, the cache, a failing step,
// exists, tags, then sandboxes of the template. The harness's kiln serve
// has networking only in its test world (no real mirror), so no step here
// installs packages: apt.test.mjs does, against a server of its own.
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { after } from 'node:test'
import { e2b, run, sandbox, test } from '../lib/sdk.mjs'

const { Template, Sandbox, BuildError, waitForPort } = e2b

const name = `tpl-${run}`
const context = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-template-'))
fs.writeFileSync(path.join(context, 'hello.txt'), 'hello from the build context\n')

after(async () => {
  fs.rmSync(context, { recursive: true, force: true })
  await deleteTemplate(name).catch(() => {})
})

// deleteTemplate is DELETE /templates/{id}, which the SDK only calls
// through Sandbox.deleteSnapshot.
async function deleteTemplate(id) {
  const res = await fetch(`${process.env.E2B_API_URL}/templates/${id}`, {
    method: 'DELETE',
    headers: { 'X-API-KEY': process.env.E2B_API_KEY },
  })
  return res.status
}

// recipe is the template of the tests: every step but package installs.
function recipe() {
  return Template({ fileContextPath: context })
    .fromTemplate('base')
    .copy('hello.txt', '/home/user/hello.txt')
    .setEnvs({ GREETING: 'hi from the template' })
    .setWorkdir('/home/user/site')
    .runCmd('echo served by the template > index.html && echo built > /home/user/built.txt')
    .setStartCmd('python3 -m http.server 8000', waitForPort(8000))
}

// build runs Template.build and returns its log lines.
async function build(template, ref, opts = {}) {
  const logs = []
  const info = await Template.build(template, ref, { ...opts, onBuildLogs: (e) => logs.push(e) })
  return { info, logs: logs.map((e) => `${e.level} ${e.message}`) }
}

test('Template.build: copy, envs, workdir, runCmd and a start command with a ready check', async () => {
  assert.equal(await Template.exists(name), false)
  const { info, logs } = await build(recipe(), name)
  assert.equal(info.templateId, name)
  assert.equal(typeof info.buildId, 'string')
  // Progress comes from the server's log, step by step.
  assert.ok(logs.some((l) => /\[1\/\d+\] COPY hello\.txt/.test(l)), logs.join('\n'))
  assert.ok(logs.some((l) => /RUN echo served/.test(l)), logs.join('\n'))
  assert.ok(logs.some((l) => /ready/.test(l)), logs.join('\n'))
  assert.equal(await Template.exists(name), true)
  assert.equal(await Template.exists('base'), true)
})

test('Sandbox.create(name): the file, env, workdir and the started server are there', async () => {
  const sbx = await sandbox(Sandbox, { template: name })
  const r = await sbx.commands.run(
    'cat /home/user/hello.txt /home/user/built.txt; echo "$GREETING"; pwd; curl -s http://127.0.0.1:8000/index.html',
  )
  assert.equal(
    r.stdout,
    'hello from the build context\nbuilt\nhi from the template\n/home/user/site\nserved by the template\n',
  )
})

test('a second build with nothing changed is all cached', async () => {
  const { logs } = await build(recipe(), name)
  const cached = logs.filter((l) => / CACHED$/.test(l))
  // COPY and RUN make layers; ENV and WORKDIR do not.
  assert.equal(cached.length, 2, logs.join('\n'))
  assert.ok(!logs.some((l) => /Uploaded 'hello\.txt'/.test(l)), `the upload is cached too:\n${logs.join('\n')}`)
})

test('a failing runCmd fails the build with an error naming the step', async () => {
  const t = Template().fromBaseImage().runCmd('echo about to fail; exit 3')
  const err = await build(t, `${name}-fail`).catch((e) => e)
  assert.ok(err instanceof BuildError, `want a BuildError, got ${err}`)
  assert.match(err.message, /step 1 \(RUN\): the command exited with status 3/)
  assert.match(err.message, /about to fail/)
  // The SDK points the error at the failing step's line here.
  assert.match(err.stack, /templates\.test\.mjs/)
  assert.equal(await Template.exists(`${name}-fail`), false)
})

test('an image kiln serve cannot pull fails the build with the reason', async () => {
  const t = Template().fromImage('registry.invalid/app:1').runCmd('true')
  const err = await build(t, `${name}-image`).catch((e) => e)
  assert.ok(err instanceof BuildError, `want a BuildError, got ${err}`)
  assert.match(err.message, /registry\.invalid/)
})

test('tags: build with a tag, assign, list, remove; sandboxes of name:tag', async () => {
  const t = Template().fromTemplate('base').setEnvs({ TAGGED: 'v2' })
  const { info } = await build(t, `${name}:v2`)
  assert.deepEqual(info.tags, ['v2'])
  await Template.assignTags(`${name}:v2`, ['stable'])
  const tags = await Template.getTags(name)
  const byTag = Object.fromEntries(tags.map((x) => [x.tag, x.buildId]))
  assert.equal(byTag.v2, info.buildId)
  assert.equal(byTag.stable, info.buildId)
  assert.ok(byTag.default && byTag.default !== info.buildId, JSON.stringify(tags))
  const sbx = await sandbox(Sandbox, { template: `${name}:stable` })
  assert.equal((await sbx.commands.run('echo "$TAGGED"')).stdout, 'v2\n')
  await Template.removeTags(name, 'stable')
  assert.ok(!(await Template.getTags(name)).some((x) => x.tag === 'stable'))
})

test('DELETE /templates/{id} deletes the template', async () => {
  assert.equal(await deleteTemplate(name), 204)
  assert.equal(await Template.exists(name), false)
  assert.equal(await deleteTemplate(name), 404)
})
