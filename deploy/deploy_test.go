package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The subset of the Kubernetes API the checks read. Fields the manifests set
// but the checks do not read are ignored.
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec       spec              `yaml:"spec"`
	Type       string            `yaml:"type"`       // Secret
	StringData map[string]string `yaml:"stringData"` // Secret
	Data       map[string]string `yaml:"data"`       // Secret

	file string // where it was read
}

// spec is a DaemonSet's or Deployment's spec, or a Pod's (inline).
type spec struct {
	Selector *struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template *struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec podSpec `yaml:"spec"`
	} `yaml:"template"`
	UpdateStrategy *struct {
		Type          string `yaml:"type"`
		RollingUpdate *struct {
			MaxSurge       any `yaml:"maxSurge"`
			MaxUnavailable any `yaml:"maxUnavailable"`
		} `yaml:"rollingUpdate"`
	} `yaml:"updateStrategy"`
	podSpec `yaml:",inline"`
}

type podSpec struct {
	ServiceAccountName            string       `yaml:"serviceAccountName"`
	TerminationGracePeriodSeconds *int64       `yaml:"terminationGracePeriodSeconds"`
	Tolerations                   []toleration `yaml:"tolerations"`
	InitContainers                []container  `yaml:"initContainers"`
	Containers                    []container  `yaml:"containers"`
	Volumes                       []volume     `yaml:"volumes"`
}

type toleration struct {
	Key      string `yaml:"key"`
	Operator string `yaml:"operator"`
	Effect   string `yaml:"effect"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string  `yaml:"name"`
		Value     *string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
	} `yaml:"envFrom"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts    []volumeMount `yaml:"volumeMounts"`
	SecurityContext *struct {
		Privileged *bool `yaml:"privileged"`
	} `yaml:"securityContext"`
	Lifecycle *struct {
		PreStop *handler `yaml:"preStop"`
	} `yaml:"lifecycle"`
	StartupProbe   *handler `yaml:"startupProbe"`
	LivenessProbe  *handler `yaml:"livenessProbe"`
	ReadinessProbe *handler `yaml:"readinessProbe"`
}

// handler is a lifecycle hook or a probe.
type handler struct {
	Exec *struct {
		Command []string `yaml:"command"`
	} `yaml:"exec"`
	HTTPGet *struct {
		Path string `yaml:"path"`
	} `yaml:"httpGet"`
}

type volumeMount struct {
	Name             string `yaml:"name"`
	MountPath        string `yaml:"mountPath"`
	MountPropagation string `yaml:"mountPropagation"`
	ReadOnly         bool   `yaml:"readOnly"`
	SubPath          string `yaml:"subPath"`
}

type volume struct {
	Name     string `yaml:"name"`
	HostPath *struct {
		Path string `yaml:"path"`
		Type string `yaml:"type"`
	} `yaml:"hostPath"`
}

// pod is the pod spec of a workload (DaemonSet, Deployment, Pod).
func (o *object) pod() *podSpec {
	if o.Kind == "Pod" {
		return &o.Spec.podSpec
	}
	if o.Spec.Template == nil {
		return &podSpec{}
	}
	return &o.Spec.Template.Spec
}

func (o *object) String() string { return fmt.Sprintf("%s %s/%s", o.file, o.Kind, o.Metadata.Name) }

// The kinds deploy/ may hold.
var allowedKinds = map[string]string{
	"ServiceAccount": "v1",
	"Secret":         "v1",
	"Pod":            "v1",
	"DaemonSet":      "apps/v1",
	"Deployment":     "apps/v1",
}

// What the daemon's manifest must agree with (the daemon's interface).
const (
	daemonName   = "modelfs"
	statusAddr   = "127.0.0.1:9090"
	overheadSize = 256 << 20 // the daemon's memory beyond its cache
)

// parse reads every YAML document of every file.
func parse(files map[string][]byte) ([]*object, []string) {
	var objs []*object
	var problems []string
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		dec := yaml.NewDecoder(bytes.NewReader(files[name]))
		for i := 0; ; i++ {
			o := new(object)
			err := dec.Decode(o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: document %d does not parse: %v", name, i, err))
				break
			}
			if o.APIVersion == "" && o.Kind == "" && o.Metadata.Name == "" {
				continue // an empty document (comments only)
			}
			o.file = name
			objs = append(objs, o)
		}
	}
	return objs, problems
}

