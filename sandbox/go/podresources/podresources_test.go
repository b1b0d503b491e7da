package podresources

import (
	"reflect"
	"strings"
	"testing"

	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func response() *podresourcesapi.ListPodResourcesResponse {
	return &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Name: "jupyter-bob", Namespace: "hub", Containers: []*podresourcesapi.ContainerResources{
			{Name: "notebook", Devices: []*podresourcesapi.ContainerDevices{
				{ResourceName: "nvidia.com/mig-1g.10gb", DeviceIds: []string{"MIG-b"}},
			}},
		}},
		{Name: "jupyter-alice", Namespace: "hub", Containers: []*podresourcesapi.ContainerResources{
			{Name: "init", Devices: nil},
			{Name: "notebook", Devices: []*podresourcesapi.ContainerDevices{
				// The kubelet lists each device (NUMA node) in its own entry.
				{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-c"}},
				{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-a"}},
				{ResourceName: "example.com/nic", DeviceIds: []string{"nic0"}},
			}},
		}},
		{Name: "cpu-only", Namespace: "default", Containers: []*podresourcesapi.ContainerResources{{Name: "main"}}},
	}}
}

func TestAssignmentsAreOnePerContainerAndResourceSorted(t *testing.T) {
	got := Assignments(response())
	want := []Assignment{
		{"hub", "jupyter-alice", "notebook", "example.com/nic", []string{"nic0"}},
		{"hub", "jupyter-alice", "notebook", "nvidia.com/gpu", []string{"GPU-a", "GPU-c"}},
		{"hub", "jupyter-bob", "notebook", "nvidia.com/mig-1g.10gb", []string{"MIG-b"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestOwnersKeepsOnlyTheAcceptedResources(t *testing.T) {
	owners := Owners(Assignments(response()), func(r string) bool { return strings.HasPrefix(r, "nvidia.com/") })
	want := map[string]Owner{
		"GPU-a": {"hub", "jupyter-alice", "notebook"},
		"GPU-c": {"hub", "jupyter-alice", "notebook"},
		"MIG-b": {"hub", "jupyter-bob", "notebook"},
	}
	if !reflect.DeepEqual(owners, want) {
		t.Fatalf("got %+v, want %+v", owners, want)
	}
}
