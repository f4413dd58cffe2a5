// HTTP from the tests' own process to sandbox ports (sandbox.getHost).
import assert from 'node:assert/strict'
import dns from 'node:dns'
import http from 'node:http'

// get GETs url with headers and returns { status, body }. When the system
// resolver does not give *.localhost names loopback addresses (RFC 6761;
// plain glibc with "hosts: files dns" does not, systemd-resolved and
// nss-myhostname do), they are resolved as RFC 6761 says, here only.
export async function get(url, headers = {}) {
  const { hostname } = new URL(url)
  const resolves = await dns.promises.lookup(hostname).then(() => true, () => false)
  if (resolves) {
    const res = await fetch(url, { headers })
    return { status: res.status, body: await res.text() }
  }
  assert.ok(hostname.endsWith('.localhost'), `${hostname} does not resolve`)
  const lookup = (_name, opts, cb) =>
    opts?.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)
  return new Promise((resolve, reject) => {
    http.get(url, { headers, lookup }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (d) => (body += d))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    }).on('error', reject)
  })
}

// portURL is the URL of path on port of sbx, as the SDK names it.
export function portURL(sbx, port, path = '/') {
  return `${new URL(process.env.E2B_API_URL).protocol}//${sbx.getHost(port)}${path}`
}