// check returns what is wrong with the manifests, one line per problem.
func check(files map[string][]byte) []string {
	objs, problems := parse(files)
	p := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

	var daemons, apps []*object
	var secrets []*object
	accounts := map[string]bool{}
	for _, o := range objs {
		switch {
		case o.Kind == "":
			p("%s: no kind", o)
		case o.APIVersion == "":
			p("%s: no apiVersion", o)
		case allowedKinds[o.Kind] != o.APIVersion:
			p("%s: unexpected kind/apiVersion %s %s", o, o.APIVersion, o.Kind)
		}
		if o.Metadata.Name == "" {
			p("%s: no metadata.name", o)
		}
		if o.Metadata.Namespace != "" {
			p("%s: sets metadata.namespace %q; the manifests are namespace-agnostic", o, o.Metadata.Namespace)
		}
		switch o.Kind {
		case "DaemonSet":
			daemons = append(daemons, o)
		case "Deployment", "Pod":
			apps = append(apps, o)
		case "Secret":
			secrets = append(secrets, o)
		case "ServiceAccount":
			accounts[o.Metadata.Name] = true
		}
	}
	if len(daemons) != 1 || daemons[0].Metadata.Name != daemonName {
		p("want exactly one DaemonSet, named %q; found %d", daemonName, len(daemons))
		return problems
	}
	ds := daemons[0]
	mnt, hostDir := checkDaemon(ds, accounts, p)
	checkCredentials(ds, secrets, p)
	checkNoLiteralSecrets(objs, p)
	if len(apps) == 0 {
		p("no application example (Deployment or Pod)")
	}
	for _, a := range apps {
		checkApp(a, mnt, hostDir, p)
	}
	return problems
}

