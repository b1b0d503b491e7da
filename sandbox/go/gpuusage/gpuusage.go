// Package gpuusage reads what workloads report about one emulated GPU: the
// file usage/<UUID>/usage.json of a node's emulated driver (layout in
// sandbox/gpuspawner_sandbox/gpudriver.py). A workload in a container given
// the GPU writes it; the emulated DCGM exporter reads it on the node.
package gpuusage

import (
	"encoding/json"
	"os"
	"path/filepath"
	"time"
)

// FileName is the usage file's name inside usage/<UUID>/.
const FileName = "usage.json"

// Usage is one device's utilisation and framebuffer memory in use.
type Usage struct {
	UtilPercent int
	FBUsedMiB   int
}

type document struct {
	GPUUtilPercent *float64 `json:"gpu_util_percent"`
	FBUsedMiB      *float64 `json:"fb_used_mib"`
	Until          *float64 `json:"until"`
}

// Parse reads a usage document at time now. It counts only while now < until
// (a dead workload's figures expire); an expired, malformed or partial
// document is an idle device (zero), as a GPU nobody uses is.
func Parse(data []byte, now time.Time) Usage {
	var d document
	if err := json.Unmarshal(data, &d); err != nil || d.Until == nil {
		return Usage{}
	}
	if float64(now.UnixNano())/1e9 >= *d.Until {
		return Usage{}
	}
	u := Usage{}
	if d.GPUUtilPercent != nil {
		u.UtilPercent = int(clamp(*d.GPUUtilPercent, 0, 100) + 0.5)
	}
	if d.FBUsedMiB != nil {
		u.FBUsedMiB = int(clamp(*d.FBUsedMiB, 0, 1<<40))
	}
	return u
}

// Read reads <dir>/<uuid>/usage.json; a missing or unreadable file is idle.
func Read(dir, uuid string, now time.Time) Usage {
	data, err := os.ReadFile(filepath.Join(dir, uuid, FileName))
	if err != nil {
		return Usage{}
	}
	return Parse(data, now)
}

func clamp(v, lo, hi float64) float64 {
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}
