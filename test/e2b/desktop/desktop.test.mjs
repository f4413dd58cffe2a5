// The stock E2B desktop SDK (@e2b/desktop, pinned in package-lock.json)
// against kiln serve's desktop template, configured only by E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY (see ../README.md). Run it directly,
// not through node --test (it runs in this process, so that the checks a
// browser makes can be asked for on stdin):
//
//   node --test-reporter=spec desktop.test.mjs
//
// With KILN_TEST_BROWSER=1 (as TestDesktopSDK runs it) the stream test
// prints "kiln-check: stream <url> <url without the auth key>" and waits
// for a line on stdin: "ok", or what the browser saw instead. Lines
// "kiln-measure: <name> <ms>" are timings, logged, never asserted.
import assert from 'node:assert/strict'
import { after, before, test } from 'node:test'
import readline from 'node:readline'
import { Sandbox } from '@e2b/desktop'
import { blank, isPNG, pngStats } from './png.mjs'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set (see ../README.md)`)
}
if (process.env.E2B_DEBUG !== undefined) throw new Error('E2B_DEBUG must not be set')

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const measure = (name, ms) => console.log(`kiln-measure: ${name} ${Math.round(ms)}`)

// until polls cond every 200 ms until it returns a truthy value or ms
// pass, and returns its last value.
async function until(cond, ms = 30_000) {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await cond().catch(() => undefined)
    if (v || Date.now() > deadline) return v
    await sleep(200)
  }
}

// ask prints a check for the Go side (a browser) and returns its verdict.
const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]()
async function ask(check) {
  console.log(`kiln-check: ${check}`)
  const { value, done } = await lines.next()
  return done ? 'stdin closed' : value
}
after(() => process.stdin.destroy())

let d // the desktop every test drives, created once
let createMs
before(async () => {
  const t0 = performance.now()
  d = await Sandbox.create({ timeoutMs: 10 * 60_000, metadata: { e2eRun: 'desktop' } })
  createMs = performance.now() - t0
  measure('create', createMs)
})
after(() => d?.kill().catch(() => {}))

// sh runs a command in the desktop and returns its stdout, trimmed.
async function sh(cmd) {
  return (await d.commands.run(cmd)).stdout.trim()
}

// waitWindow waits until a visible window whose name matches re is shown
// and returns its id.
async function waitWindow(re, ms = 60_000) {
  const id = await until(async () => {
    const out = await sh(`xdotool search --onlyvisible --name ${JSON.stringify(re)} || true`)
    return out.split('\n').filter(Boolean).at(-1)
  }, ms)
  assert.ok(id, `no window named ${re} within ${ms} ms`)
  return id
}

test('create: the desktop is up, as user, on the SDK default screen', async () => {
  assert.deepEqual(await d.getScreenSize(), { width: 1024, height: 768 })
  assert.equal(await sh('whoami'), 'user')
  for (const p of ['Xvfb', 'xfce4-session', 'xfwm4', 'xfdesktop', 'xfce4-panel']) {
    assert.equal(await sh(`ps -o user= -C ${p} | sort -u`), 'user', `${p} runs as user`)
  }
  // One of each: the warm snapshot's desktop was taken, not doubled.
  assert.equal(await sh('pgrep -cx Xvfb; pgrep -cx xfce4-panel'), '1\n1')
  // X is reachable only inside the sandbox: no TCP port, no file socket.
  assert.doesNotMatch(await sh('netstat -tln'), /:60\d\d\b/)
  assert.equal(await sh('ls -A /tmp/.X11-unix 2>/dev/null || true'), '')
})

test('create with another resolution and dpi: that screen, the warm desktop replaced', async () => {
  const t0 = performance.now()
  const other = await Sandbox.create({ resolution: [1280, 800], dpi: 120, timeoutMs: 5 * 60_000, metadata: { e2eRun: 'desktop' } })
  try {
    measure('create-other-resolution', performance.now() - t0)
    assert.deepEqual(await other.getScreenSize(), { width: 1280, height: 800 })
    const run = async (cmd) => (await other.commands.run(cmd)).stdout.trim()
    assert.equal(await run('pgrep -cx Xvfb; pgrep -cx xfce4-session; pgrep -cx xfce4-panel'), '1\n1\n1')
    assert.match(await run('xdpyinfo | grep resolution'), /120x120 dots per inch/)
    const stats = await until(async () => {
      const s = pngStats(await other.screenshot())
      return blank(s) ? null : s
    })
    assert.ok(stats, 'the screen stays blank')
    assert.equal(stats.width, 1280)
  } finally {
    await other.kill()
  }
})

test('screenshot: a PNG of the screen size that is not blank', async () => {
  const size = await d.getScreenSize()
  let stats, tries = 0
  const t0 = performance.now()
  await until(async () => {
    tries++
    const png = await d.screenshot()
    assert.ok(isPNG(png), 'screenshot() is a PNG')
    stats = pngStats(png)
    return !blank(stats)
  })
  measure('create-to-drawn-screenshot', createMs + performance.now() - t0)
  console.log(`screenshot: ${JSON.stringify(stats)} after ${tries} tries`)
  assert.equal(stats.width, size.width)
  assert.equal(stats.height, size.height)
  assert.ok(!blank(stats), `the screen stays blank: ${JSON.stringify(stats)}`)

  const rounds = []
  for (let i = 0; i < 10; i++) {
    const t = performance.now()
    await d.screenshot()
    rounds.push(performance.now() - t)
  }
  rounds.sort((a, b) => a - b)
  measure('screenshot-p50', rounds[5])
  measure('screenshot-max', rounds[9])
})

// The probe is a Tk window that logs the mouse events it gets (a canvas)
// and has a button that writes a file when clicked; it writes where they
// are on the screen.
const probe = `import json, tkinter as tk
root = tk.Tk()
root.title('kiln-probe')
root.geometry('600x400+200+150')
log = open('/tmp/probe.log', 'a', buffering=1)
canvas = tk.Canvas(root, bg='white', width=600, height=300, highlightthickness=0)
canvas.pack()
def rec(kind, e):
    log.write(json.dumps({'kind': kind, 'num': e.num if kind in ('press', 'release') else None, 'x': e.x_root, 'y': e.y_root}) + '\\n')
