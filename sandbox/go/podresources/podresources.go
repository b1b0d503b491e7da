// Package podresources reads which devices the kubelet gave to which
// container, through the kubelet's PodResources API
// (k8s.io/kubelet/pkg/apis/podresources/v1, List) on its local socket: the
// way NVIDIA's DCGM exporter maps GPUs to pods. Anything on a node that needs
// the same mapping (the emulated DCGM exporter, tests comparing it with the
// kubelet's checkpoint) reads it here.
package podresources

import (
	"context"
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is the kubelet's PodResources socket on a node.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Assignment is one container's devices of one resource, as the kubelet reports it.
type Assignment struct {
	Namespace string   `json:"namespace"`
	Pod       string   `json:"pod"`
	Container string   `json:"container"`
	Resource  string   `json:"resource"`
	DeviceIDs []string `json:"device_ids"`
}

// Owner is the container a device is assigned to.
type Owner struct {
	Namespace string
	Pod       string
	Container string
}

// Assignments flattens a List answer into one entry per container and
// resource that has devices, in a stable order. The kubelet lists a
// container's devices of one resource in several entries (one per device or
// NUMA node, with its topology); they are merged here.
func Assignments(resp *podresourcesapi.ListPodResourcesResponse) []Assignment {
	type key struct{ namespace, pod, container, resource string }
	merged := map[key]*Assignment{}
	var out []Assignment
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				if len(d.GetDeviceIds()) == 0 {
					continue
				}
				k := key{pod.GetNamespace(), pod.GetName(), c.GetName(), d.GetResourceName()}
				if merged[k] == nil {
					merged[k] = &Assignment{Namespace: k.namespace, Pod: k.pod, Container: k.container, Resource: k.resource}
				}
				merged[k].DeviceIDs = append(merged[k].DeviceIDs, d.GetDeviceIds()...)
			}
		}
	}
	for _, a := range merged {
		sort.Strings(a.DeviceIDs)
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Pod != b.Pod {
			return a.Pod < b.Pod
		}
		if a.Container != b.Container {
			return a.Container < b.Container
		}
		return a.Resource < b.Resource
	})
	return out
}

// Owners maps each device ID of the resources “keep“ accepts to its container.
func Owners(assignments []Assignment, keep func(resource string) bool) map[string]Owner {
	owners := map[string]Owner{}
	for _, a := range assignments {
		if keep != nil && !keep(a.Resource) {
			continue
		}
		for _, id := range a.DeviceIDs {
			owners[id] = Owner{Namespace: a.Namespace, Pod: a.Pod, Container: a.Container}
		}
	}
	return owners
}

// List asks the kubelet at socket (a unix socket path) for every pod's resources.
func List(ctx context.Context, socket string, timeout time.Duration) ([]Assignment, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("PodResources socket %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, fmt.Errorf("PodResources List on %s: %w", socket, err)
	}
	return Assignments(resp), nil
}
