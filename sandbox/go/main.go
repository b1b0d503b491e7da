// Command k8s is the gpuspawner sandbox's control plane in one binary.
//
// The first argument picks the component; the rest are that component's own
// flags, exactly as the upstream binaries take them:
//
//	k8s etcd --data-dir DIR --client-port P --peer-port P
//	k8s kube-apiserver ...
//	k8s kube-scheduler ...
//	k8s kube-controller-manager ...
//	k8s kubelet ...
//	k8s kube-proxy ...
//	k8s device-plugin --driver-state FILE ...
//
// One binary shares the (long) compile of everything the Kubernetes
// commands have in common (the device plugin reuses the kubelet's gRPC and
// device-plugin API packages, so adding it costs a relink). Each component
// still runs as its own process: they register global feature gates, flags
// and signal handlers, which must not mix.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
	_ "time/tzdata" // CronJob time zones, as upstream's binaries do

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeproxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	"gpuspawner/sandbox/k8s/deviceplugin"
)

const usage = "usage: k8s etcd|kube-apiserver|kube-scheduler|kube-controller-manager|kubelet|kube-proxy|device-plugin [flags]"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "etcd":
		os.Exit(runEtcd(os.Args[2:]))
	case "kube-apiserver":
		os.Exit(runCobra(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(runCobra(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(runCobra(controllermanager.NewControllerManagerCommand()))
	case "kubelet":
		os.Exit(runCobra(kubelet.NewKubeletCommand(context.Background())))
	case "kube-proxy":
		os.Exit(runCobra(kubeproxy.NewProxyCommand()))
	case "device-plugin":
		os.Exit(deviceplugin.Main(os.Args[2:]))
	default:
		fmt.Fprintf(os.Stderr, "unknown component %q\n%s\n", os.Args[1], usage)
		os.Exit(2)
	}
}

// runCobra runs an upstream command on the arguments after the component name
// (cobra would otherwise read os.Args[1:], i.e. the component name itself).
func runCobra(cmd *cobra.Command) int {
	cmd.SetArgs(os.Args[2:])
	return cli.Run(cmd)
}

// runEtcd runs a single-member etcd embedded in this process, on loopback only.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "directory for etcd's data (required)")
	host := fs.String("host", "127.0.0.1", "loopback address to listen on")
	clientPort := fs.Int("client-port", 2379, "port for clients (the API server)")
	peerPort := fs.Int("peer-port", 2380, "port for peers (none join; etcd still listens)")
	noFsync := fs.Bool("unsafe-no-fsync", false, "skip fsync: faster, loses data on a crash (fine for a throwaway sandbox)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	// Refuse anything that is not loopback: the sandbox must never listen
	// on a routable interface.
	if !isLoopback(*host) {
		fmt.Fprintf(os.Stderr, "etcd: --host %s is not a loopback address\n", *host)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Name = "sandbox"
	cfg.Dir = *dataDir
	client := url.URL{Scheme: "http", Host: *host + ":" + strconv.Itoa(*clientPort)}
	peer := url.URL{Scheme: "http", Host: *host + ":" + strconv.Itoa(*peerPort)}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = *noFsync
	cfg.LogOutputs = []string{"stderr"}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: cannot start: %v\n", err)
		return 1
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", client.String())
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: failed while starting: %v\n", err)
		return 1
	case <-time.After(120 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 120s")
		return 1
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case sig := <-stop:
		fmt.Fprintf(os.Stderr, "etcd: %s received, stopping\n", sig)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	var a, b, c, d int
	n, err := fmt.Sscanf(host, "%d.%d.%d.%d", &a, &b, &c, &d)
	return err == nil && n == 4 && a == 127
}
