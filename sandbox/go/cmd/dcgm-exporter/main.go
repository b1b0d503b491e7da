// Command dcgm-exporter is the sandbox's emulated NVIDIA DCGM exporter for
// one GPU node (package gpuspawner/sandbox/k8s/dcgm). It runs beside the
// node's kubelet, in the node's mount namespace, and serves /metrics as
// dcgm-exporter does:
//
//	dcgm-exporter --driver-state FILE --usage-dir DIR --listen IP:PORT
//	              [--pod-resources-socket SOCK]
//	dcgm-exporter --list-pod-resources [--pod-resources-socket SOCK]
//
// Each scrape reads the driver state, the usage files and the kubelet's
// PodResources List afresh, so it always shows the node as it is now. The
// second form prints the PodResources List as JSON (one entry per container
// and resource) and exits, for comparing it with other views of the node.
//
// It is its own small static binary, not a component of the k8s multi-call
// binary, so that changing it never relinks Kubernetes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"gpuspawner/sandbox/k8s/dcgm"
	"gpuspawner/sandbox/k8s/deviceplugin"
	"gpuspawner/sandbox/k8s/gpuusage"
	"gpuspawner/sandbox/k8s/podresources"
)

const listTimeout = 5 * time.Second

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("dcgm-exporter", flag.ContinueOnError)
	driverState := fs.String("driver-state", "", "the node's emulated driver state (gpu-driver.json)")
	usageDir := fs.String("usage-dir", "", "the emulated driver's usage directory (usage/<UUID>/usage.json)")
	socket := fs.String("pod-resources-socket", podresources.DefaultSocket, "the kubelet's PodResources socket")
	listen := fs.String("listen", "", "address to serve /metrics on (IP:PORT)")
	list := fs.Bool("list-pod-resources", false, "print the kubelet's PodResources List as JSON and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *list {
		assignments, err := podresources.List(context.Background(), *socket, listTimeout)
		if err != nil {
			fmt.Fprintf(os.Stderr, "dcgm-exporter: %v\n", err)
			return 1
		}
		if assignments == nil {
			assignments = []podresources.Assignment{}
		}
		out, _ := json.MarshalIndent(assignments, "", "  ")
		fmt.Println(string(out))
		return 0
	}
	if *driverState == "" || *usageDir == "" || *listen == "" {
		fmt.Fprintln(os.Stderr, "dcgm-exporter: --driver-state, --usage-dir and --listen are required (or --list-pod-resources).")
		return 2
	}
	if _, err := deviceplugin.LoadDriverState(*driverState); err != nil {
		fmt.Fprintf(os.Stderr, "dcgm-exporter: %v\n", err)
		return 1
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dcgm-exporter: cannot listen on %s: %v\n", *listen, err)
		return 1
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		text, err := scrape(r.Context(), *driverState, *usageDir, *socket)
		if err != nil {
			// The target shows as down (up=0) rather than serving GPUs
			// without their pods, which the culler would read as idle pods'.
			log.Printf("scrape: %v", err)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprint(w, text)
	})
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("serving DCGM metrics for %s on http://%s/metrics", *driverState, ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		server.Shutdown(shutdown)
	}()
	if err := server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(os.Stderr, "dcgm-exporter: %v\n", err)
		return 1
	}
	return 0
}

// scrape reads the node as it is now and renders it.
func scrape(ctx context.Context, driverState, usageDir, socket string) (string, error) {
	state, err := deviceplugin.LoadDriverState(driverState)
	if err != nil {
		return "", err
	}
	assignments, err := podresources.List(ctx, socket, listTimeout)
	if err != nil {
		return "", err
	}
	now := time.Now()
	usage := func(uuid string) gpuusage.Usage { return gpuusage.Read(usageDir, uuid, now) }
	return dcgm.Render(dcgm.Devices(state, podresources.Owners(assignments, dcgm.IsGPUResource), usage)), nil
}
