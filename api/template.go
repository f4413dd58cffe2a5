package api

import "time"

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
// layout or `docker save` tarball). Debian, a root filesystem bootstrapped
// on the host, is the base of Kiln's built-in templates: only a local build
// (kiln template build, as make setup runs it) may use it; a server refuses
// it.
type TemplateBase struct {
	Template string      `json:"template,omitempty"`
	Image    string      `json:"image,omitempty"`
	Archive  string      `json:"archive,omitempty"`
	Debian   *DebianBase `json:"debian,omitempty"`
	// Registry holds the credentials Image is pulled with (anonymous
	// when absent). It is never stored or returned.
	Registry *RegistryAuth `json:"registry,omitempty"`
}

// DebianBase is a Debian root filesystem made by debootstrap (Variant,
// e.g. minbase, of Suite, with Include) and apt-get (Packages, without
// recommends) from the host's Debian mirror, apt's caches and the
// packages' docs removed. With Template (a built-in template, itself
// from Debian) instead of Suite, Variant and Include, Packages are
// installed on top of that template's layers.
type DebianBase struct {
	Suite    string   `json:"suite,omitempty"`
	Variant  string   `json:"variant,omitempty"`
	Include  []string `json:"include,omitempty"`
	Template string   `json:"template,omitempty"`
	Packages []string `json:"packages,omitempty"`
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
	// CPUs, MemoryMB and DiskMB are the resources sandboxes of the
	// template get unless their create request says otherwise (0: the
	// server's default). They are checked against the server's limits.
	CPUs     int `json:"cpus,omitempty"`
	MemoryMB int `json:"memory_mb,omitempty"`
	DiskMB   int `json:"disk_mb,omitempty"`
}

// Template build states (TemplateBuild.Status).
const (
	BuildWaiting  = "waiting"
	BuildBuilding = "building"
	BuildReady    = "ready"
	BuildError    = "error"
)

// TemplateBuildRequest starts a build of a template (POST
// /v1/templates/builds). The files of its COPY/ADD steps (and a
// from.archive) are uploaded first (PUT /v1/templates/files/{hash}).
type TemplateBuildRequest struct {
	// Template is "name" or "name:tag" (tag "default" when absent): the
	// tag points at the build once it is ready.
	Template string       `json:"template"`
	Spec     TemplateSpec `json:"spec"`
	// Public makes the template usable (not changeable) by every key.
	Public bool `json:"public,omitempty"`
}

// TemplateBuild is one build of a template.
type TemplateBuild struct {
	ID       string `json:"id"`
	Template string `json:"template"`
	// Tag is the tag the build was started for, or one that points at it
	// now ("" when none does, e.g. a failed build).
	Tag    string `json:"tag,omitempty"`
	Owner  string `json:"owner,omitempty"`
	Status string `json:"status"` // waiting, building, ready or error
	// Reason says why a build failed: the step, what happened and the
	// tail of its output.
	Reason     string     `json:"reason,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	StartedAt  *time.Time `json:"started_at,omitempty"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	// Steps is the number of steps of the recipe; StepsDone how many the
	// build got through (ran or found in the layer cache) and CachedSteps
	// how many of those were found in the cache. Both are known once the
	// build has ended (0 before).
	Steps       int `json:"steps"`
	StepsDone   int `json:"steps_done"`
	CachedSteps int `json:"cached_steps"`
	// Layers is the number of layers of a ready build; Warm says that its
	// sandboxes are restored from a snapshot taken after its start
	// command passed its ready check.
	Layers int  `json:"layers,omitempty"`
	Warm   bool `json:"warm,omitempty"`
	// Image is the build in the cluster registry
	// ("registry/repository:tag@sha256:…"), when its node has one
	// (docs/cluster.md): other nodes pull it on first use.
	Image string `json:"image,omitempty"`
	// Spec is the recipe, without registry credentials.
	Spec *TemplateSpec `json:"spec,omitempty"`
}

// TemplateLogEntry is one line of a build's log (GET
// /v1/templates/builds/{id}/logs).
type TemplateLogEntry struct {
	Time  time.Time `json:"time"`
	Level string    `json:"level"` // info, warn or error
	// Step is the index of the recipe's step the line is about (-1: the
	// base, or the build as a whole).
	Step    int    `json:"step"`
	Message string `json:"message"`
	// Output says the line is one a RUN step printed.
	Output bool `json:"output,omitempty"`
	// Stage is the part of the build the line is about: "base" (the FROM),
	// "step" (Step says which) or "finalize" (the working directory, the
	// start and ready commands, the warm snapshot).
	Stage string `json:"stage,omitempty"`
	// Total is the number of steps of the recipe.
	Total int `json:"total,omitempty"`
	// Event marks the lines that begin and end the parts of a build:
	// "begin" (a part's first line: the FROM, the step's instruction, the
	// first of the final stage), "done" (the step finished; its message
	// says how long it took), and "ready" or "error" (the build ended; an
	// error's message is its reason). "" for other lines.
	Event string `json:"event,omitempty"`
	// Cached marks the begin line of a step whose layer was found in the
	// cache: the step is done.
	Cached bool `json:"cached,omitempty"`
	// ElapsedMs is, on a "done" line, how long the step took since it
	// began.
	ElapsedMs int64 `json:"elapsed_ms,omitempty"`
}

// Events of build log lines (TemplateLogEntry.Event).
const (
	LogBegin = "begin"
	LogDone  = "done"
	LogReady = "ready"
	LogError = "error"
)

// Template is one tag of a template and the build it points at.
type Template struct {
	Name    string `json:"name"`
	Tag     string `json:"tag"`
	BuildID string `json:"build_id,omitempty"` // "" for a built-in
	Owner   string `json:"owner,omitempty"`
	Public  bool   `json:"public"`
	// Builtin marks the templates every server has (base,
	// code-interpreter).
	Builtin   bool           `json:"builtin,omitempty"`
	UpdatedAt time.Time      `json:"updated_at,omitzero"`
	Build     *TemplateBuild `json:"build,omitempty"`
}

// TemplateList is the answer of GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// TemplateBuildList is the answer of GET /v1/templates/builds.
type TemplateBuildList struct {
	Builds []TemplateBuild `json:"builds"`
}

// TemplatePushRequest pushes a template's build to a registry as an OCI
// image (POST /v1/templates/{ref}/push).
type TemplatePushRequest struct {
	// Image is the reference to push to: [registry/]repository[:tag].
	Image string `json:"image"`
	// Registry holds credentials for it; anonymous when absent.
	Registry *RegistryAuth `json:"registry,omitempty"`
}

// TemplatePushResult is the pushed image.
type TemplatePushResult struct {
	Image  string `json:"image"`
	Digest string `json:"digest"` // the manifest's, sha256:…
	// BuildID is the build that was pushed ("" for a built-in).
	BuildID string `json:"build_id,omitempty"`
}

// TemplateTagRequest points a tag at a build (PUT
// /v1/templates/{name}/tags/{tag}).
type TemplateTagRequest struct {
	BuildID string `json:"build_id"`
}

// TemplateUpdate changes a template (PATCH /v1/templates/{name}).
type TemplateUpdate struct {
	Public *bool `json:"public"`
}
