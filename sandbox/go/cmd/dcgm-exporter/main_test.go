package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubelet answers PodResources List over gRPC on a unix socket, as the kubelet does.
type kubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	resp *podresourcesapi.ListPodResourcesResponse
}

func (k *kubelet) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	return k.resp, nil
}

func serve(t *testing.T, resp *podresourcesapi.ListPodResourcesResponse) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	server := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(server, &kubelet{resp: resp})
	go server.Serve(ln)
	t.Cleanup(server.Stop)
	return socket
}

const state = `{"node": "n1", "driver_version": "580.95.05", "cuda_version": "13.0", "gpus": [
 {"index": 0, "uuid": "GPU-a", "name": "NVIDIA L4", "memory_mib": 23034, "bus_id": "00000000:01:00.0", "minor": 0, "health": "healthy", "nvlink_domain": 0},
 {"index": 1, "uuid": "GPU-b", "name": "NVIDIA L4", "memory_mib": 23034, "bus_id": "00000000:02:00.0", "minor": 1, "health": "healthy", "nvlink_domain": 0}]}`

func TestScrapeMapsTheKubeletsAssignmentAndReadsUsage(t *testing.T) {
	dir := t.TempDir()
	statePath := filepath.Join(dir, "gpu-driver.json")
	os.WriteFile(statePath, []byte(state), 0o644)
	usage := filepath.Join(dir, "usage")
	os.MkdirAll(filepath.Join(usage, "GPU-b"), 0o755)
	os.WriteFile(filepath.Join(usage, "GPU-b", "usage.json"), []byte(`{"gpu_util_percent": 64, "fb_used_mib": 100, "until": 4102444800}`), 0o644)
	socket := serve(t, &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Name: "jupyter-alice", Namespace: "hub", Containers: []*podresourcesapi.ContainerResources{
			{Name: "notebook", Devices: []*podresourcesapi.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-b"}}}},
		}},
	}})
	text, err := scrape(context.Background(), statePath, usage, socket)
	if err != nil {
		t.Fatal(err)
	}
	want := `DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pci_bus_id="00000000:02:00.0",device="nvidia1",modelName="NVIDIA L4",Hostname="n1",DCGM_FI_DRIVER_VERSION="580.95.05",container="notebook",namespace="hub",pod="jupyter-alice"} 64`
	if !strings.Contains(text, want+"\n") {
		t.Errorf("missing %s in\n%s", want, text)
	}
	if !strings.Contains(text, `DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="00000000:01:00.0",device="nvidia0",modelName="NVIDIA L4",Hostname="n1",DCGM_FI_DRIVER_VERSION="580.95.05",container="",namespace="",pod=""} 0`+"\n") {
		t.Errorf("GPU-a not idle and free in\n%s", text)
	}
}

func TestScrapeFailsWithoutTheKubelet(t *testing.T) {
	dir := t.TempDir()
	statePath := filepath.Join(dir, "gpu-driver.json")
	os.WriteFile(statePath, []byte(state), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := scrape(ctx, statePath, dir, filepath.Join(dir, "absent.sock"))
	if err == nil || !strings.Contains(err.Error(), "absent.sock") {
		t.Fatalf("want an error naming the socket, got %v", err)
	}
}

func TestBadInvocations(t *testing.T) {
	if code := run(nil); code != 2 {
		t.Errorf("no flags: exit %d, want 2", code)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"gpus": [{"uuid": ""}]}`), 0o644)
	if code := run([]string{"--driver-state=" + bad, "--usage-dir=" + dir, "--listen=127.0.0.1:0"}); code != 1 {
		t.Errorf("invalid driver state: exit %d, want 1", code)
	}
}
