#!/usr/bin/env node
// Runs the shared E2B SDK tests (tests/*.test.mjs) against one npm project's
// SDK install: `cd test/e2b/latest && node ../run.mjs [file-substring ...]`
// (or E2B_SDK_DIR=<project> node run.mjs). Test files run concurrently
// (E2B_TEST_CONCURRENCY, default 4), each in its own process with its own
// sandboxes. Prints the spec report, then one "e2e-failed: <test>"
// line per failed test ("<area>: <name>") and a "N passed, N failed, N skipped" line; exits 1
// if any test failed.
import { run } from 'node:test'
import { spec } from 'node:test/reporters'
import fs from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const here = path.dirname(fileURLToPath(import.meta.url))
process.env.E2B_SDK_DIR ??= process.cwd()
const sdkDir = path.resolve(process.env.E2B_SDK_DIR)
process.env.E2B_SDK_DIR = sdkDir
if (!fs.existsSync(path.join(sdkDir, 'node_modules', 'e2b'))) {
  console.error(`${sdkDir}: SDKs not installed (run npm ci there)`)
  process.exit(2)
}

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) {
    console.error(`${v} is not set: point it at kiln serve (see README.md)`)
    process.exit(2)
  }
}

const filters = process.argv.slice(2)
const testDir = path.join(here, 'tests')
const files = fs
  .readdirSync(testDir)
  .filter((f) => f.endsWith('.test.mjs'))
  .filter((f) => filters.length === 0 || filters.some((s) => f.includes(s)))
  .map((f) => path.join(testDir, f))

const failed = []
const counts = { passed: 0, failed: 0, skipped: 0 }
const stream = run({
  files,
  concurrency: Number(process.env.E2B_TEST_CONCURRENCY || 4),
})
// Suites are not counted; leaf tests are (details.type is unset for them).
stream.on('test:pass', (d) => {
  if (d.details?.type === 'suite') return
  if (d.skip || d.todo) counts.skipped++
  else counts.passed++
})
stream.on('test:fail', (d) => {
  if (d.details?.type === 'suite') return
  counts.failed++
  failed.push(d.name)
})
const report = stream.compose(spec)
report.pipe(process.stdout, { end: false })
report.on('end', () => {
  const label = path.basename(sdkDir)
  for (const f of failed) console.log(`e2e-failed: ${f}`)
  console.log(`${label}: ${counts.passed} passed, ${counts.failed} failed, ${counts.skipped} skipped`)
  process.exitCode = counts.failed ? 1 : 0
})
