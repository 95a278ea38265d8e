// larch-gitops: what GitOps tools see of a Kubernetes object, computed by the libraries those
// tools run, for larch's end-to-end tests (no re-implementation that could agree with itself and
// still disagree with Flux or Argo CD).
//
//	larch-gitops kstatus [FILE]
//	    kstatus of each object: sigs.k8s.io/cli-utils pkg/kstatus/status.Compute, what Flux
//	    health checks and `wait`, kpt and kubectl-wait style tools compute (Flux runs the hard
//	    fork github.com/fluxcd/cli-utils, whose pkg/kstatus/status is the same code).
//	larch-gitops argocd-health (--argocd-cm FILE | --script FILE) [FILE]
//	    Argo CD's health of each object: the Lua script argocd-cm configures for the object's
//	    group and kind (resource.customizations.health.<group>_<Kind>), or the given script, run
//	    in github.com/yuin/gopher-lua with Argo CD's sandbox (see argocd.go).
//	larch-gitops version
//
// FILE (default: standard input) holds one object or a List, JSON or YAML, e.g. the output of
// `kubectl get -o json`. Output: one JSON object per input object,
// {"kind","namespace","name","status","message"}; a JSON array of them for a List. Bad input, a
// failing script or an object without a health check: a message on standard error, exit status 1.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

// Result is what one tool says about one object.
type Result struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Status    string `json:"status"`
	Message   string `json:"message"`
}

func usage() {
	fmt.Fprint(os.Stderr, `usage:
  larch-gitops kstatus [FILE]
  larch-gitops argocd-health (--argocd-cm FILE | --script FILE) [FILE]
  larch-gitops version
FILE (default: stdin): one object or a List, JSON or YAML (kubectl get -o json).
`)
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "kstatus":
		err = runKstatus(os.Args[2:], os.Stdin, os.Stdout)
	case "argocd-health":
		err = runArgoHealth(os.Args[2:], os.Stdin, os.Stdout)
	case "version":
		printVersions(os.Stdout)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "larch-gitops %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// printVersions names the library versions linked in (what the results are "as of").
func printVersions(w io.Writer) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	for _, m := range info.Deps {
		switch m.Path {
		case "sigs.k8s.io/cli-utils", "github.com/yuin/gopher-lua", "layeh.com/gopher-json", "k8s.io/apimachinery":
			fmt.Fprintf(w, "%s %s\n", m.Path, m.Version)
		}
	}
}

func runKstatus(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("kstatus", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	return eachObject(fs.Args(), stdin, stdout, func(u *unstructured.Unstructured) (string, string, error) {
		r, err := status.Compute(u)
		if err != nil {
			return "", "", err
		}
		return r.Status.String(), r.Message, nil
	})
}

func runArgoHealth(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("argocd-health", flag.ContinueOnError)
	cmFile := fs.String("argocd-cm", "", "the argocd-cm ConfigMap (JSON or YAML) holding resource.customizations.health.<group>_<Kind>")
	scriptFile := fs.String("script", "", "a health Lua script to run for every object instead")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var overrides map[string]Override
	switch {
	case (*cmFile == "") == (*scriptFile == ""):
		return errors.New("give exactly one of --argocd-cm FILE and --script FILE")
	case *cmFile != "":
		data, err := os.ReadFile(*cmFile)
		if err != nil {
			return err
		}
		if overrides, err = overridesFromConfigMap(data); err != nil {
			return fmt.Errorf("%s: %w", *cmFile, err)
		}
	}
	var script string
	if *scriptFile != "" {
		data, err := os.ReadFile(*scriptFile)
		if err != nil {
			return err
		}
		script = string(data)
	}
	return eachObject(fs.Args(), stdin, stdout, func(u *unstructured.Unstructured) (string, string, error) {
		var h *HealthStatus
		var err error
		if overrides != nil {
			h, err = ResourceHealth(u, overrides)
		} else {
			h, err = HealthOfScript(u, script, false)
		}
		if err != nil {
			return "", "", err
		}
		return h.Status, h.Message, nil
	})
}

// eachObject decodes FILE (or stdin) as one object or a List and writes one Result per object.
func eachObject(files []string, stdin io.Reader, stdout io.Writer, eval func(*unstructured.Unstructured) (string, string, error)) error {
	var data []byte
	var err error
	name := "stdin"
	switch len(files) {
	case 0:
		data, err = io.ReadAll(stdin)
	case 1:
		name = files[0]
		data, err = os.ReadFile(name)
	default:
		return fmt.Errorf("one input file at most, got %d", len(files))
	}
	if err != nil {
		return err
	}
	objs, isList, err := decodeObjects(data)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	results := make([]Result, 0, len(objs))
	for i, u := range objs {
		if err := checkObject(u); err != nil {
			if isList {
				return fmt.Errorf("%s: items[%d]: %w", name, i, err)
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		st, msg, err := eval(u)
		if err != nil {
			return fmt.Errorf("%s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
		results = append(results, Result{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(), Status: st, Message: msg})
	}
	enc := json.NewEncoder(stdout)
	if isList {
		return enc.Encode(results)
	}
	return enc.Encode(results[0])
}

// decodeObjects reads one object or a List (kind ending in "List" with items) as Argo CD and
// kstatus see objects: apimachinery's unstructured JSON decoding (integers become int64).
func decodeObjects(data []byte) ([]*unstructured.Unstructured, bool, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, false, errors.New("no object (empty input)")
	}
	if data[0] != '{' {
		j, err := yaml.YAMLToJSON(data)
		if err != nil {
			return nil, false, fmt.Errorf("neither JSON nor YAML: %w", err)
		}
		data = j
	}
	var probe struct {
		Items json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, false, fmt.Errorf("not a JSON object: %w", err)
	}
	if probe.Items != nil {
		var list unstructured.UnstructuredList
		if err := list.UnmarshalJSON(data); err != nil {
			return nil, false, err
		}
		out := make([]*unstructured.Unstructured, len(list.Items))
		for i := range list.Items {
			out[i] = &list.Items[i]
		}
		return out, true, nil
	}
	var u unstructured.Unstructured
	if err := u.UnmarshalJSON(data); err != nil {
		return nil, false, err
	}
	return []*unstructured.Unstructured{&u}, false, nil
}

// checkObject refuses what is not a Kubernetes object, naming the missing field.
func checkObject(u *unstructured.Unstructured) error {
	for _, f := range [][2]string{{"apiVersion", u.GetAPIVersion()}, {"kind", u.GetKind()}, {"metadata.name", u.GetName()}} {
		if f[1] == "" {
			return fmt.Errorf("not a Kubernetes object: %s is missing", f[0])
		}
	}
	return nil
}
