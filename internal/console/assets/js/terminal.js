// A terminal into the sandbox: bash on a PTY started as a background
// command, its output read from the command's NDJSON event stream (fetch,
// with the key in a header: no WebSocket, so no key in a URL), keystrokes
// and pastes written to its stdin in order, and the terminal's size sent
// with resize. A dropped stream re-attaches after the last event seen.
import { call, post, events, bytes, sbPath } from './api.js';
import { h, say, errText } from './ui.js';

export async function terminalTab(panel, current, signal) {
  const id = current().id;
  const box = h('div', { class: 'term', id: 'terminal' });
  const note = h('p', { class: 'muted', 'aria-live': 'polite' });
  panel.append(note, box);
  const term = new window.Terminal({ cursorBlink: true, convertEol: false, fontSize: 14, scrollback: 5000,
    screenReaderMode: false, theme: { background: '#111418' } });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  let pid;
  try {
    const r = await post(sbPath(id, '/commands'), {
      args: ['/bin/bash', '-l'], pty: { cols: term.cols, rows: term.rows }, background: true,
      env: { TERM: 'xterm-256color' }, tag: 'console-terminal',
    }, { signal });
    pid = r.pid;
  } catch (e) {
    note.textContent = 'Could not start a shell: ' + errText(e);
    term.dispose();
    return;
  }
  note.textContent = `bash (pid ${pid}) on a ${term.cols}×${term.rows} terminal. Paste with your usual shortcut.`;
  const base = sbPath(id, `/commands/${pid}`);

  // stdin: one request at a time, keystrokes typed meanwhile batched.
  let pending = '', sending = false;
  const flush = async () => {
    if (sending || !pending) return;
    sending = true;
    const data = pending;
    pending = '';
    try { await call('POST', base + '/stdin', { body: data }); } catch (e) { if (!signal.aborted) say(errText(e), true); }
    sending = false;
    flush();
  };
  term.onData((d) => { pending += d; flush(); });
  term.onResize(({ cols, rows }) => {
    post(base + '/resize', { cols, rows }).catch(() => {});
  });
  const ro = new ResizeObserver(() => { try { fit.fit(); } catch { /* hidden */ } });
  ro.observe(box);
  term.focus();

  let seq = 0, exited = false;
  signal.addEventListener('abort', () => {
    ro.disconnect();
    if (!exited) post(base + '/signal', { signal: 'SIGHUP' }).catch(() => {});
    term.dispose();
  });
  while (!signal.aborted && !exited) {
    try {
      const res = await call('GET', `${base}/events?after_seq=${seq}`, { raw: true, signal });
      await events(res, (ev) => {
        if (ev.seq) seq = ev.seq;
        if (ev.type === 'stdout' || ev.type === 'stderr') term.write(bytes(ev.data));
        else if (ev.type === 'exit') {
          exited = true;
          term.write(`\r\n[bash exited with code ${ev.exit?.code}]\r\n`);
          note.textContent = 'The shell exited. Open the tab again for a new one.';
        }
      });
    } catch (e) {
      if (signal.aborted) return;
      if (e.status && e.status < 500) { note.textContent = errText(e); return; }
    }
    if (!exited && !signal.aborted) await new Promise((r) => setTimeout(r, 1000));
  }
}
