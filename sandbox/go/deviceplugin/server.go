package deviceplugin

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// resourcePlugin serves one extended resource on its own socket, as NVIDIA's
// plugin runs one server per resource.
type resourcePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	resource   string
	strategies []string
	socket     string

	mu      sync.Mutex
	devices []Device
	changed chan struct{} // closed (and replaced) whenever devices change
	server  *grpc.Server
}

func (p *resourcePlugin) current() ([]Device, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices, p.changed
}

// update replaces the device list and wakes every ListAndWatch stream.
func (p *resourcePlugin) update(devices []Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = devices
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *resourcePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *resourcePlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		devices, changed := p.current()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: APIDevices(devices)}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (p *resourcePlugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	devices, _ := p.current()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, r := range req.ContainerRequests {
		ids := PreferredAllocation(devices, r.AvailableDeviceIDs, r.MustIncludeDeviceIDs, int(r.AllocationSize))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (p *resourcePlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	devices, _ := p.current()
	resp := &pluginapi.AllocateResponse{}
	for _, r := range req.ContainerRequests {
		if err := CheckKnown(p.resource, devices, r.DevicesIds); err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, ContainerResponse(r.DevicesIds, p.strategies, newResponseID()))
		log.Printf("%s: allocated %v", p.resource, r.DevicesIds)
	}
	return resp, nil
}

func (p *resourcePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func newResponseID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// serve (re)creates the plugin's socket and serves on it.
func (p *resourcePlugin) serve() error {
	if err := os.Remove(p.socket); err != nil && !os.IsNotExist(err) {
		return err
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return err
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func(s *grpc.Server) { _ = s.Serve(lis) }(p.server)
	return nil
}

func (p *resourcePlugin) stop() {
	if p.server != nil {
		p.server.Stop()
		p.server = nil
	}
	_ = os.Remove(p.socket)
}

// register announces the plugin to the kubelet over kubelet.sock.
func (p *resourcePlugin) register(kubeletSocket string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.resource,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

// fileID identifies a file's incarnation: a re-created socket has a new inode.
func fileID(path string) (uint64, bool) {
	info, err := os.Stat(path)
	if err != nil {
		return 0, false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ino, true
}

// Main runs the plugin: `k8s device-plugin --driver-state FILE [flags]`.
func Main(args []string) int {
	fs := flag.NewFlagSet("device-plugin", flag.ContinueOnError)
	statePath := fs.String("driver-state", "", "the node's emulated driver state (JSON; required)")
	pluginDir := fs.String("plugin-dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	migStrategy := fs.String("mig-strategy", MIGNone, "none, single or mixed, as NVIDIA's plugin")
	listStrategy := fs.String("device-list-strategy", StrategyEnvvar, "comma-separated: envvar, cdi-annotations, cdi-cri")
	poll := fs.Duration("poll-interval", 250*time.Millisecond, "how often kubelet.sock and the driver state are checked")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log.SetPrefix("device-plugin: ")
	if *statePath == "" {
		log.Print("--driver-state is required")
		return 2
	}
	strategies, err := ParseStrategies(*listStrategy)
	if err != nil {
		log.Print(err)
		return 2
	}
	raw, err := os.ReadFile(*statePath)
	if err != nil {
		log.Print(err)
		return 1
	}
	state, err := ParseDriverState(raw)
	if err != nil {
		log.Printf("driver state %s: %v", *statePath, err)
		return 1
	}
	resources, err := Resources(state, *migStrategy)
	if err != nil {
		log.Print(err)
		return 1
	}
	if len(resources) == 0 {
		log.Print("the driver state has no GPUs: nothing to advertise")
		return 1
	}
	var plugins []*resourcePlugin
	var names []string
	for name := range resources {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		plugins = append(plugins, &resourcePlugin{
			resource:   name,
			strategies: strategies,
			socket:     filepath.Join(*pluginDir, SocketName(name)),
			devices:    resources[name],
			changed:    make(chan struct{}),
		})
	}

	kubeletSocket := filepath.Join(*pluginDir, filepath.Base(pluginapi.KubeletSocket))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	defer func() {
		for _, p := range plugins {
			p.stop()
		}
	}()

	var registeredWith uint64 // kubelet.sock's inode when we last registered; 0: not registered
	tick := time.NewTicker(*poll)
	defer tick.Stop()
	for {
		// The kubelet re-creates kubelet.sock when it restarts and deletes
		// every other socket in the directory: then serve afresh and register again.
		kubeletID, kubeletUp := fileID(kubeletSocket)
		ours := true
		for _, p := range plugins {
			if _, ok := fileID(p.socket); !ok {
				ours = false
			}
		}
		if kubeletUp && (kubeletID != registeredWith || !ours) {
			registeredWith = 0
			ok := true
			for _, p := range plugins {
				p.stop()
				if err := p.serve(); err != nil {
					log.Printf("%s: cannot serve on %s: %v", p.resource, p.socket, err)
					ok = false
					break
				}
				if err := p.register(kubeletSocket); err != nil {
					log.Printf("%s: registration with the kubelet failed (will retry): %v", p.resource, err)
					ok = false
					break
				}
				devices, _ := p.current()
				log.Printf("%s: registered with the kubelet, %d device(s), serving %s", p.resource, len(devices), p.socket)
			}
			if ok {
				registeredWith = kubeletID
			}
		}

		// Health (and any other change) of the emulated driver reaches the kubelet at once.
		if now, err := os.ReadFile(*statePath); err == nil && !bytes.Equal(now, raw) {
			raw = now
			if s, err := ParseDriverState(now); err != nil {
				log.Printf("driver state %s: %v (keeping the last good state)", *statePath, err)
			} else if r, err := Resources(s, *migStrategy); err != nil {
				log.Printf("driver state %s: %v (keeping the last good state)", *statePath, err)
			} else {
				for _, p := range plugins {
					p.update(r[p.resource])
					log.Printf("%s: driver state changed: %s", p.resource, describe(r[p.resource]))
				}
			}
		}

		select {
		case sig := <-stop:
			log.Printf("%s received, stopping", sig)
			return 0
		case <-tick.C:
		}
	}
}

func describe(devices []Device) string {
	healthy := 0
	for _, d := range devices {
		if d.Healthy {
			healthy++
		}
	}
	return fmt.Sprintf("%d device(s), %d healthy", len(devices), healthy)
}
