// E2B's "how many r's are in strawberry" example: the code an LLM would
// write, run in a code-interpreter sandbox.
import { Sandbox } from '@e2b/code-interpreter'

const code = `
word = "strawberry"
word.count("r")
`
const sbx = await Sandbox.create()
const execution = await sbx.runCode(code)
console.log(execution.text)
await sbx.kill()
