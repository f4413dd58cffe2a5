// check.mjs creates a sandbox of the template named by its argument with
// the stock SDK (this project's e2b), prints as JSON what ../cli_test.go
// checks in it, and kills it. Run with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY set.
import { Sandbox } from 'e2b'

const sbx = await Sandbox.create(process.argv[2])
try {
  const sh = async (cmd) => (await sbx.commands.run(cmd)).stdout.trim()
  const facts = {
    pwd: await sh('pwd'),
    user: await sh('whoami'),
    copied: await sh('cat /app/hello.txt'),
    owner: await sh('stat -c %U:%G /app/hello.txt'),
    built: await sh('cat /app/built.txt'),
    greeting: await sh('echo "$GREETING"'),
    version: await sh('echo "$VERSION"'),
    // The Dockerfile's CMD, started when the template was built.
    served: await sh(
      'for i in $(seq 100); do curl -sf localhost:8000/hello.txt && exit; sleep 0.2; done; echo not served'
    ),
  }
  console.log(JSON.stringify(facts))
} finally {
  await sbx.kill()
}
