// Package deviceplugin is the sandbox's NVIDIA device plugin: it speaks the
// kubelet's real device-plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1)
// for GPUs that exist only in a node's emulated driver state.
//
// The logic (which devices a resource has, what Allocate returns, which
// devices GetPreferredAllocation prefers) is in plain functions over data;
// server.go is the thin gRPC and file-watching layer around them.
package deviceplugin

import (
	"encoding/json"
	"fmt"
	"os"
)

// Health values of the emulated driver state (and of a device in ListAndWatch).
const (
	Healthy   = "healthy"
	Unhealthy = "unhealthy"
)

// DriverState is one node's emulated NVIDIA driver: what NVML would report.
// The sandbox writes it (sandbox/gpuspawner_sandbox/gpudriver.py) and changes it to
// inject faults; the plugin re-reads it whenever it changes. Its device
// fields (minor numbers, UUIDs, MIG layout) are what a CDI spec for the node
// is generated from.
type DriverState struct {
	Node          string `json:"node"`
	DriverVersion string `json:"driver_version"`
	CUDAVersion   string `json:"cuda_version"`
	GPUs          []GPU  `json:"gpus"`
}

// GPU is one emulated physical GPU.
type GPU struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Name      string `json:"name"`
	MemoryMiB int    `json:"memory_mib"`
	BusID     string `json:"bus_id"`
	// Minor is N of the device node /dev/nvidiaN.
	Minor  int    `json:"minor"`
	Health string `json:"health"`
	// NVLinkDomain: GPUs with the same number share an NVLink/NVSwitch fabric.
	NVLinkDomain int   `json:"nvlink_domain"`
	MIG          []MIG `json:"mig,omitempty"`
}

// MIG is one MIG device (GPU instance + compute instance) of a GPU.
type MIG struct {
	Index     int    `json:"index"`
	UUID      string `json:"uuid"`
	Profile   string `json:"profile"`
	MemoryMiB int    `json:"memory_mib"`
	GI        int    `json:"gi"`
	CI        int    `json:"ci"`
	Health    string `json:"health"`
}

// ParseDriverState validates a driver state document.
func ParseDriverState(data []byte) (*DriverState, error) {
	var s DriverState
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	seen := map[string]bool{}
	check := func(uuid, health, what string) error {
		if uuid == "" {
			return fmt.Errorf("%s has no uuid", what)
		}
		if seen[uuid] {
			return fmt.Errorf("uuid %s appears twice", uuid)
		}
		seen[uuid] = true
		if health != Healthy && health != Unhealthy {
			return fmt.Errorf("%s (%s) has health %q; expected %q or %q", what, uuid, health, Healthy, Unhealthy)
		}
		return nil
	}
	for _, g := range s.GPUs {
		if err := check(g.UUID, g.Health, fmt.Sprintf("GPU %d", g.Index)); err != nil {
			return nil, err
		}
		for _, m := range g.MIG {
			if err := check(m.UUID, m.Health, fmt.Sprintf("MIG device %d of GPU %d", m.Index, g.Index)); err != nil {
				return nil, err
			}
			if m.Profile == "" {
				return nil, fmt.Errorf("MIG device %s has no profile", m.UUID)
			}
		}
	}
	return &s, nil
}

// LoadDriverState reads and validates a driver state file.
func LoadDriverState(path string) (*DriverState, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := ParseDriverState(data)
	if err != nil {
		return nil, fmt.Errorf("driver state %s: %w", path, err)
	}
	return s, nil
}
