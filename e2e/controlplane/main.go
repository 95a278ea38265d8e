// larch-cp: one multi-call binary holding the Kubernetes control plane for larch's end-to-end
// tests, built from the k8s.io/kubernetes Go module (no binary downloads needed).
//
//	larch-cp etcd --data-dir=DIR --listen-client-url=http://127.0.0.1:P --listen-peer-url=http://127.0.0.1:Q
//	larch-cp kube-apiserver          [upstream flags]
//	larch-cp kube-controller-manager [upstream flags]
//	larch-cp kube-scheduler          [upstream flags]
//	larch-cp kubectl                 [upstream args]
//	larch-cp version
//
// The component can also be chosen by the program name (a symlink called kubectl works).
// Run each component as its own process: klog flags and the default feature gate are process
// globals, so several components in one process would interfere.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"
	_ "time/tzdata" // CronJob time zone support (as in the upstream kube-apiserver/KCM mains)

	"go.etcd.io/etcd/server/v3/embed"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl: client auth plugins
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/component-base/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var components = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "version"}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s COMPONENT [flags]\ncomponents: %v\n", filepath.Base(os.Args[0]), components)
	os.Exit(2)
}

func main() {
	name := filepath.Base(os.Args[0])
	if !known(name) {
		if len(os.Args) < 2 {
			usage()
		}
		name = os.Args[1]
		// Shift so that each component sees os.Args as if it were its own binary
		// (cobra reads os.Args[1:], kubectl's plugin lookup reads os.Args too).
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	switch name {
	case "etcd":
		os.Exit(runEtcd(os.Args[1:]))
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(kcm.NewControllerManagerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kubectl":
		// as k8s.io/kubernetes/cmd/kubectl/kubectl.go
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
		command := kubectlcmd.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(command); err != nil {
			kubectlutil.CheckErr(err)
		}
	case "version":
		printVersion()
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "unknown component %q\n", name)
		usage()
	}
}

func known(name string) bool {
	for _, c := range components {
		if c == name && c != "version" {
			return true
		}
	}
	return false
}

func printVersion() {
	fmt.Printf("kubernetes %s\n", version.Get().GitVersion)
	if bi, ok := debug.ReadBuildInfo(); ok {
		fmt.Printf("go %s\n", bi.GoVersion)
		for _, d := range bi.Deps {
			switch d.Path {
			case "k8s.io/kubernetes", "go.etcd.io/etcd/server/v3", "k8s.io/client-go":
				v := d.Version
				if d.Replace != nil {
					v = d.Replace.Version
				}
				fmt.Printf("%s %s\n", d.Path, v)
			}
		}
	}
}

// runEtcd starts a single-member embedded etcd (same etcd version as k8s.io/kubernetes pins, so
// no client/server skew) and serves until SIGINT/SIGTERM. fsync is disabled: test data only.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory (required)")
	clientURL := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL to listen on and advertise")
	peerURL := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL to listen on and advertise")
	name := fs.String("name", "larch", "member name")
	logLevel := fs.String("log-level", "warn", "debug|info|warn|error")
	quota := fs.Int64("quota-backend-bytes", 2<<30, "backend size quota")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cu, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-client-url: %v\n", err)
		return 2
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-peer-url: %v\n", err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	cfg.QuotaBackendBytes = *quota
	cfg.LogLevel = *logLevel
	cfg.LogOutputs = []string{"stderr"}
	cfg.ListenMetricsUrls = nil

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", cu)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
		fmt.Fprintln(os.Stderr, "etcd: shutting down")
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
