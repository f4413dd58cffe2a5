// Shared by every test file: loads the stock E2B SDKs from the npm project
// named by E2B_SDK_DIR (test/e2b/latest or test/e2b/v1), so the same tests
// run against each pinned SDK install, and gives the tests a few helpers.
// The SDKs are configured only by the environment (E2B_API_URL,
// E2B_SANDBOX_URL, E2B_API_KEY), exactly as a user would.
import { createRequire } from 'node:module'
import { after, test as nodeTest } from 'node:test'
import fs from 'node:fs'
import path from 'node:path'
import { randomBytes } from 'node:crypto'
import knownFailures from './known-failures.mjs'

export const sdkDir = process.env.E2B_SDK_DIR
if (!sdkDir) {
  throw new Error('E2B_SDK_DIR must name an npm project with the SDKs installed (see test/e2b/README.md)')
}
for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set (see test/e2b/README.md)`)
}
if (process.env.E2B_DEBUG !== undefined) {
  throw new Error('E2B_DEBUG must not be set: it makes the SDK skip the control plane')
}

const require = createRequire(path.join(sdkDir, 'package.json'))
export const e2b = require('e2b')
export const ci = require('@e2b/code-interpreter')

const version = (pkg) =>
  JSON.parse(fs.readFileSync(require.resolve(`${pkg}/package.json`), 'utf8')).version
// label is the SDK project's name: "latest" or "v1".
export const sdk = {
  label: path.basename(sdkDir),
  e2b: version('e2b'),
  codeInterpreter: version('@e2b/code-interpreter'),
}

// run tags every sandbox this process creates, so list filters and leak
// checks only see this run's sandboxes.
export const run = `${sdk.label}-${process.pid}-${randomBytes(3).toString('hex')}`

// test is node:test's test with the name prefixed by the test file's area
// ("files: ..." for tests/files.test.mjs), except that a test named in
// known-failures.mjs for this SDK is skipped with its reason, unless
// E2B_RUN_KNOWN_FAILURES=1.
export function test(name, opts, fn) {
  if (typeof opts === 'function') [opts, fn] = [{}, opts]
  name = `${area(process.argv[1])}: ${name}`
  const reason = knownFailure(name)
  if (reason && process.env.E2B_RUN_KNOWN_FAILURES !== '1') {
    opts = { ...opts, skip: `known failure: ${reason}` }
  }
  // Generous: other test suites may load the machine heavily.
  return nodeTest(name, { timeout: 300_000, ...opts }, fn)
}

// area is the test file's name without .test.mjs.
function area(file) {
  return path.basename(file ?? 'unknown').replace(/\.test\.mjs$/, '')
}

function knownFailure(name) {
  const r = knownFailures[name]
  if (!r) return ''
  if (typeof r === 'string') return r
  return r.sdks.includes(sdk.label) ? r.reason : ''
}

// sandbox creates a sandbox of Class (e2b's or the code interpreter's
// Sandbox) tagged with this run, and kills it when the file's tests end.
// opts.template names a template or snapshot other than Class's default.
export async function sandbox(Class, { template, ...opts } = {}) {
  const o = { timeoutMs: 10 * 60_000, ...opts, metadata: { e2eRun: run, ...opts.metadata } }
  const sbx = await (template ? Class.create(template, o) : Class.create(o))
  return track(sbx)
}

// track kills sbx (one the test got otherwise, e.g. by fork) when the
// file's tests end, and returns it.
export function track(sbx) {
  created.push(sbx)
  return sbx
}

// created are killed by one after hook on the file's root test (an after
// registered inside a before hook would run as soon as that hook ends).
const created = []
after(() => Promise.all(created.map((sbx) => sbx.kill().catch(() => {}))))

// until polls cond every 50 ms until it returns a truthy value or ms pass.
export async function until(cond, ms = 15_000) {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await cond()
    if (v) return v
    if (Date.now() > deadline) return v
    await new Promise((r) => setTimeout(r, 50))
  }
}
