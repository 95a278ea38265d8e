package main

// Argo CD's resource health, as its application controller computes it for a resource with a
// custom health check (argo-cd v3: gitops-engine pkg/health GetResourceHealth, util/lua
// runLuaWithResourceActionParameters / ExecuteHealthLua, util/settings for the argocd-cm keys).
// What is mirrored, so that a script that works here works in Argo CD:
//   - an object being deleted (without Argo CD's hook finalizer) is Progressing "Pending
//     deletion" before any script runs;
//   - the script comes from argocd-cm key resource.customizations.health.<group>_<Kind> (or
//     <Kind> for the core group); resource.customizations.useOpenLibs.<group>_<Kind>: "true"
//     opens Lua's standard libraries, otherwise they stay closed;
//   - the sandbox: only the package, base and table libraries are opened, plus Argo CD's "safe"
//     os (time and date only) — registered into the table module and loadable as require("os"),
//     so the global os (and string, math, io...) is nil unless useOpenLibs is set;
//   - a 1 s execution timeout; the object is the global `obj`, converted value by value as
//     Argo CD's decodeValue does;
//   - the returned table goes through layeh.com/gopher-json to {status, message}; a status
//     outside Healthy/Progressing/Degraded/Suspended/Missing/Unknown becomes Unknown "Lua
//     returned an invalid health status"; nil or an empty table is an empty health status.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/yaml"
)

const (
	customizationsPrefix = "resource.customizations"
	hookFinalizer        = "argocd.argoproj.io/hook-finalizer"
	invalidHealthStatus  = "Lua returned an invalid health status"
	scriptTimeout        = time.Second
)

// HealthStatus is gitops-engine's health.HealthStatus.
type HealthStatus struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

var validHealth = []string{"Unknown", "Progressing", "Healthy", "Suspended", "Degraded", "Missing"}

// Override is the part of Argo CD's ResourceOverride that health uses.
type Override struct {
	HealthLua   string
	UseOpenLibs bool
}

// overridesFromConfigMap reads the health customizations of an argocd-cm ConfigMap, keyed
// "<group>/<Kind>" (or "<Kind>") as Argo CD keys them.
func overridesFromConfigMap(data []byte) (map[string]Override, error) {
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(data, &cm); err != nil {
		return nil, fmt.Errorf("not a ConfigMap: %w", err)
	}
	if cm.Kind != "ConfigMap" {
		return nil, fmt.Errorf("kind %q, want ConfigMap", cm.Kind)
	}
	out := map[string]Override{}
	for k, v := range cm.Data {
		if !strings.HasPrefix(k, customizationsPrefix) {
			continue
		}
		parts := strings.SplitN(k, ".", 4)
		if len(parts) < 4 {
			continue
		}
		key, err := overrideKey(parts[3])
		if err != nil {
			return nil, fmt.Errorf("data key %s: %w", k, err)
		}
		o := out[key]
		switch parts[2] {
		case "health":
			o.HealthLua = v
		case "useOpenLibs":
			if o.UseOpenLibs, err = strconv.ParseBool(v); err != nil {
				return nil, fmt.Errorf("data key %s: %w", k, err)
			}
		default:
			continue // actions, ignoreDifferences...: not about health
		}
		out[key] = o
	}
	return out, nil
}

// overrideKey is Argo CD's convertToOverrideKey: "<group>_<Kind>" -> "<group>/<Kind>".
func overrideKey(groupKind string) (string, error) {
	parts := strings.Split(groupKind, "_")
	if len(parts) == 2 {
		return parts[0] + "/" + parts[1], nil
	} else if len(parts) == 1 && groupKind != "" {
		return groupKind, nil
	}
	return "", fmt.Errorf("group kind should be <group>_<Kind> or <Kind>, got %q", groupKind)
}

