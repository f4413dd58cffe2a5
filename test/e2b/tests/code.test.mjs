// The code interpreter through @e2b/code-interpreter's Sandbox.runCode and
// its contexts: state, stdout/stderr, rich results (pandas, matplotlib),
// errors, streaming callbacks, env vars, timeouts.
import assert from 'node:assert/strict'
import { before } from 'node:test'
import { ci, e2b, sandbox, test, until } from '../lib/sdk.mjs'

const { Sandbox } = ci
const { NotFoundError, TimeoutError } = e2b

// coldStart is the timeoutMs of a cell that starts a language's kernel: a
// few seconds under gVisor on a quiet host (R about 9 s), but over the
// SDK's default 60 s on a 2-core host running fork bombs beside this
// suite. Kiln keeps starting a kernel whose caller gave up; the tests wait
// for it instead of failing on a loaded host.
const coldStart = 300_000

let sbx
before(async () => {
  sbx = await sandbox(Sandbox, { metadata: { file: 'code' }, envs: { E2E_GLOBAL: 'for every process' } })
})

test('runCode keeps state across calls', async () => {
  const first = await sbx.runCode('x = 41')
  assert.equal(first.error, undefined)
  assert.deepEqual(first.results, [])
  const second = await sbx.runCode('x + 1')
  assert.equal(second.text, '42')
  // The first cell of a fresh sandbox is number 1, as on E2B: the
  // template's warm-up and start-up cells are not counted.
  assert.equal(first.executionCount, 1)
  assert.equal(second.executionCount, 2)
  assert.equal(second.results.length, 1)
  assert.equal(second.results[0].isMainResult, true)
  assert.deepEqual(second.logs, { stdout: [], stderr: [] })
  assert.ok(second.executionCount > first.executionCount, `execution counts ${first.executionCount}, ${second.executionCount}`)
})

test('runCode collects stdout and stderr', async () => {
  const ex = await sbx.runCode('import sys\nprint("out")\nprint("err", file=sys.stderr)')
  assert.deepEqual(ex.logs.stdout, ['out\n'])
  assert.deepEqual(ex.logs.stderr, ['err\n'])
  assert.equal(ex.text, undefined)
})

test('runCode returns a pandas DataFrame as text and html', async () => {
  const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
  assert.equal(ex.error, undefined)
  const [df] = ex.results
  assert.equal(df.isMainResult, true)
  assert.equal(df.text, '   a  b\n0  1  x\n1  2  y')
  assert.match(df.html, /<table[^>]*class="dataframe"/)
  assert.match(df.html, /<th>a<\/th>\s*<th>b<\/th>/)
  assert.match(df.html, /<td>2<\/td>\s*<td>y<\/td>/)
  assert.ok(df.formats().includes('html'))
})

test('runCode returns a pandas DataFrame as data', async () => {
  const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
  assert.deepEqual(ex.results[0].data, { a: [1, 2], b: ['x', 'y'] })
})

const plot = `
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9], label="squares")
plt.title("Squares")
plt.xlabel("x (s)")
plt.ylabel("y")
plt.show()
`

test('runCode returns a matplotlib figure as PNG', async () => {
  const ex = await sbx.runCode(plot)
  assert.equal(ex.error, undefined)
  assert.equal(ex.results.length, 1)
  const [fig] = ex.results
  assert.equal(fig.isMainResult, false)
  assert.match(fig.text, /^<Figure size \d+x\d+ with 1 Axes>$/)
  const png = Buffer.from(fig.png, 'base64')
  assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
  assert.equal(png.subarray(12, 16).toString(), 'IHDR')
  assert.ok(png.readUInt32BE(16) > 100 && png.readUInt32BE(20) > 100, 'PNG dimensions')
  assert.ok(fig.formats().includes('png'))
})

test('runCode returns the chart data of a matplotlib figure', async () => {
  const [fig] = (await sbx.runCode(plot)).results
  const chart = fig.chart
  assert.ok(chart, 'no chart on the figure result')
  assert.equal(chart.type, 'line')
  assert.equal(chart.title, 'Squares')
  assert.equal(chart.x_label, 'x (s)')
  assert.equal(chart.x_unit, 's')
  assert.equal(chart.elements.length, 1)
  assert.equal(chart.elements[0].label, 'squares')
  assert.deepEqual(chart.elements[0].points, [[1, 1], [2, 4], [3, 9]])
})

test('a pie chart\'s angles come without float noise', async () => {
  const [fig] = (await sbx.runCode('import matplotlib.pyplot as plt\nplt.pie([90, 10], labels=["big", "small"])\nplt.show()')).results
  assert.equal(fig.chart.type, 'pie')
  assert.deepEqual(fig.chart.elements.map((e) => [e.label, e.angle]), [['big', 324], ['small', 36]])
})

test('PIL images shown or displayed are PNG results', async () => {
  const ex = await sbx.runCode('from PIL import Image\nim = Image.new("RGB", (32, 16), "red")\nim.show()\ndisplay(im)')
  assert.equal(ex.error, undefined)
  assert.equal(ex.results.length, 2)
  for (const r of ex.results) {
    const png = Buffer.from(r.png, 'base64')
    assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
    assert.deepEqual([png.readUInt32BE(16), png.readUInt32BE(20)], [32, 16])
  }
})

