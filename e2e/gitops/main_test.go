package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const source = `{"apiVersion":"larch.dev/v1alpha1","kind":"ArchiveSource",
 "metadata":{"name":"cache","namespace":"data","generation":2},
 "status":{"observedGeneration":2,"conditions":[
  {"type":"Ready","status":"True","reason":"EnginesReady","message":"2/2 engines ready"},
  {"type":"Reconciling","status":"False","reason":"EnginesReady","message":""},
  {"type":"Stalled","status":"False","reason":"EnginesReady","message":""}]}}`

func run(t *testing.T, f func([]string, *bytes.Reader, *bytes.Buffer) error, args []string, input string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := f(args, bytes.NewReader([]byte(input)), &out)
	return out.String(), err
}

func kstatus(args []string, in *bytes.Reader, out *bytes.Buffer) error {
	return runKstatus(args, in, out)
}

func health(args []string, in *bytes.Reader, out *bytes.Buffer) error {
	return runArgoHealth(args, in, out)
}

func result(t *testing.T, out string) Result {
	t.Helper()
	var r Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	return r
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestKstatusOfAnObjectAndOfAList(t *testing.T) {
	out, err := run(t, kstatus, nil, source)
	if err != nil {
		t.Fatal(err)
	}
	if r := result(t, out); r.Status != "Current" || r.Name != "cache" || r.Namespace != "data" || r.Kind != "ArchiveSource" {
		t.Fatalf("got %+v", r)
	}
	behind := strings.Replace(source, `"observedGeneration":2`, `"observedGeneration":1`, 1)
	deleting := strings.Replace(source, `"generation":2`, `"generation":2,"deletionTimestamp":"2026-01-01T00:00:00Z"`, 1)
	list := `{"apiVersion":"v1","kind":"List","items":[` + behind + "," + deleting + `]}`
	out, err = run(t, kstatus, nil, list)
	if err != nil {
		t.Fatal(err)
	}
	var rs []Result
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Status != "InProgress" || rs[1].Status != "Terminating" {
		t.Fatalf("got %+v", rs)
	}
	if !strings.Contains(rs[0].Message, "generation is 2, but latest observed generation is 1") {
		t.Fatalf("message %q", rs[0].Message)
	}
}

func TestBadInputIsRefusedWithWhatIsWrong(t *testing.T) {
	for input, want := range map[string]string{
		"":                         "empty input",
		`{"kind":"ArchiveSource"}`: "stdin: not a Kubernetes object: apiVersion is missing",
		`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{}}]}`: "stdin: items[0]: not a Kubernetes object: metadata.name is missing",
		"- a\n- b\n":                       "not a JSON object",
		`{"apiVersion":"v1","kind":"List"`: "not a JSON object: unexpected end of JSON input",
		"kind: [":                          "neither JSON nor YAML",
	} {
		_, err := run(t, kstatus, nil, input)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("input %q: error %v, want it to mention %q", input, err, want)
		}
	}
}

func script(t *testing.T, lua string) string {
	return writeFile(t, "health.lua", lua)
}

func TestTheSandboxIsArgoCDs(t *testing.T) {
	cases := []struct{ lua, status, message, err string }{
		// obj is there, integers compare as numbers
		{lua: `return {status = "Healthy", message = obj.metadata.name .. " " .. obj.status.conditions[1].type .. " " .. tostring(obj.metadata.generation == 2)}`,
			status: "Healthy", message: "cache Ready true"},
		// standard libraries stay closed unless useOpenLibs is set
		{lua: `return {status = "Healthy", message = string.format("%d", 1)}`, err: "attempt to index a non-table object(nil) with key 'format'"},
		{lua: `return {status = "Healthy", message = tostring(math.floor(1.5))}`, err: "with key 'floor'"},
		{lua: `return {status = tostring(io)}`, status: "Unknown", message: invalidHealthStatus},
		// the global os is nil (Argo CD registers its safe os into an already loaded module);
		// require("os") gives time and date only
		{lua: `return {status = "Healthy", message = tostring(os.time())}`, err: "with key 'time'"},
		{lua: `local os = require("os"); return {status = "Healthy", message = tostring(os.time() > 0) .. tostring(os.exit)}`,
			status: "Healthy", message: "truenil"},
		{lua: `return {status = "Fine"}`, status: "Unknown", message: invalidHealthStatus},
		{lua: `return {}`, status: ""},
		{lua: `return nil`, status: ""},
		{lua: `return "Healthy"`, err: "expect table output from Lua script, not string"},
		{lua: `while true do end`, err: "context deadline exceeded"},
		{lua: `return {status = `, err: "syntax error"},
	}
	for _, c := range cases {
		out, err := run(t, health, []string{"--script", script(t, c.lua)}, source)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.lua, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.lua, err)
			continue
		}
		if r := result(t, out); r.Status != c.status || r.Message != c.message {
			t.Errorf("%s: got %+v, want %q %q", c.lua, r, c.status, c.message)
		}
	}
}

