package e2b

// The JSON of E2B's template build API ("Build System 2.0"), field for
// field as the SDKs' Template.build, Template.exists and the tag helpers
// send and read it (/work/shared/docs/e2b-templates.md).

// templateBuildRequest is TemplateBuildRequestV3 (POST /v3/templates).
type templateBuildRequest struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"` // deprecated name
	Tags     []string `json:"tags"`
	CPUCount *int     `json:"cpuCount"`
	MemoryMB *int     `json:"memoryMB"`
}

// templateRequestResponse is the 202 answer of POST /v3/templates.
type templateRequestResponse struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Public     bool     `json:"public"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
	Aliases    []string `json:"aliases"`
}

// templateStep is TemplateStep; the SDK also sends forceUpload,
// resolveSymlinks and gzip, which only its own upload uses.
type templateStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// registryConfig is fromImageRegistry.
type registryConfig struct {
	Type     string `json:"type"` // registry, aws or gcp
	Username string `json:"username"`
	Password string `json:"password"`
}

// templateBuildStart is TemplateBuildStartV2 (POST
// /v2/templates/{templateID}/builds/{buildID}).
type templateBuildStart struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry *registryConfig `json:"fromImageRegistry"`
	Force             bool            `json:"force"`
	Steps             []templateStep  `json:"steps"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
}

// buildLogEntry is BuildLogEntry.
type buildLogEntry struct {
	Timestamp stamp  `json:"timestamp"`
	Level     string `json:"level"` // debug, info, warn or error
	Message   string `json:"message"`
	Step      string `json:"step,omitempty"`
}

// buildStatusReason is BuildStatusReason: Step is "base", "finalize" or
// the step's number, counted from 1.
type buildStatusReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []buildLogEntry `json:"logEntries,omitempty"`
}

// templateBuildInfo is TemplateBuildInfo (the build status).
type templateBuildInfo struct {
	TemplateID string             `json:"templateID"`
	BuildID    string             `json:"buildID"`
	Status     string             `json:"status"` // waiting, building, ready or error
	Logs       []string           `json:"logs"`
	LogEntries []buildLogEntry    `json:"logEntries"`
	Reason     *buildStatusReason `json:"reason,omitempty"`
}

// templateFileUpload is TemplateBuildFileUpload.
type templateFileUpload struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

// aliasJSON is the answer of GET /templates/aliases/{alias}.
type aliasJSON struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// tagsRequest is the body of POST /templates/tags; untagRequest that of
// DELETE /templates/tags.
type tagsRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

type untagRequest struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// tagsResponse is the answer of POST /templates/tags.
type tagsResponse struct {
	BuildID string   `json:"buildID"`
	Tags    []string `json:"tags"`
}

// templateTag is one element of GET /templates/{templateID}/tags.
type templateTag struct {
	Tag       string `json:"tag"`
	BuildID   string `json:"buildID"`
	CreatedAt stamp  `json:"createdAt"`
}

// templateJSON is E2B's Template (GET /templates, GET /v2/templates).
type templateJSON struct {
	TemplateID    string   `json:"templateID"`
	BuildID       string   `json:"buildID"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int64    `json:"memoryMB"`
	DiskSizeMB    int64    `json:"diskSizeMB"`
	Public        bool     `json:"public"`
	Aliases       []string `json:"aliases"`
	Names         []string `json:"names"`
	CreatedAt     stamp    `json:"createdAt"`
	UpdatedAt     stamp    `json:"updatedAt"`
	CreatedBy     *string  `json:"createdBy"`
	LastSpawnedAt *stamp   `json:"lastSpawnedAt"`
	SpawnCount    int      `json:"spawnCount"`
	BuildCount    int      `json:"buildCount"`
	EnvdVersion   string   `json:"envdVersion"`
	BuildStatus   string   `json:"buildStatus"`
}

// publicRequest is the body of PATCH /v2/templates/{templateID}.
type publicRequest struct {
	Public *bool `json:"public"`
}
