// Tests that fail against the current kiln serve, by full test name, with
// the reason (and the entry in the E2B findings file it waits on).
// A value is a reason string (all SDKs) or { sdks: ['v1'], reason }.
// test/e2b/run.mjs skips these unless E2B_RUN_KNOWN_FAILURES=1; shrink this
// list as fixes land: it should be empty.
export default {}
