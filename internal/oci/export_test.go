package oci

// StateFile is stateFile for tests: the sandbox pid, gofer pid and bundle
// dir from runsc's state file, and whether it was read.
func (c *CLI) StateFile(id string) (pid, gofer int, bundle string, ok bool) {
	st, ok := c.stateFile(id)
	return st.Sandbox.Pid, st.GoferPid, st.BundleDir, ok
}