const argocdCM = `apiVersion: v1
kind: ConfigMap
metadata: {name: argocd-cm, namespace: argocd}
data:
  resource.customizations.health.larch.dev_ArchiveSource: |
    return {status = "Degraded", message = string.upper("x")}
  resource.customizations.useOpenLibs.larch.dev_ArchiveSource: "true"
  resource.customizations.health.larch.dev_ArchiveExport: |
    return {status = "Healthy", message = "export"}
  resource.customizations.ignoreDifferences.larch.dev_ArchiveExport: |
    jsonPointers: [/spec/replicas]
  url: https://argocd.example
`

func TestTheArgoCDConfigMapChoosesTheScriptByGroupAndKind(t *testing.T) {
	cm := writeFile(t, "argocd-cm.yaml", argocdCM)
	out, err := run(t, health, []string{"--argocd-cm", cm}, source)
	if err != nil {
		t.Fatal(err)
	}
	if r := result(t, out); r.Status != "Degraded" || r.Message != "X" {
		t.Fatalf("useOpenLibs opens string: got %+v", r)
	}
	export := strings.Replace(source, "ArchiveSource", "ArchiveExport", 1)
	if out, err = run(t, health, []string{"--argocd-cm", cm}, export); err != nil || result(t, out).Message != "export" {
		t.Fatalf("the export's script: %q %v", out, err)
	}
	set := strings.Replace(source, "ArchiveSource", "ArchiveSourceSet", 1)
	if _, err := run(t, health, []string{"--argocd-cm", cm}, set); err == nil ||
		!strings.Contains(err.Error(), "no health check for larch.dev/ArchiveSourceSet (key resource.customizations.health.larch.dev_ArchiveSourceSet)") {
		t.Fatalf("a kind without a script: %v", err)
	}
	bad := writeFile(t, "bad.yaml", "kind: ConfigMap\ndata:\n  resource.customizations.health.a_b_C: x\n")
	if _, err := run(t, health, []string{"--argocd-cm", bad}, source); err == nil || !strings.Contains(err.Error(), "data key resource.customizations.health.a_b_C") {
		t.Fatalf("a malformed key: %v", err)
	}
}

func TestAnObjectBeingDeletedIsPendingDeletionBeforeAnyScript(t *testing.T) {
	cm := writeFile(t, "argocd-cm.yaml", argocdCM)
	deleting := strings.Replace(source, `"generation":2`, `"generation":2,"deletionTimestamp":"2026-01-01T00:00:00Z","finalizers":["larch.dev/cleanup"]`, 1)
	out, err := run(t, health, []string{"--argocd-cm", cm}, deleting)
	if err != nil {
		t.Fatal(err)
	}
	if r := result(t, out); r.Status != "Progressing" || r.Message != "Pending deletion" {
		t.Fatalf("got %+v", r)
	}
	hook := strings.Replace(deleting, `"larch.dev/cleanup"`, `"argocd.argoproj.io/hook-finalizer"`, 1)
	if out, err = run(t, health, []string{"--argocd-cm", cm}, hook); err != nil || result(t, out).Status != "Degraded" {
		t.Fatalf("a hook runs its script: %q %v", out, err)
	}
}
