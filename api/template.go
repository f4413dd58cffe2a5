package api

// A template build is a base plus ordered steps, then an optional start
// command whose readiness is checked before the running sandbox is
// checkpointed. The step model is E2B's (TemplateStep: type, args,
// filesHash, force), so E2B's template API maps onto it one to one; the
// Dockerfile front end compiles a Dockerfile into the same steps.

// Step types.
const (
	// StepRun runs Args[0] with /bin/sh -c in a build sandbox, as Args[1]
	// if given (else the current USER, else root).
	StepRun = "RUN"
	// StepCopy copies the files of FilesHash (a tar uploaded before the
	// build; Args[0] is the source pattern it was made from, relative to
	// the build context) to Args[1], with Docker's COPY semantics. Args[2]
	// is an optional owner ("user", "user:group", uid[:gid]); Args[3] an
	// optional octal mode applied to what is copied.
	StepCopy = "COPY"
	// StepAdd is StepCopy, except that a local tar archive among the
	// sources is unpacked into the destination (Docker's ADD of a local
	// file; remote URLs are refused).
	StepAdd = "ADD"
	// StepEnv sets environment variables: Args are key, value pairs.
	StepEnv = "ENV"
	// StepWorkdir sets (and creates) the working directory: Args[0].
	StepWorkdir = "WORKDIR"
	// StepUser sets the user later RUN steps and the template's sandboxes
	// run as: Args[0].
	StepUser = "USER"
)

// TemplateStep is one build step.
type TemplateStep struct {
	Type string   `json:"type"`
	Args []string `json:"args,omitempty"`
	// FilesHash names the uploaded tar of a COPY/ADD step's sources: the
	// hex SHA-256 defined by E2B's calculateFilesHash (the string
	// "COPY <src> <dest>", then per matched file its relative path, mode,
	// size and contents).
	FilesHash string `json:"files_hash,omitempty"`
	// Force rebuilds this step and every later one, cached or not.
	Force bool `json:"force,omitempty"`
	// Line is where the step came from in a Dockerfile (0: not from one),
	// so errors can name it.
	Line int `json:"line,omitempty"`
}

// TemplateBase is what a build starts from: exactly one of Template (a
// Kiln template, "name" or "name:tag"), Image (an OCI image reference
// pulled from a registry) or Archive (the FilesHash of an uploaded OCI
// layout or `docker save` tarball).
type TemplateBase struct {
	Template string `json:"template,omitempty"`
	Image    string `json:"image,omitempty"`
	Archive  string `json:"archive,omitempty"`
	// Registry holds the credentials Image is pulled with (anonymous
	// when absent). It is never stored or returned.
	Registry *RegistryAuth `json:"registry,omitempty"`
}

// RegistryAuth is a username and password (or token) for a registry.
type RegistryAuth struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// TemplateSpec is the whole recipe of a build.
type TemplateSpec struct {
	From  TemplateBase   `json:"from"`
	Steps []TemplateStep `json:"steps,omitempty"`
	// StartCmd is left running in the sandbox the template is
	// checkpointed from (e.g. a web server); ReadyCmd is retried until it
	// exits 0 before the checkpoint is taken.
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// NoCache rebuilds every step.
	NoCache bool `json:"no_cache,omitempty"`
}
