package main

import (
	"fmt"
	"strings"
	"testing"
)

// The repository's Argo CD health checks (deploy/argocd/argocd-cm.yaml, what users install), on
// objects in each state; the e2e scenarios run the same file against live objects.
const repoArgoCM = "../../deploy/argocd/argocd-cm.yaml"

func larchObject(kind string, generation int, status string) string {
	return fmt.Sprintf(`{"apiVersion":"larch.dev/v1alpha1","kind":%q,"metadata":{"name":"x","generation":%d}%s}`, kind, generation, status)
}

func conds(observed int, cs ...string) string {
	return fmt.Sprintf(`,"status":{"observedGeneration":%d,"conditions":[%s]}`, observed, strings.Join(cs, ","))
}

func cond(t, s, reason, msg string) string {
	return fmt.Sprintf(`{"type":%q,"status":%q,"reason":%q,"message":%q}`, t, s, reason, msg)
}

func TestTheRepositoryHealthChecksInEachState(t *testing.T) {
	ready := cond("Ready", "True", "EnginesReady", "2/2 engines ready")
	notStalled := cond("Stalled", "False", "EnginesReady", "")
	cases := []struct {
		kind, status, wantStatus, wantMessage string
		generation                            int
	}{
		{"ArchiveExport", "", "Progressing", "Waiting for the operator's first status", 1},
		{"ArchiveSource", conds(1, ready), "Progressing", "Waiting for the operator to observe generation 2", 2},
		{"ArchiveSourceSet", conds(3, ready, notStalled), "Healthy", "EnginesReady: 2/2 engines ready", 3},
		{"ArchiveExport", conds(1, cond("Ready", "False", "ExportRunning", "export run r1 in progress"), cond("Reconciling", "True", "ExportRunning", "export run r1 in progress"), cond("Stalled", "False", "ExportRunning", "")),
			"Progressing", "ExportRunning: export run r1 in progress", 1},
		{"ArchiveExport", conds(1, cond("Ready", "False", "InvalidSpec", "bad affinity"), cond("Reconciling", "False", "InvalidSpec", ""), cond("Stalled", "True", "InvalidSpec", "bad affinity")),
			"Degraded", "InvalidSpec: bad affinity", 1},
		{"ArchiveExport", conds(1, cond("Ready", "True", "Suspended", "suspended: no export is started")), "Suspended", "Suspended: suspended: no export is started", 1},
		{"ArchiveSource", conds(1, ready, notStalled, cond("Degraded", "True", "ShortChain", "1/2 engines serve an older state")), "Degraded", "ShortChain: 1/2 engines serve an older state", 1},
		{"ArchiveSourceSet", conds(1, cond("Ready", "False", "NamespacesFailing", "1 of 4 failing"), cond("Stalled", "True", "NamespacesFailing", "1 of 4 failing")), "Degraded", "NamespacesFailing: 1 of 4 failing", 1},
		{"ArchiveSourceSet", conds(1, cond("Ready", "Unknown", "Pending", "")), "Progressing", "Pending", 1},
	}
	for _, c := range cases {
		obj := larchObject(c.kind, c.generation, c.status)
		out, err := run(t, health, []string{"--argocd-cm", repoArgoCM}, obj)
		if err != nil {
			t.Errorf("%s: %v", obj, err)
			continue
		}
		if r := result(t, out); r.Status != c.wantStatus || r.Message != c.wantMessage {
			t.Errorf("%s: got %q %q, want %q %q", obj, r.Status, r.Message, c.wantStatus, c.wantMessage)
		}
	}
}