// checkDaemon checks the DaemonSet and returns its mount point and the host
// directory it shares with Bidirectional propagation.
func checkDaemon(ds *object, accounts map[string]bool, p func(string, ...any)) (mnt, hostDir string) {
	s := &ds.Spec
	if s.Selector == nil || s.Template == nil || len(s.Selector.MatchLabels) == 0 {
		p("%s: no selector or template", ds)
		return "", ""
	}
	for k, v := range s.Selector.MatchLabels {
		if s.Template.Metadata.Labels[k] != v {
			p("%s: selector does not match the template's labels (%s=%s)", ds, k, v)
		}
	}
	if s.UpdateStrategy == nil || s.UpdateStrategy.Type != "RollingUpdate" {
		p("%s: updateStrategy is not RollingUpdate", ds)
	} else if ru := s.UpdateStrategy.RollingUpdate; ru != nil && ru.MaxSurge != nil && fmt.Sprint(ru.MaxSurge) != "0" {
		p("%s: rollingUpdate.maxSurge %v: two daemons would race for one mount point", ds, ru.MaxSurge)
	}
	ps := ds.pod()
	if ps.TerminationGracePeriodSeconds == nil || *ps.TerminationGracePeriodSeconds <= 0 {
		p("%s: terminationGracePeriodSeconds must be > 0", ds)
	}
	if ps.ServiceAccountName != "" && !accounts[ps.ServiceAccountName] {
		p("%s: serviceAccountName %q has no ServiceAccount in deploy/", ds, ps.ServiceAccountName)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(t toleration) bool { return t.Key == "nvidia.com/gpu" }) {
		p("%s: no toleration for GPU nodes (nvidia.com/gpu)", ds)
	}
	var c *container
	for i := range ps.Containers {
		if ps.Containers[i].Name == daemonName {
			c = &ps.Containers[i]
		}
	}
	if c == nil {
		p("%s: no container named %q", ds, daemonName)
		return "", ""
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		p("%s: container is not privileged", ds)
	}
	if !strings.HasPrefix(c.Image, "ghcr.io/modelfs/modelfs:") {
		p("%s: image %q is not ghcr.io/modelfs/modelfs:TAG", ds, c.Image)
	}

	// The mount command.
	args, ok := mountArgs(c)
	if !ok {
		p("%s: the container does not run `modelfs mount`", ds)
		return "", ""
	}
	for _, want := range [][]string{{"--allow-other"}, {"--status-addr", statusAddr}, {"--log-format", "json"}} {
		if !hasFlag(args, want...) {
			p("%s: modelfs mount lacks %s", ds, strings.Join(want, " "))
		}
	}
	for _, f := range []string{"--max-io-queue", "--io-chunksize"} {
		if hasFlag(args, f) || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, f+"=") }) {
			p("%s: modelfs mount sets %s, which overrides the env the memory request is sized from", ds, f)
		}
	}
	mnt = args[len(args)-1]
	if !path.IsAbs(mnt) || path.Clean(mnt) != mnt {
		p("%s: mount point %q is not a clean absolute path", ds, mnt)
		return "", ""
	}

	// Volumes: the mount point lies under a Bidirectional hostPath that is
	// the same path on the node, and is not itself the volume.
	vols := map[string]volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	var shared *volumeMount
	for i, m := range c.VolumeMounts {
		if m.MountPath == mnt {
			p("%s: the mount point %s is itself a volume: a dead mount left by a killed daemon would stop the "+
				"container from restarting; share its parent", ds, mnt)
		}
		if strings.HasPrefix(mnt, strings.TrimSuffix(m.MountPath, "/")+"/") && m.MountPropagation == "Bidirectional" {
			shared = &c.VolumeMounts[i]
		}
	}
	if shared == nil {
		p("%s: no volume mounted with mountPropagation: Bidirectional above the mount point %s", ds, mnt)
	} else {
		v := vols[shared.Name]
		switch {
		case v.HostPath == nil:
			p("%s: volume %q of the mount point is not a hostPath", ds, shared.Name)
		case v.HostPath.Path != shared.MountPath:
			p("%s: hostPath path %s is mounted at %s: use the same path on the node and in pods", ds, v.HostPath.Path, shared.MountPath)
		case v.HostPath.Type != "DirectoryOrCreate":
			p("%s: hostPath %s has type %q, want DirectoryOrCreate", ds, v.HostPath.Path, v.HostPath.Type)
		default:
			hostDir = v.HostPath.Path
		}
		if shared.SubPath != "" {
			p("%s: the Bidirectional volume uses subPath, which does not propagate", ds)
		}
	}
	fuse := false
	for _, m := range c.VolumeMounts {
		if v := vols[m.Name]; m.MountPath == "/dev/fuse" && v.HostPath != nil && v.HostPath.Path == "/dev/fuse" && v.HostPath.Type == "CharDevice" {
			fuse = true
		}
	}
	if !fuse {
		p("%s: /dev/fuse is not mounted from a hostPath of type CharDevice", ds)
	}

	// Shutdown.
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil {
		p("%s: no preStop exec hook", ds)
	} else if cmd := strings.Join(c.Lifecycle.PreStop.Exec.Command, " "); !strings.Contains(cmd, "umount") || !strings.Contains(cmd, mnt) {
		p("%s: preStop %q does not unmount %s", ds, cmd, mnt)
	}

	// Probes run `modelfs health` against the status address; liveness
	// must not depend on the object store (--ready: the mount answers).
	probes := []struct {
		name  string
		h     *handler
		ready bool // must pass --ready
	}{{"livenessProbe", c.LivenessProbe, true}, {"readinessProbe", c.ReadinessProbe, false}, {"startupProbe", c.StartupProbe, false}}
	for _, pr := range probes {
		if pr.h == nil {
			if pr.name != "startupProbe" {
				p("%s: no %s", ds, pr.name)
			}
			continue
		}
		if pr.h.Exec == nil || len(pr.h.Exec.Command) < 2 || path.Base(pr.h.Exec.Command[0]) != "modelfs" || pr.h.Exec.Command[1] != "health" {
			p("%s: %s does not exec `modelfs health`", ds, pr.name)
			continue
		}
		if !hasFlag(pr.h.Exec.Command, "--addr", statusAddr) {
			p("%s: %s does not check --addr %s", ds, pr.name, statusAddr)
		}
		if pr.ready && !hasFlag(pr.h.Exec.Command, "--ready") {
			p("%s: %s checks the object store (no --ready): an unreachable store would restart every daemon", ds, pr.name)
		}
	}

	// Memory: at least the cache plus the daemon's overhead.
	budget, err := cacheBudget(c)
	if err != nil {
		p("%s: %v", ds, err)
		return mnt, hostDir
	}
	req, err := quantity(c.Resources.Requests["memory"])
	if err != nil {
		p("%s: memory request: %v", ds, err)
	} else if req < float64(budget+overheadSize) {
		p("%s: memory request %s is below the cache (%d MiB) + 256 MiB", ds, c.Resources.Requests["memory"], budget>>20)
	}
	if lim, err := quantity(c.Resources.Limits["memory"]); err != nil {
		p("%s: memory limit: %v", ds, err)
	} else if lim < req {
		p("%s: memory limit %s is below the memory request", ds, c.Resources.Limits["memory"])
	}
	return mnt, hostDir
}