// ResourceHealth is the health Argo CD shows for obj with the given customizations.
func ResourceHealth(obj *unstructured.Unstructured, overrides map[string]Override) (*HealthStatus, error) {
	if obj.GetDeletionTimestamp() != nil && !slices.Contains(obj.GetFinalizers(), hookFinalizer) {
		return &HealthStatus{Status: "Progressing", Message: "Pending deletion"}, nil
	}
	gvk := obj.GroupVersionKind()
	key := gvk.Kind
	if gvk.Group != "" {
		key = gvk.Group + "/" + gvk.Kind
	}
	o, ok := overrides[key]
	if !ok || o.HealthLua == "" {
		return nil, fmt.Errorf("argocd-cm has no health check for %s (key %s.health.%s)", key, customizationsPrefix, strings.ReplaceAll(key, "/", "_"))
	}
	return HealthOfScript(obj, o.HealthLua, o.UseOpenLibs)
}

// HealthOfScript runs a health script on obj in Argo CD's sandbox.
func HealthOfScript(obj *unstructured.Unstructured, script string, useOpenLibs bool) (*HealthStatus, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: !useOpenLibs})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			return nil, err
		}
	}
	l.PreloadModule(lua.OsLibName, safeOsLoader)
	ctx, cancel := context.WithTimeout(context.Background(), scriptTimeout)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("actionParams", l.CreateTable(0, 0))
	l.SetGlobal("obj", decodeValue(l, obj.Object))

	fn, err := l.LoadString(script)
	if err == nil {
		l.Push(fn)
		err = l.PCall(0, lua.MultRet, nil)
	}
	var apiErr *lua.ApiError
	if errors.As(err, &apiErr) && apiErr.Type == lua.ApiErrorRun {
		apiErr.StackTrace = "" // as Argo CD: the message reaches the user without the trace
		err = apiErr
	}
	if err != nil {
		return nil, err
	}

	ret := l.Get(-1)
	switch ret.Type() {
	case lua.LTNil:
		return &HealthStatus{}, nil
	case lua.LTTable:
	default:
		return nil, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	raw, err := luajson.Encode(ret)
	if err != nil {
		return nil, err
	}
	h := &HealthStatus{}
	if err := json.Unmarshal(raw, h); err != nil {
		// an empty table encodes as [] (Argo CD reads that as an empty health status)
		typeErr := &json.UnmarshalTypeError{Value: "array", Type: reflect.TypeFor[*HealthStatus]()}
		if errors.As(err, &typeErr) {
			return &HealthStatus{}, nil
		}
		return nil, err
	}
	if !slices.Contains(validHealth, h.Status) {
		return &HealthStatus{Status: "Unknown", Message: invalidHealthStatus}, nil
	}
	return h, nil
}

// safeOs is gopher-lua's own os.time and os.date, nothing else of os (Argo CD exposes these two).
func safeOs() map[string]lua.LGFunction {
	scratch := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer scratch.Close()
	lua.OpenOs(scratch)
	os := scratch.GetGlobal(lua.OsLibName).(*lua.LTable)
	out := map[string]lua.LGFunction{}
	for _, name := range []string{"time", "date"} {
		out[name] = os.RawGetString(name).(*lua.LFunction).GFunction
	}
	return out
}

// openSafeOs registers the safe functions into the *table* module, as Argo CD's OpenSafeOs does
// (l.RegisterModule(lua.TabLibName, ...)): the global os stays nil; require("os") loads them.
func openSafeOs(l *lua.LState) int {
	l.Push(l.RegisterModule(lua.TabLibName, safeOs()))
	return 1
}

func safeOsLoader(l *lua.LState) int {
	l.Push(l.SetFuncs(l.NewTable(), safeOs()))
	return 1
}

// decodeValue converts an unstructured value into Lua as Argo CD's decodeValue does.
func decodeValue(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case json.Number:
		return lua.LString(v)
	case int:
		return lua.LNumber(v)
	case int32:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case []any:
		arr := l.CreateTable(len(v), 0)
		for _, item := range v {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(v))
		for key, item := range v {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}
