// The template builder flow of E2B's docs with a package install:
// Template().fromTemplate('base').aptInstall(...).copy(...)
// .setStartCmd(..., waitForPort(...)), Template.build, then
// Sandbox.create(name). aptInstall reaches the Debian mirror, so only the
// Go harness's TestTemplateAptInstall runs this file (its kiln serve's
// sandbox networking reaches the real network; KILN_TEST_REAL_NETWORK=1).
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { after } from 'node:test'
import { e2b, run, sandbox, test } from '../lib/sdk.mjs'

const { Template, Sandbox, waitForPort } = e2b
const opts =
  process.env.KILN_TEST_REAL_NETWORK === '1' ? {} : { skip: 'reaches the Debian mirror: run by TestTemplateAptInstall only' }

test('Template with fromTemplate, aptInstall, copy and setStartCmd, then Sandbox.create(name)', opts, async () => {
  const context = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-apt-'))
  after(() => fs.rmSync(context, { recursive: true, force: true }))
  fs.writeFileSync(path.join(context, 'index.html'), 'served by the apt template\n')
  const name = `apt-${run}`
  const t = Template({ fileContextPath: context })
    .fromTemplate('base')
    .aptInstall(['cowsay'], { noInstallRecommends: true })
    .copy('index.html', '/home/user/site/index.html')
    .setWorkdir('/home/user/site')
    .setStartCmd('python3 -m http.server 8000', waitForPort(8000))
  const logs = []
  await Template.build(t, name, { onBuildLogs: (e) => logs.push(e.message) })
  assert.ok(logs.some((l) => /cowsay/.test(l)), logs.join('\n'))

  const sbx = await sandbox(Sandbox, { template: name })
  const r = await sbx.commands.run('/usr/games/cowsay moo; curl -s http://127.0.0.1:8000/index.html')
  assert.match(r.stdout, /< moo >/)
  assert.match(r.stdout, /served by the apt template\n$/)
})
