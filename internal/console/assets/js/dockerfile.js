// A small Dockerfile reader for builds started from the console: FROM, RUN,
// ENV, WORKDIR, USER, CMD/ENTRYPOINT (the start command) and comments and
// line continuations, compiled to the API's TemplateSpec. COPY and ADD need
// the build context's files, which a browser upload of one file does not
// have: use `kiln template build` or the SDK's BuildDockerfile for those.
// Whatever it refuses, it says with the line.

export function compileDockerfile(src, isTemplate) {
  const lines = [];
  let buf = '', start = 0;
  src.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (!buf && (line === '' || line.startsWith('#'))) return;
    if (!buf) start = i + 1;
    if (line.endsWith('\\')) { buf += line.slice(0, -1) + ' '; return; }
    buf += line;
    lines.push([start, buf]);
    buf = '';
  });
  if (buf) lines.push([start, buf]);
  const spec = { from: {}, steps: [] };
  let user = '';
  const fail = (n, msg) => { throw new Error(`Dockerfile:${n}: ${msg}`); };
  const execForm = (rest) => { try { const a = JSON.parse(rest); return Array.isArray(a) ? a : null; } catch { return null; } };
  for (const [n, line] of lines) {
    const m = line.match(/^(\S+)\s*(.*)$/);
    const op = m[1].toUpperCase(), rest = m[2].trim();
    if (op !== 'FROM' && !spec.from.template && !spec.from.image) fail(n, op + ' before FROM');
    switch (op) {
      case 'FROM': {
        if (spec.from.template || spec.from.image) fail(n, 'multi-stage builds are not supported');
        const ref = rest.split(/\s+/)[0];
        if (!ref || ref.startsWith('--')) fail(n, 'FROM takes an image or template');
        if (ref === 'scratch') fail(n, 'FROM scratch is not supported: a template needs a base with a shell');
        const bare = ref.split(':')[0];
        if (!ref.includes('/') && !ref.includes('@') && isTemplate(bare)) spec.from.template = ref;
        else spec.from.image = ref;
        break;
      }
      case 'RUN': {
        const a = execForm(rest);
        const cmd = a ? a.map((w) => "'" + String(w).replace(/'/g, "'\\''") + "'").join(' ') : rest;
        if (!cmd) fail(n, 'RUN needs a command');
        if (/^--/.test(rest)) fail(n, 'RUN flags are not supported');
        spec.steps.push({ type: 'RUN', args: user ? [cmd, user] : [cmd], line: n });
        break;
      }
      case 'ENV': {
        const args = [];
        if (/^[^\s=]+\s+[^=]*$/.test(rest) && !rest.includes('=')) {
          const [k, ...v] = rest.split(/\s+/);
          args.push(k, '"' + v.join(' ') + '"');
        } else {
          for (const pair of rest.match(/[^\s=]+=("([^"\\]|\\.)*"|'[^']*'|\S*)/g) || []) {
            const i = pair.indexOf('=');
            let v = pair.slice(i + 1);
            if (v.startsWith("'")) v = '"' + v.slice(1, -1).replace(/(["\\$`])/g, '\\$1') + '"';
            else if (!v.startsWith('"')) v = '"' + v + '"';
            args.push(pair.slice(0, i), v);
          }
        }
        if (!args.length) fail(n, 'ENV needs key=value');
        spec.steps.push({ type: 'ENV', args, line: n });
        break;
      }
      case 'WORKDIR': spec.steps.push({ type: 'WORKDIR', args: [rest], line: n }); break;
      case 'USER': user = rest; spec.steps.push({ type: 'USER', args: [rest], line: n }); break;
      case 'CMD': case 'ENTRYPOINT': {
        const a = execForm(rest);
        spec.start_cmd = a ? a.join(' ') : rest;
        break;
      }
      case 'COPY': case 'ADD':
        fail(n, op + ' needs the build context: build with `kiln template build` or the SDK (BuildDockerfile)');
        break;
      case 'EXPOSE': case 'LABEL': case 'MAINTAINER': case 'STOPSIGNAL': case 'HEALTHCHECK': case 'VOLUME':
        break; // ignored, as the server-side compiler does
      default: fail(n, op + ' is not supported here');
    }
  }
  if (!spec.from.template && !spec.from.image) throw new Error('Dockerfile: no FROM instruction');
  return spec;
}