// mountArgs finds `modelfs mount ...` in the container's command and args,
// either as separate words or as a line of a shell script.
func mountArgs(c *container) ([]string, bool) {
	words := append(slices.Clone(c.Command), c.Args...)
	if i := slices.Index(words, "mount"); i > 0 && path.Base(words[i-1]) == "modelfs" {
		return words[i+1:], len(words) > i+1
	}
	for _, w := range words {
		for _, line := range strings.Split(w, "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == "exec" {
				f = f[1:]
			}
			if len(f) > 2 && path.Base(f[0]) == "modelfs" && f[1] == "mount" {
				return f[2:], true
			}
		}
	}
	return nil, false
}

// hasFlag reports whether args hold the flag (followed by its value, if
// given), as separate words or as flag=value.
func hasFlag(args []string, flag ...string) bool {
	for i, a := range args {
		if len(flag) == 1 && a == flag[0] {
			return true
		}
		if len(flag) == 2 && ((a == flag[0] && i+1 < len(args) && args[i+1] == flag[1]) || a == flag[0]+"="+flag[1]) {
			return true
		}
	}
	return false
}

// cacheBudget is MODELFS_MAX_IO_QUEUE × MODELFS_IO_CHUNKSIZE as the
// container's environment sets them.
func cacheBudget(c *container) (int64, error) {
	env := map[string]string{}
	for _, e := range c.Env {
		if e.Value != nil {
			env[e.Name] = *e.Value
		}
	}
	q, ok := env["MODELFS_MAX_IO_QUEUE"]
	if !ok {
		return 0, errors.New("no literal MODELFS_MAX_IO_QUEUE in env: the memory request cannot be checked")
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("MODELFS_MAX_IO_QUEUE %q is not a positive number", q)
	}
	cs, ok := env["MODELFS_IO_CHUNKSIZE"]
	if !ok {
		return 0, errors.New("no literal MODELFS_IO_CHUNKSIZE in env: the memory request cannot be checked")
	}
	chunk, err := chunkSize(cs)
	if err != nil {
		return 0, err
	}
	return n * chunk, nil
}

// chunkSize parses a size as modelfs does: a number of bytes, optionally
// with K, M, G or T (powers of 1024), optionally followed by "iB" or "B".
func chunkSize(s string) (int64, error) {
	m := regexp.MustCompile(`^([0-9]+)\s*([KMGT]?)(i?B)?$`).FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("MODELFS_IO_CHUNKSIZE %q is not a size", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, err
	}
	if m[2] == "" && m[3] == "iB" {
		return 0, fmt.Errorf("MODELFS_IO_CHUNKSIZE %q is not a size", s)
	}
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m[2]]
	return n << shift, nil
}

// quantity parses a Kubernetes resource quantity (1280Mi, 1.5Gi, 2G, 1e9,
// 1342177280) into bytes.
func quantity(s string) (float64, error) {
	m := regexp.MustCompile(`^([0-9.]+(?:[eE][0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$`).FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a quantity", s)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a quantity", s)
	}
	mult := map[string]float64{"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
		"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}[m[2]]
	return v * mult, nil
}

