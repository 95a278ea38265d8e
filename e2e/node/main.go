// larch-node: the node half of larch's real-node end-to-end environment, built from the same
// k8s.io/kubernetes module, version and replace block as larch-cp (e2e/controlplane; go.mod is
// written by sync-gomod.sh). A multi-call binary:
//
//	larch-node kubelet    [upstream flags]
//	larch-node kube-proxy [upstream flags]
//	larch-node version
//
// The component can also be chosen by the program name (symlinks called kubelet / kube-proxy).
// One component per process, as upstream builds them (klog flags and feature gates are globals).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/component-base/version"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
)

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s kubelet|kube-proxy|version [flags]\n", filepath.Base(os.Args[0]))
	os.Exit(2)
}

func main() {
	name := filepath.Base(os.Args[0])
	if name != "kubelet" && name != "kube-proxy" {
		if len(os.Args) < 2 {
			usage()
		}
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...) // each component sees its own argv
	}
	switch name {
	case "kubelet": // as k8s.io/kubernetes/cmd/kubelet/kubelet.go
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "kube-proxy": // as k8s.io/kubernetes/cmd/kube-proxy/proxy.go
		os.Exit(cli.Run(proxy.NewProxyCommand()))
	case "version":
		fmt.Printf("kubernetes %s\n", version.Get().GitVersion)
		if bi, ok := debug.ReadBuildInfo(); ok {
			fmt.Printf("go %s\n", bi.GoVersion)
			for _, d := range bi.Deps {
				if d.Path == "k8s.io/kubernetes" || d.Path == "k8s.io/client-go" {
					v := d.Version
					if d.Replace != nil {
						v = d.Replace.Version
					}
					fmt.Printf("%s %s\n", d.Path, v)
				}
			}
		}
	default:
		usage()
	}
}
