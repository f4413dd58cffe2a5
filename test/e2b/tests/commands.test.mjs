// Commands through e2b's sandbox.commands: output, exit codes and
// CommandExitError, envs/cwd/user, streaming, background commands with
// list/kill/connect, stdin, timeouts.
import assert from 'node:assert/strict'
import { before } from 'node:test'
import { ci, e2b, sandbox, test, until } from '../lib/sdk.mjs'

const { Sandbox, CommandExitError, TimeoutError, NotFoundError } = e2b

let sbx
before(async () => {
  sbx = await sandbox(Sandbox, { metadata: { file: 'commands' } })
})

const atLeast = (version, want) => {
  const [a, b] = [version, want].map((v) => v.split('.').map(Number))
  for (let i = 0; i < 3; i++) if (a[i] !== b[i]) return a[i] > b[i]
  return true
}

test('commands.run returns stdout, stderr and exit code 0', async () => {
  const r = await sbx.commands.run('echo hello; echo oops >&2; printf "no newline"')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\nno newline')
  assert.equal(r.stderr, 'oops\n')
  assert.equal(r.error, undefined)
})

test('commands.run throws CommandExitError with the exit code and output', async () => {
  await assert.rejects(sbx.commands.run('echo partial; echo bad >&2; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError, `${err?.constructor?.name}: ${err?.message}`)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stdout, 'partial\n')
    assert.equal(err.stderr, 'bad\n')
    assert.equal(err.message, 'exit status 3')
    assert.equal(err.error, 'exit status 3')
    return true
  })
  await assert.rejects(sbx.commands.run('no-such-command-e2e'), (err) => {
    assert.ok(err instanceof CommandExitError)
    assert.equal(err.exitCode, 127)
    assert.match(err.stderr, /no-such-command-e2e: command not found/)
    return true
  })
})

test('commands.run passes envs and cwd and runs as user by default', async () => {
  const r = await sbx.commands.run('echo "$E2E_A $E2E_B"; pwd; whoami; echo $HOME', {
    envs: { E2E_A: 'one', E2E_B: 'two words' },
    cwd: '/tmp',
  })
  assert.equal(r.stdout, 'one two words\n/tmp\nuser\n/home/user\n')
  const home = await sbx.commands.run('pwd')
  assert.equal(home.stdout, '/home/user\n')
  const root = await sbx.commands.run('whoami; echo $HOME', { user: 'root' })
  assert.equal(root.stdout, 'root\n/root\n')
})

test('sudo makes the user root, as in E2B\'s sandboxes (on every runtime)', async () => {
  const r = await sbx.commands.run('sudo id -u; echo hi | sudo tee /etc/e2e-sudo >/dev/null; cat /etc/e2e-sudo')
  assert.equal(r.stdout, '0\nhi\n')
})

test('onStdout and onStderr stream output while the command runs', async () => {
  // The command waits for a file that only the onStdout callback creates.
  const out = []
  const err = []
  let released
  const r = await sbx.commands.run(
    'echo waiting; echo note >&2; for i in $(seq 1200); do [ -f /tmp/released ] && { echo released; exit 0; }; sleep 0.05; done; echo never; exit 1',
    {
      onStdout: (d) => {
        out.push(d)
        if (d.includes('waiting')) released = sbx.files.write('/tmp/released', 'go')
      },
      onStderr: (d) => err.push(d),
    }
  )
  await released
  assert.equal(r.stdout, 'waiting\nreleased\n')
  assert.equal(out.join(''), 'waiting\nreleased\n')
  assert.equal(err.join(''), 'note\n')
})

test('background commands are listed, killed and report the kill', async () => {
  const h = await sbx.commands.run('sleep 120', { background: true })
  assert.ok(h.pid > 0)
  const listed = (await sbx.commands.list()).find((p) => p.pid === h.pid)
  assert.ok(listed, `pid ${h.pid} not listed`)
  assert.equal(listed.cmd, '/bin/bash')
  assert.deepEqual(listed.args, ['-l', '-c', 'sleep 120'])

  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), (err) => {
    assert.ok(err instanceof CommandExitError, `${err?.constructor?.name}: ${err?.message}`)
    assert.equal(err.exitCode, -1)
    assert.equal(err.error, 'signal: killed')
    return true
  })
  assert.equal(await sbx.commands.kill(h.pid), false)
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid))
})

test('commands.connect reattaches to a background command', async () => {
  const h = await sbx.commands.run('echo early; while [ ! -f /tmp/late ]; do sleep 0.05; done; echo late; exit 5', {
    background: true,
  })
  await h.disconnect()
  const chunks = []
  const again = await sbx.commands.connect(h.pid, { onStdout: (d) => chunks.push(d) })
  assert.equal(again.pid, h.pid)
  await sbx.files.write('/tmp/late', 'x')
  await assert.rejects(again.wait(), (err) => {
    assert.ok(err instanceof CommandExitError)
    assert.equal(err.exitCode, 5)
    assert.match(err.stdout, /late\n$/)
    return true
  })
  assert.ok(chunks.join('').endsWith('late\n'), `streamed ${JSON.stringify(chunks)}`)
  await assert.rejects(sbx.commands.connect(999999), (err) => err instanceof NotFoundError)
})