// checkCredentials: the daemon gets the store's keys from a Secret (envFrom
// secretRef, or secretKeyRef per variable) that deploy/ shows an example of,
// with placeholders only.
func checkCredentials(ds *object, secrets []*object, p func(string, ...any)) {
	if len(secrets) != 1 {
		p("want one example Secret, found %d", len(secrets))
		return
	}
	sec := secrets[0]
	vals := map[string]string{}
	for k, v := range sec.StringData {
		vals[k] = v
	}
	for k, v := range sec.Data {
		vals[k] = v
	}
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
		if _, ok := vals[k]; !ok {
			p("%s: no %s key", sec, k)
		}
	}
	for k, v := range vals {
		if !regexp.MustCompile(`^<[^<>]+>$`).MatchString(v) {
			p("%s: %s is %q, not a <placeholder>", sec, k, v)
		}
	}
	ps := ds.pod()
	for _, c := range ps.Containers {
		from := map[string]bool{} // variables from the Secret
		for _, ef := range c.EnvFrom {
			if ef.SecretRef != nil && ef.SecretRef.Name == sec.Metadata.Name {
				for k := range vals {
					from[k] = true
				}
			}
		}
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == sec.Metadata.Name {
				from[e.Name] = true
			}
		}
		if c.Name == daemonName && (!from["AWS_ACCESS_KEY_ID"] || !from["AWS_SECRET_ACCESS_KEY"]) {
			p("%s: the daemon does not take its credentials from Secret %q (envFrom secretRef or secretKeyRef)", ds, sec.Metadata.Name)
		}
	}
}

var (
	// Names of variables that hold secrets.
	secretName = regexp.MustCompile(`(?i)(KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL)`)
	// Values that look like keys: AWS key ids, or long unbroken base64/hex.
	keyLike = regexp.MustCompile(`^(AKIA|ASIA|AKLT)[A-Z0-9]{12,}|^[A-Za-z0-9+/=_-]{28,}$`)
)

// checkNoLiteralSecrets: no workload sets a secret-looking variable, or any
// variable to a key-looking value, inline.
func checkNoLiteralSecrets(objs []*object, p func(string, ...any)) {
	for _, o := range objs {
		ps := o.pod()
		for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
			for _, e := range c.Env {
				if e.Value == nil || *e.Value == "" {
					continue
				}
				if secretName.MatchString(e.Name) {
					p("%s: env %s has a literal value; take it from a Secret", o, e.Name)
				}
				if keyLike.MatchString(*e.Value) {
					p("%s: env %s = %q looks like a key", o, e.Name, *e.Value)
				}
			}
		}
	}
}

// checkApp: the application mounts the daemon's shared host directory
// read-only with HostToContainer propagation and reads a model under the
// mount point.
func checkApp(a *object, mnt, hostDir string, p func(string, ...any)) {
	ps := a.pod()
	vols := map[string]volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	readsModel := false
	for i, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
		main := i >= len(ps.InitContainers)
		if c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
			p("%s: container %s is privileged; an application needs no privilege to read the mount", a, c.Name)
		}
		bound := false
		for _, m := range c.VolumeMounts {
			v := vols[m.Name]
			if v.HostPath == nil || hostDir == "" || !strings.HasPrefix(hostDir+"/", v.HostPath.Path+"/") &&
				!strings.HasPrefix(v.HostPath.Path+"/", hostDir+"/") {
				continue
			}
			bound = true
			if v.HostPath.Path != hostDir {
				p("%s: container %s mounts hostPath %s, want the daemon's shared directory %s "+
					"(a mount point bound directly goes dead when the daemon restarts)", a, c.Name, v.HostPath.Path, hostDir)
			}
			if m.MountPath != hostDir {
				p("%s: container %s mounts %s at %s: use the same path as on the node", a, c.Name, hostDir, m.MountPath)
			}
			if m.MountPropagation != "HostToContainer" {
				p("%s: container %s mounts %s with mountPropagation %q, want HostToContainer", a, c.Name, hostDir, m.MountPropagation)
			}
			if !m.ReadOnly {
				p("%s: container %s mounts %s without readOnly: true", a, c.Name, hostDir)
			}
			if m.SubPath != "" {
				p("%s: container %s mounts %s with subPath, which does not propagate", a, c.Name, hostDir)
			}
		}
		if !bound || !main {
			continue
		}
		for _, w := range append(slices.Clone(c.Command), c.Args...) {
			if strings.Contains(w, mnt+"/") {
				readsModel = true
			}
		}
	}
	if !readsModel {
		p("%s: no container with the mount reads a model path under %s/", a, mnt)
	}
}

