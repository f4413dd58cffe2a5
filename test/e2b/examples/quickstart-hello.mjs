// E2B's quick start, unchanged but for printing the names of /: run Python
// in a code-interpreter sandbox and list the sandbox's root directory.
import { Sandbox } from '@e2b/code-interpreter'

const sbx = await Sandbox.create() // By default the sandbox is alive for 5 minutes
const execution = await sbx.runCode('print("hello world")') // Execute Python inside the sandbox
console.log(execution.logs)

const files = await sbx.files.list('/')
console.log(files.map((f) => f.name).join('\n'))
await sbx.kill()