test('runCode reports a Python exception as ExecutionError and keeps state', async () => {
  const seen = []
  const ex = await sbx.runCode('print("before")\n1 / 0', { onError: (e) => seen.push(e) })
  assert.equal(ex.error.name, 'ZeroDivisionError')
  assert.equal(ex.error.value, 'division by zero')
  assert.match(ex.error.traceback, /ZeroDivisionError/)
  assert.deepEqual(ex.logs.stdout, ['before\n'])
  assert.deepEqual(ex.results, [])
  assert.deepEqual(seen.map((e) => e.name), ['ZeroDivisionError'])

  const undef = await sbx.runCode('no_such_name')
  assert.equal(undef.error.name, 'NameError')
  assert.equal(undef.error.value, "name 'no_such_name' is not defined")

  await sbx.runCode('kept = "yes"')
  await sbx.runCode('raise ValueError("boom")')
  assert.equal((await sbx.runCode('kept')).text, 'yes')
})

test('onStdout streams output while the code still runs', async () => {
  // The code prints, then waits for a file that only the onStdout callback
  // creates: it finishes with "released" only if the first line was
  // delivered before the execution ended.
  const lines = []
  let released
  const ex = await sbx.runCode(
    `
import os, time
print("waiting", flush=True)
for _ in range(1200):
    if os.path.exists("/tmp/released"):
        print("released")
        break
    time.sleep(0.05)
else:
    print("never released")
`,
    {
      onStdout: (m) => {
        lines.push(m.line)
        if (m.line.includes('waiting')) released = sbx.files.write('/tmp/released', 'go')
      },
    }
  )
  await released
  assert.deepEqual(ex.logs.stdout, ['waiting\n', 'released\n'])
  assert.deepEqual(lines, ['waiting\n', 'released\n'])
})

test('onStderr and onResult callbacks see the output', async () => {
  const errs = []
  const results = []
  await sbx.runCode('import sys\nsys.stderr.write("warn\\n")\n6 * 7', {
    onStderr: (m) => errs.push(m),
    onResult: (r) => results.push(r),
  })
  assert.deepEqual(errs.map((m) => [m.line, m.error]), [['warn\n', true]])
  assert.deepEqual(results.map((r) => r.text), ['42'])
})

test('runCode sets envs for one execution only', async () => {
  const ex = await sbx.runCode('import os\nos.environ.get("E2E_VAR")', { envs: { E2E_VAR: 'only-now' } })
  assert.equal(ex.text, 'only-now')
  const after = await until(async () => {
    const t = (await sbx.runCode('import os\nstr(os.environ.get("E2E_VAR"))')).text
    return t === 'None' && t
  })
  assert.equal(after, 'None')
})

test('env vars given at create reach the kernel and commands', async () => {
  assert.equal((await sbx.runCode('import os\nos.environ["E2E_GLOBAL"]')).text, 'for every process')
  assert.equal((await sbx.commands.run('echo "$E2E_GLOBAL"')).stdout, 'for every process\n')
  const js = await sbx.runCode('process.env.E2E_GLOBAL', { language: 'javascript', timeoutMs: coldStart })
  assert.equal(js.text, 'for every process')
})

test('contexts are isolated, have their own cwd, can be listed, restarted and removed', async () => {
  // Creating and restarting a context each start a Python kernel cold:
  // about 5 s of CPU under gVisor, which on a 2-core machine running both
  // SDKs' suites at once (and other test packages) has passed the SDK's
  // 60 s request timeout. This connection waits longer for them.
  const patient = await Sandbox.connect(sbx.sandboxId, { requestTimeoutMs: 300_000 })
  const ctx = await patient.createCodeContext({ cwd: '/tmp' })
  assert.equal(typeof ctx.id, 'string')
  assert.equal(ctx.language, 'python')
  assert.equal(ctx.cwd, '/tmp')

  await patient.runCode('secret = "in ctx"', { context: ctx })
  assert.equal((await patient.runCode('secret', { context: ctx })).text, 'in ctx')
  assert.equal((await patient.runCode('secret')).error?.name, 'NameError')
  assert.equal((await patient.runCode('import os\nos.getcwd()', { context: ctx })).text, '/tmp')
  assert.equal((await patient.runCode('import os\nos.getcwd()')).text, '/home/user')

  const ids = (await patient.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(ctx.id), `${ctx.id} not in ${ids}`)

  await patient.restartCodeContext(ctx)
  assert.equal((await patient.runCode('secret', { context: ctx })).error?.name, 'NameError')

  await patient.removeCodeContext(ctx)
  assert.ok(!(await patient.listCodeContexts()).some((c) => c.id === ctx.id))
  // requestTimeoutMs 0: the SDK leaves its request timer armed when the
  // request fails, which would keep node alive for the default 60 s.
  await assert.rejects(patient.runCode('1', { context: ctx, requestTimeoutMs: 0 }), (err) => err instanceof NotFoundError)
})