func readFiles(t *testing.T) map[string][]byte {
	t.Helper()
	names, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("*.yml")
	names = append(names, more...)
	if len(names) == 0 {
		t.Fatal("no manifests in deploy/")
	}
	files := map[string][]byte{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		files[n] = b
	}
	return files
}

// TestDeployManifests checks deploy/*.yaml as they are.
func TestDeployManifests(t *testing.T) {
	files := readFiles(t)
	for _, f := range []string{"daemonset.yaml", "secret.example.yaml", "app-example.yaml"} {
		if _, ok := files[f]; !ok {
			t.Errorf("deploy/%s is missing", f)
		}
	}
	objs, _ := parse(files)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.Kind]++
	}
	t.Logf("documents: %v", kinds)
	for _, pr := range check(files) {
		t.Error(pr)
	}
	// No file other than the Secret example names a key-like string at all.
	for name, b := range files {
		if name == "secret.example.yaml" {
			continue
		}
		if m := regexp.MustCompile(`\b(AKIA|ASIA)[A-Z0-9]{16}\b`).Find(b); m != nil {
			t.Errorf("%s holds what looks like an AWS access key id: %s", name, m)
		}
	}
}

// TestDeployChecksCatchMistakes breaks the manifests one way at a time and
// expects the checks to name each mistake: every check can fail.
func TestDeployChecksCatchMistakes(t *testing.T) {
	const (
		ds  = "daemonset.yaml"
		sec = "secret.example.yaml"
		app = "app-example.yaml"
	)
	cases := []struct {
		name, file, old, new, want string
	}{
		{"kind", ds, "kind: DaemonSet", "kind: DaemonSett", "unexpected kind"},
		{"apiVersion", ds, "apiVersion: apps/v1\nkind: DaemonSet", "apiVersion: extensions/v1beta1\nkind: DaemonSet", "unexpected kind"},
		{"namespace", ds, "  name: modelfs\n  labels:\n    app.kubernetes.io/name: modelfs\nspec:",
			"  name: modelfs\n  namespace: kube-system\n  labels:\n    app.kubernetes.io/name: modelfs\nspec:", "namespace-agnostic"},
		{"unparsable", app, "replicas: 1", "replicas: [1", "does not parse"},
		{"selector", ds, "    metadata:\n      labels:\n        app.kubernetes.io/name: modelfs",
			"    metadata:\n      labels:\n        app.kubernetes.io/name: other", "selector does not match"},
		{"update strategy", ds, "type: RollingUpdate", "type: OnDelete", "not RollingUpdate"},
		{"max surge", ds, "maxSurge: 0", "maxSurge: 1", "maxSurge"},
		{"grace period", ds, "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 0", "terminationGracePeriodSeconds"},
		{"no grace period", ds, "terminationGracePeriodSeconds: 30", "", "terminationGracePeriodSeconds"},
		{"service account", ds, "serviceAccountName: modelfs", "serviceAccountName: nobody", "has no ServiceAccount"},
		{"gpu toleration", ds, "- key: nvidia.com/gpu", "- key: example.com/other", "GPU nodes"},
		{"privileged", ds, "privileged: true", "privileged: false", "not privileged"},
		{"image", ds, "image: ghcr.io/modelfs/modelfs:latest", "image: modelfs", "is not ghcr.io/modelfs/modelfs"},
		{"not modelfs mount", ds, "exec modelfs mount", "exec modelfs serve", "does not run `modelfs mount`"},
		{"allow-other", ds, "mount --allow-other", "mount", "lacks --allow-other"},
		{"status-addr", ds, "--status-addr 127.0.0.1:9090 --log", "--status-addr 0.0.0.0:9090 --log", "lacks --status-addr"},
		{"log-format", ds, "--log-format json", "--log-format text", "lacks --log-format json"},
		{"cache flag", ds, "--log-format json", "--log-format json --max-io-queue 4096", "overrides the env"},
		{"relative mount point", ds, `"$MODELFS_URI"} /var/lib/modelfs/models`, `"$MODELFS_URI"} models`, "clean absolute path"},
		{"mount point is the volume", ds, `"$MODELFS_URI"} /var/lib/modelfs/models`, `"$MODELFS_URI"} /var/lib/modelfs`, "is itself a volume"},
		{"propagation", ds, "mountPropagation: Bidirectional", "mountPropagation: HostToContainer", "Bidirectional"},
		{"no propagation", ds, "mountPropagation: Bidirectional", "", "Bidirectional"},
		{"host path differs", ds, "path: /var/lib/modelfs\n", "path: /srv/modelfs\n", "use the same path"},
		{"host path type", ds, "type: DirectoryOrCreate", "type: Directory", "want DirectoryOrCreate"},
		{"dev fuse type", ds, "type: CharDevice", "type: File", "/dev/fuse"},
		{"dev fuse mount", ds, "mountPath: /dev/fuse", "mountPath: /dev/fuse0", "/dev/fuse"},
		{"no preStop", ds, "preStop:", "postStart:", "no preStop"},
		{"preStop", ds, `["umount", "-l", "/var/lib/modelfs/models"]`, `["sleep", "5"]`, "does not unmount"},
		{"liveness not modelfs health", ds, `command: ["modelfs", "health", "--addr", "127.0.0.1:9090", "--ready"]
            periodSeconds: 20`, `command: ["cat", "/var/lib/modelfs/models"]
            periodSeconds: 20`, "livenessProbe does not exec `modelfs health`"},
		{"liveness on the store", ds, `, "--ready"]
            periodSeconds: 20`, `]
            periodSeconds: 20`, "livenessProbe checks the object store"},
		{"no liveness", ds, "livenessProbe:", "livenessProbeX:", "no livenessProbe"},
		{"readiness not modelfs health", ds, `command: ["modelfs", "health", "--addr", "127.0.0.1:9090"]`,
			`command: ["true"]`, "readinessProbe does not exec `modelfs health`"},
		{"readiness addr", ds, `command: ["modelfs", "health", "--addr", "127.0.0.1:9090"]`,
			`command: ["modelfs", "health", "--addr", "127.0.0.1:9191"]`, "readinessProbe does not check --addr"},
		{"startup probe", ds, `command: ["modelfs", "health", "--addr", "127.0.0.1:9090", "--ready"]
            periodSeconds: 2
`, `command: ["sh", "-c", "true"]
            periodSeconds: 2
`, "startupProbe does not exec `modelfs health`"},
		{"memory request", ds, "memory: 1280Mi", "memory: 1200Mi", "below the cache"},
		{"memory for a larger cache", ds, `value: "128"`, `value: "256"`, "below the cache (2048 MiB)"},
		{"memory for larger chunks", ds, `value: "8MiB"`, `value: "16M"`, "below the cache (2048 MiB)"},
		{"memory limit", ds, "memory: 1536Mi", "memory: 1Gi", "limit 1Gi is below"},
		{"bad quantity", ds, "memory: 1280Mi", "memory: lots", "not a quantity"},
		{"no queue env", ds, "name: MODELFS_MAX_IO_QUEUE", "name: MODELFS_MAX_IO_QUEUEX", "no literal MODELFS_MAX_IO_QUEUE"},
		{"bad chunk env", ds, `value: "8MiB"`, `value: "8 parsecs"`, "is not a size"},
		{"no secret ref", ds, "name: modelfs-credentials", "name: other-credentials", "does not take its credentials"},
		{"literal secret", ds, "- name: AWS_REGION\n              value: us-east-1",
			"- name: AWS_SECRET_ACCESS_KEY\n              value: hunter2", "literal value"},
		{"key-like value", ds, "value: us-east-1", "value: AKIAIOSFODNN7EXAMPLE", "looks like a key"},
		{"long token value", ds, "value: us-east-1", "value: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "looks like a key"},
		{"secret not placeholder", sec, `AWS_SECRET_ACCESS_KEY: "<secret-access-key>"`,
			`AWS_SECRET_ACCESS_KEY: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"`, "not a <placeholder>"},
		{"secret keys", sec, "AWS_ACCESS_KEY_ID:", "AWS_KEY:", "no AWS_ACCESS_KEY_ID key"},
		{"app propagation", app, "mountPropagation: HostToContainer\n              readOnly: true\n      containers:",
			"mountPropagation: None\n              readOnly: true\n      containers:", "want HostToContainer"},
		{"app bidirectional", app, "mountPropagation: HostToContainer\n              readOnly: true\n          readinessProbe",
			"mountPropagation: Bidirectional\n              readOnly: true\n          readinessProbe", "want HostToContainer"},
		{"app read-only", app, "readOnly: true\n          readinessProbe", "readOnly: false\n          readinessProbe", "without readOnly"},
		{"app binds the mount point", app, "path: /var/lib/modelfs\n", "path: /var/lib/modelfs/models\n", "want the daemon's shared directory"},
		{"app path differs", app, "- name: modelfs\n              mountPath: /var/lib/modelfs\n              mountPropagation: HostToContainer\n              readOnly: true\n          readinessProbe",
			"- name: modelfs\n              mountPath: /models\n              mountPropagation: HostToContainer\n              readOnly: true\n          readinessProbe", "use the same path as on the node"},
		{"app privileged", app, "image: vllm/vllm-openai:latest", "image: vllm/vllm-openai:latest\n          securityContext:\n            privileged: true", "is privileged"},
		{"app model path", app, `["vllm", "serve", "/var/lib/modelfs/models/llama-3-8b"]`, `["vllm", "serve", "/data/llama-3-8b"]`, "reads a model path"},
	}
	base := readFiles(t)
	if pr := check(base); len(pr) != 0 {
		t.Fatalf("the manifests as they are have problems (see TestDeployManifests): %q", pr)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			orig := string(base[c.file])
			if n := strings.Count(orig, c.old); n != 1 {
				t.Fatalf("%s holds %q %d times, want once: update this case", c.file, c.old, n)
			}
			files := map[string][]byte{}
			for k, v := range base {
				files[k] = v
			}
			files[c.file] = []byte(strings.Replace(orig, c.old, c.new, 1))
			problems := check(files)
			for _, pr := range problems {
				if strings.Contains(pr, c.want) {
					return
				}
			}
			t.Errorf("after replacing %q with %q in %s, no problem says %q; got %q", c.old, c.new, c.file, c.want, problems)
		})
	}
}

func TestDeploySizeParsers(t *testing.T) {
	for s, want := range map[string]int64{"8MiB": 8 << 20, "8M": 8 << 20, "16MB": 16 << 20, "65536": 65536, "1G": 1 << 30, "256K": 256 << 10} {
		if got, err := chunkSize(s); err != nil || got != want {
			t.Errorf("chunkSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "8 parsecs", "iB", "-1M", "8X"} {
		if _, err := chunkSize(s); err == nil {
			t.Errorf("chunkSize(%q) succeeded", s)
		}
	}
	for s, want := range map[string]float64{"1280Mi": 1280 << 20, "1.5Gi": 1.5 * (1 << 30), "2G": 2e9, "1e9": 1e9, "1342177280": 1342177280} {
		if got, err := quantity(s); err != nil || got != want {
			t.Errorf("quantity(%q) = %g, %v; want %g", s, got, err, want)
		}
	}
	for _, s := range []string{"", "1.2.3Gi", "12 Mi", "1Gb", "Mi"} {
		if _, err := quantity(s); err == nil {
			t.Errorf("quantity(%q) succeeded", s)
		}
	}
}
