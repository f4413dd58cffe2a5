// Code cells on the sandbox's code contexts, as in a notebook: each cell
// runs in the chosen language's default context (or a new context), its
// stream shown as it comes. Rich results: PNG/JPEG as images, SVG as an
// image (no scripts run in an <img>), HTML in an iframe sandboxed without
// scripts, the rest as text; exceptions with their traceback.
import { call, get, post, events, text, sbPath } from './api.js';
import { h, field, say, errText, stripANSI } from './ui.js';

const LANGS = ['python', 'r', 'javascript', 'typescript', 'bash', 'go', 'rust', 'c', 'cpp', 'java'];

export async function codeTab(panel, current, signal) {
  const id = current().id;
  const lang = h('select', { name: 'language' }, LANGS.map((l) => h('option', { value: l, text: l })));
  const ctx = h('select', { name: 'context' }, h('option', { value: '', text: 'default context of the language' }));
  const refresh = async () => {
    try {
      const cs = await get(sbPath(id, '/contexts'), { signal });
      const keep = ctx.value;
      ctx.replaceChildren(h('option', { value: '', text: 'default context of the language' }),
        ...cs.map((c) => h('option', { value: c.id, text: `${c.language} ${c.id}${c.cwd ? ' (' + c.cwd + ')' : ''}` })));
      ctx.value = keep;
    } catch { /* no interpreter yet */ }
  };
  const newCtx = h('button', { type: 'button', text: 'New context', onclick: async () => {
    try { const c = await post(sbPath(id, '/contexts'), { language: lang.value }); await refresh(); ctx.value = c.id; say('Context ' + c.id + ' started.'); } catch (e) { say(errText(e), true); }
  } });
  const cells = h('div', { class: 'cells' });
  panel.append(h('div', { class: 'filters' }, field('Language', lang), field('Context', ctx), newCtx), cells,
    h('button', { type: 'button', text: 'Add cell', onclick: () => addCell(true) }));
  refresh();

  let n = 0;
  function addCell(focus) {
    n++;
    const src = h('textarea', { class: 'src', rows: 5, spellcheck: 'false', 'aria-label': `Cell ${n} code`, 'data-cell': n });
    const out = h('div', { class: 'out', 'aria-live': 'polite', 'aria-label': `Cell ${n} output`, role: 'region' });
    const count = h('span', { class: 'count', text: '[ ]' });
    const run = h('button', { type: 'button', class: 'primary', text: 'Run', title: 'Shift+Enter' });
    const cell = h('div', { class: 'cell' }, h('div', { class: 'cellhead' }, count, run), src, out);
    const go = async () => {
      run.disabled = true;
      out.replaceChildren();
      count.textContent = '[*]';
      const body = { code: src.value };
      if (ctx.value) body.context_id = ctx.value; else body.language = lang.value;
      try {
        const res = await call('POST', sbPath(id, '/code'), { body, raw: true, signal });
        await events(res, (ev) => render(out, ev, count));
      } catch (e) {
        if (!signal.aborted) out.append(h('pre', { class: 'stderr', text: errText(e) }));
        count.textContent = '[!]';
      } finally {
        run.disabled = false;
        refresh();
      }
      if (cell === cells.lastElementChild) addCell(false);
      else cell.nextElementSibling?.querySelector('textarea')?.focus();
    };
    run.addEventListener('click', go);
    src.addEventListener('keydown', (e) => { if (e.key === 'Enter' && (e.shiftKey || e.ctrlKey)) { e.preventDefault(); go(); } });
    cells.append(cell);
    if (focus) src.focus();
  }
  addCell(true);
}

// render shows one event of a code stream.
function render(out, ev, count) {
  const append = (cls, s) => { // consecutive output of a kind goes to one <pre>
    const last = out.lastElementChild;
    if (last && last.tagName === 'PRE' && last.className === cls) last.textContent += s;
    else out.append(h('pre', { class: cls, text: s }));
  };
  switch (ev.type) {
    case 'stdout': append('stdout', text(ev.data)); break;
    case 'stderr': append('stderr', stripANSI(text(ev.data))); break;
    case 'result': out.append(result(ev.result.data || {})); break;
    case 'execution_error': {
      const e = ev.execution_error || {};
      out.append(h('pre', { class: 'traceback', role: 'alert', text: stripANSI(e.traceback || `${e.name}: ${e.value}`) }));
      break;
    }
    case 'error': out.append(h('pre', { class: 'stderr', role: 'alert', text: errText({ ...ev.error, requestId: ev.error?.request_id }) })); break;
    case 'done': count.textContent = `[${ev.execution_count ?? ' '}]`; break;
  }
}

function result(d) {
  if (d['image/png']) return h('img', { class: 'result', src: 'data:image/png;base64,' + d['image/png'], alt: d['text/plain'] || 'PNG result' });
  if (d['image/jpeg']) return h('img', { class: 'result', src: 'data:image/jpeg;base64,' + d['image/jpeg'], alt: d['text/plain'] || 'JPEG result' });
  if (d['image/svg+xml']) {
    const svg = new Blob([d['image/svg+xml']], { type: 'image/svg+xml' });
    return h('img', { class: 'result', src: URL.createObjectURL(svg), alt: d['text/plain'] || 'SVG result' });
  }
  if (d['text/html']) {
    // sandbox="" : no scripts, no forms, a unique origin; the console's
    // CSP still applies to it.
    return h('iframe', { class: 'result html', sandbox: '', title: 'HTML result', srcdoc: d['text/html'] });
  }
  const t = d['text/plain'] ?? d['text/markdown'] ?? d['text/latex'] ?? (d['application/json'] ? JSON.stringify(d['application/json'], null, 2) : '');
  return h('pre', { class: 'result-text', text: t });
}