test('the default contexts are listed: Python and JavaScript', async () => {
  const byLang = Object.fromEntries((await sbx.listCodeContexts()).map((c) => [c.language, c]))
  assert.ok(byLang.python && byLang.javascript, `contexts ${JSON.stringify(Object.values(byLang))}`)
  assert.equal(byLang.javascript.cwd, '/home/user')
  const ex = await sbx.runCode('console.log(6 * 7)', { context: byLang.javascript })
  assert.deepEqual(ex.logs.stdout, ['42\n'])
})

test('a context in a directory the user cannot enter is refused and the sandbox lives on', async () => {
  // This used to panic the agent: the sandbox died and later calls got 502.
  await assert.rejects(sbx.createCodeContext({ cwd: '/root' }), (err) => /403|may not enter/.test(err.message))
  assert.equal((await sbx.runCode('6 * 7')).text, '42')
  assert.equal(await sbx.isRunning(), true)
})

test('the code interpreter answers GET :49999/health inside the sandbox', async () => {
  const r = await sbx.commands.run('curl -sS -m 20 -w " %{http_code} %{content_type}" http://localhost:49999/health')
  assert.equal(r.stdout, '"OK" 200 application/json')
})

test('runCode runs JavaScript with language js', async () => {
  const ex = await sbx.runCode('const a = 20\nconsole.log("from node")\na * 2 + 2', { language: 'js', timeoutMs: coldStart })
  assert.equal(ex.error, undefined)
  assert.deepEqual(ex.logs.stdout, ['from node\n'])
  assert.equal(ex.text, '42')
})

test('JavaScript cells accept ES-module import syntax', async () => {
  const ex = await sbx.runCode('import fs from "node:fs"\nimport { join, basename as base } from "path"\nimport * as os from "os"\nbase(join("a", "b.txt")) + " " + fs.existsSync("/") + " " + (typeof os.platform)', { language: 'js', timeoutMs: coldStart })
  assert.equal(ex.error, undefined)
  assert.equal(ex.text, 'b.txt true function')
  // What a cell imported stays defined, as in a module's scope.
  assert.equal((await sbx.runCode('typeof fs.readFileSync', { language: 'js' })).text, 'function')
})

test('Java cells accept snippets: statements, methods and a last expression, without a class', async () => {
  const ex = await sbx.runCode('int twice(int n) { return 2 * n; }\nint x = 20;\nSystem.out.println(twice(x) + 2);\n"x is " + x', { language: 'java', timeoutMs: coldStart })
  assert.equal(ex.error, undefined)
  assert.deepEqual(ex.logs.stdout, ['42\n'])
  assert.equal(ex.text, 'x is 20')
})

test('runCode runs TypeScript with language ts, types and all', async () => {
  const ex = await sbx.runCode('interface P { x: number }\nconst p: P = { x: 21 }\nfunction twice(n: number): number { return n * 2 }\ntwice(p.x)', { language: 'ts', timeoutMs: coldStart })
  assert.equal(ex.error, undefined)
  assert.equal(ex.text, '42')
  const again = await sbx.runCode('const q: number = twice(p.x) + 1\nq', { language: 'ts' })
  assert.equal(again.text, '43')
})

test('runCode runs R and bash', async () => {
  // IRkernel shows values as display data, so they are results but not
  // the main result, as on E2B.
  const r = await sbx.runCode('x <- c(1, 2, 3)\nsum(x)', { language: 'r', timeoutMs: coldStart })
  assert.equal(r.error, undefined)
  assert.equal(r.results[0].text, '[1] 6')
  assert.deepEqual((await sbx.runCode('cat("from R\\n")', { language: 'r' })).logs.stdout, ['from R\n'])
  const rerr = await sbx.runCode('stop("boom")', { language: 'r' })
  assert.match(rerr.error?.value ?? '', /boom/)

  const ctx = await sbx.createCodeContext({ language: 'r', requestTimeoutMs: 300_000 })
  assert.equal(ctx.language, 'r')
  await sbx.runCode('y <- 21', { context: ctx })
  assert.equal((await sbx.runCode('y * 2', { context: ctx })).results[0].text, '[1] 42')

  const sh = await sbx.runCode('n=$((2 + 3)); echo "bash says $n"', { language: 'bash' })
  assert.equal(sh.error, undefined)
  assert.deepEqual(sh.logs.stdout, ['bash says 5\n'])
})

test('runCode timeoutMs aborts a long execution with TimeoutError and interrupts it', async () => {
  await sbx.runCode('finished = False')
  await assert.rejects(
    sbx.runCode('import time\nfor _ in range(300):\n    time.sleep(0.1)\nfinished = True', { timeoutMs: 2_000 }),
    (err) => err instanceof TimeoutError && /Execution timed out/.test(err.message)
  )
  // The server interrupts the kernel when the client goes away, so the
  // next execution runs at once and the loop never finished.
  const ex = await sbx.runCode('finished')
  assert.equal(ex.text, 'False')
})