for ev, kind in [('<ButtonPress>', 'press'), ('<ButtonRelease>', 'release'), ('<B1-Motion>', 'drag')]:
    canvas.bind(ev, lambda e, k=kind: rec(k, e))
def clicked():
    open('/tmp/clicked', 'w').write('clicked')
button = tk.Button(root, text='Click me', command=clicked)
button.pack(fill='both', expand=True)
def where(e=None):
    geo = {w: [x.winfo_rootx(), x.winfo_rooty(), x.winfo_width(), x.winfo_height()] for w, x in (('canvas', canvas), ('button', button))}
    with open('/tmp/probe.json.new', 'w') as f:
        json.dump(geo, f)
    import os; os.replace('/tmp/probe.json.new', '/tmp/probe.json')
root.bind('<Configure>', where)
root.mainloop()
`

test('mouse: moves, clicks, double-click, right and middle click, drag, scroll; a button click has its effect', async () => {
  await d.files.write('/tmp/probe.py', probe)
  const app = await d.commands.run('python3 /tmp/probe.py', { background: true })
  try {
    await waitWindow('^kiln-probe$')
    // Its geometry once the window manager has placed it.
    const geo = await until(async () => {
      const g = JSON.parse(await sh('cat /tmp/probe.json'))
      return g.canvas[0] > 0 && g.canvas[2] === 600 ? g : null
    })
    assert.ok(geo, 'the probe never said where it is')
    const [cx, cy, cw, ch] = geo.canvas
    const events = async () => (await sh('cat /tmp/probe.log || true')).split('\n').filter(Boolean).map((l) => JSON.parse(l))

    await d.moveMouse(cx + 100, cy + 50)
    assert.deepEqual(await d.getCursorPosition(), { x: cx + 100, y: cy + 50 })

    await d.leftClick(cx + 100, cy + 60)
    await d.rightClick(cx + 110, cy + 60)
    await d.middleClick(cx + 120, cy + 60)
    await d.scroll('down', 3)
    await d.scroll('up', 1)
    await d.doubleClick(cx + 200, cy + 100)
    await d.drag([cx + 300, cy + 150], [cx + 400, cy + 200])
    const want = (evs) => {
      const presses = evs.filter((e) => e.kind === 'press')
      return presses.filter((e) => e.num === 5).length === 3 &&
        evs.some((e) => e.kind === 'release' && e.num === 1 && e.x === cx + 400 && e.y === cy + 200)
    }
    const evs = await until(async () => { const e = await events(); return want(e) ? e : null }, 10_000) ?? await events()
    const presses = evs.filter((e) => e.kind === 'press').map((e) => `${e.num}@${e.x - cx},${e.y - cy}`)
    // Left, right, middle, wheel down ×3 and up ×1 at the pointer, the
    // double click's two presses, the drag's press.
    assert.deepEqual(presses, [
      '1@100,60', '3@110,60', '2@120,60', '5@120,60', '5@120,60', '5@120,60', '4@120,60',
      '1@200,100', '1@200,100', '1@300,150',
    ])
    assert.ok(evs.some((e) => e.kind === 'drag'), 'motion with the button held')
    assert.ok(evs.some((e) => e.kind === 'release' && e.num === 1 && e.x === cx + 400 && e.y === cy + 200), 'the drag ends where asked')
    assert.ok(cw === 600 && ch === 300)

    // The button, clicked at its centre on the screen.
    const [bx, by, bw, bh] = geo.button
    await d.leftClick(bx + Math.floor(bw / 2), by + Math.floor(bh / 2))
    assert.equal(await until(() => sh('cat /tmp/clicked'), 10_000), 'clicked')
  } finally {
    await app.kill()
  }
})

test('keyboard: write() into the editor that launch() opened, press() saves it, a command reads it back', async () => {
  const path = '/home/user/kiln-note.txt'
  await d.launch('org.xfce.mousepad', path)
  const win = await waitWindow('kiln-note.txt')
  await sh(`xdotool windowactivate --sync ${win}`)
  // Window lookups.
  assert.equal(await d.getCurrentWindowId(), win)
  assert.match(await d.getWindowTitle(win), /kiln-note\.txt/)
  assert.ok((await d.getApplicationWindows('mousepad')).includes(win))

  await d.write('hello from kiln')
  await d.press(['ctrl', 's'])
  assert.equal(await until(() => sh(`cat ${path} 2>/dev/null`), 15_000), 'hello from kiln')
  await d.press(['ctrl', 'q'])
})

test('keyboard: write() and press("enter") in a terminal run a command', async () => {
  await d.launch('xfce4-terminal')
  const win = await waitWindow('^Terminal')
  await sh(`xdotool windowactivate --sync ${win}`)
  await d.write("echo 'hello from kiln' > /tmp/typed.txt; exit")
  await d.press('enter')
  assert.equal(await until(() => sh('cat /tmp/typed.txt 2>/dev/null'), 15_000), 'hello from kiln')
})

test('open(): a file in its application, a URL in the browser', async () => {
  await d.files.write('/home/user/open-me.txt', 'opened\n')
  await d.open('/home/user/open-me.txt')
  const editor = await waitWindow('open-me.txt')
  assert.match(await d.getWindowTitle(editor), /open-me\.txt/)
  await sh(`xdotool windowclose ${editor} || true`)

  // A page served in the sandbox (the network is the sandbox's own).
  await d.files.write('/tmp/www/page.html', '<!doctype html><title>kiln-page</title><h1>hello from kiln</h1>')
  const server = await d.commands.run('python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/www', { background: true })
  try {
    await until(() => sh('curl -sf http://127.0.0.1:8000/page.html'))
    await d.open('http://127.0.0.1:8000/page.html')
    const browser = await waitWindow('kiln-page', 120_000)
    assert.match(await d.getWindowTitle(browser), /kiln-page/)
    assert.ok((await d.getApplicationWindows('firefox')).includes(browser))
    await sh(`kill $(xdotool getwindowpid ${browser})`)
  } finally {
    await server.kill()
  }
})

test('stream: start, getUrl (the page loads and shows the desktop), auth key honoured, stop', async (t) => {
  const browser = process.env.KILN_TEST_BROWSER === '1'
  if (!browser) t.diagnostic('KILN_TEST_BROWSER is not 1: the pages are not loaded in a browser')
  await d.stream.start()
  assert.throws(() => d.stream.getAuthKey(), /requireAuth/)
  const open = d.stream.getUrl()
  assert.equal(new URL(open).host, d.getHost(6080))
  if (browser) assert.equal(await ask(`stream ${open} -`), 'ok')
  await d.stream.stop()
  assert.equal(await sh('pgrep -x x11vnc || true'), '')

  // Again, with a password: the URL with the auth key connects, the one
  // without does not.
  await d.stream.start({ requireAuth: true })
  const key = d.stream.getAuthKey()
  assert.match(key, /^[A-Za-z0-9]{16}$/)
  if (browser) assert.equal(await ask(`stream ${d.stream.getUrl({ authKey: key })} ${d.stream.getUrl()}`), 'ok')
  await d.stream.stop()
  assert.equal(await sh('pgrep -x x11vnc || true'), '')
})