test('sendStdin feeds a command started with stdin', async () => {
  const h = await sbx.commands.run('read a; read b; echo "$b+$a"', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'first\n')
  await h.sendStdin(new TextEncoder().encode('second\n'))
  const r = await h.wait()
  assert.equal(r.stdout, 'second+first\n')
  assert.equal(r.exitCode, 0)
})

test('closeStdin ends the input of a command', async (t) => {
  const version = (await sbx.getInfo()).envdVersion
  if (!atLeast(version, '0.5.2')) {
    t.skip(`kiln declares envd ${version}; the SDK allows closeStdin from 0.5.2`)
    return
  }
  const h = await sbx.commands.run('wc -c', { background: true, stdin: true })
  await h.sendStdin('12345')
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.stdout.trim(), '5')
})

test('without stdin a command reads EOF at once', async () => {
  const r = await sbx.commands.run('cat; echo done')
  assert.equal(r.stdout, 'done\n')
})

test('timeoutMs ends a long command with TimeoutError', async () => {
  await assert.rejects(
    sbx.commands.run('sleep 30', { timeoutMs: 1_000 }),
    (err) => err instanceof TimeoutError
  )
  // The server kills the process when the Connect deadline passes.
  const r = await sbx.commands.run(
    'for i in $(seq 200); do pgrep -fx "sleep 30" >/dev/null || { echo gone; exit 0; }; sleep 0.05; done; echo alive'
  )
  assert.equal(r.stdout, 'gone\n')
})

test('binary and UTF-8 output arrive intact', async () => {
  const r = await sbx.commands.run('printf "h\\xc3\\xa9llo w\\xc3\\xb6rld \\xe2\\x9c\\x93\\n"; head -c 200000 /dev/zero | tr "\\0" a; echo')
  assert.ok(r.stdout.startsWith('héllo wörld ✓\n'))
  assert.equal(r.stdout.length, 'héllo wörld ✓\n'.length + 200000 + 1)
})

test('pty: a terminal with a size, input, resize and exit code', async () => {
  let out = ''
  const decoder = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => (out += decoder.decode(d, { stream: true })) })
  assert.ok(term.pid > 0)
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo hi-$((6*7))\n'))
  assert.ok(await until(() => out.includes('24 80\r\nhi-42\r\n')), `pty output ${JSON.stringify(out)}`)
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; exit 3\n'))
  await assert.rejects(term.wait(), (err) => err instanceof CommandExitError && err.exitCode === 3)
  assert.match(out, /30 100\r\n/)
})

test('killing the sandbox ends a running command with a TimeoutError', async () => {
  const doomed = await sandbox(Sandbox, { metadata: { file: 'commands', role: 'doomed' } })
  const h = await doomed.commands.run('echo started; sleep 60', { background: true })
  assert.ok(await until(() => h.stdout === 'started\n'), `stdout ${JSON.stringify(h.stdout)}`)
  await Sandbox.kill(doomed.sandboxId)
  await assert.rejects(h.wait(), (err) => {
    assert.ok(err instanceof TimeoutError, `${err?.constructor?.name}: ${err?.message}`)
    assert.match(err.message, /The sandbox was killed or reached its end of life/)
    return true
  })
  assert.equal(h.stdout, 'started\n')
})

test('a sandbox reaching its end of life ends a foreground command with a TimeoutError', async () => {
  const doomed = await sandbox(Sandbox, { metadata: { file: 'commands', role: 'expiring' } })
  let out = ''
  // Settled at once: the rejection may come before the assertion waits.
  const running = settled(doomed.commands.run('echo started; sleep 120', { onStdout: (d) => (out += d) }))
  assert.ok(await until(() => out === 'started\n'), `stdout ${JSON.stringify(out)}`)
  await doomed.setTimeout(1_000) // the server's reaper ends it, not a kill
  await assert.rejects(running.then((r) => r()), (err) => {
    assert.ok(err instanceof TimeoutError, `${err?.constructor?.name}: ${err?.message}`)
    assert.match(err.message, /The sandbox was killed or reached its end of life/)
    return true
  })
})

test('killing the sandbox ends a running runCode with the code interpreter\'s TimeoutError', async () => {
  const doomed = await sandbox(ci.Sandbox, { metadata: { file: 'commands', role: 'doomed-code' } })
  let out = ''
  const running = settled(
    doomed.runCode('import time\nprint("started", flush=True)\ntime.sleep(120)', { onStdout: (m) => (out += m.line) })
  )
  assert.ok(await until(() => out.includes('started'), 60_000), `stdout ${JSON.stringify(out)}`)
  await ci.Sandbox.kill(doomed.sandboxId)
  await assert.rejects(running.then((r) => r()), (err) => {
    assert.ok(err instanceof TimeoutError, `${err?.constructor?.name}: ${err?.message}`)
    assert.match(err.message, /The sandbox was killed while the request was in progress/)
    return true
  })
})

// settled is p with its outcome caught at once, as a function that
// returns its value or throws its error.
function settled(p) {
  return p.then(
    (v) => () => v,
    (err) => () => {
      throw err
    }
  )
}
