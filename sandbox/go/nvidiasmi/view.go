// Package nvidiasmi is the sandbox's emulated nvidia-smi: the real tool's output
// formats (recorded in tests/fixtures/nvidia-smi) over the GPUs of one
// container, as the node's emulated driver describes them.
//
// The emulated driver (sandbox/gpuspawner_sandbox/gpudriver.py) writes, per
// node, projections that NVIDIA's container runtime mounts into a container
// (the CDI spec decides which):
//
//	<view root>/driver/driver.json      driver version, CUDA version, loaded
//	<view root>/gpus/<UUID>/gpu.json    one GPU, with its faults as effects
//	<view root>/usage/<UUID>/usage.json what workloads report (utilisation, memory)
//
// A container sees a GPU when both its view directory is mounted and its
// device node /dev/nvidia<minor> exists, as the real nvidia-smi sees the
// devices injected through /dev. It sees a MIG device of that GPU when, in
// addition, both of the MIG device's capability nodes exist:
// /dev/nvidia-caps/nvidia-cap<gi_cap_minor> (the GPU instance) and
// /dev/nvidia-caps/nvidia-cap<ci_cap_minor> (the compute instance), the
// minors the driver lists in /proc/driver/nvidia-caps/mig-minors and
// gpu.json records. Nothing else is read, so there is no global state to leak.
//
// The logic (Render, Run) takes data and returns text and an exit code;
// load.go is the thin file layer.
package nvidiasmi

// Driver is the driver's document (driver.json).
type Driver struct {
	Node          string `json:"node"`
	DriverVersion string `json:"driver_version"`
	CUDAVersion   string `json:"cuda_version"`
	Loaded        bool   `json:"loaded"`
}

// MIG is one MIG device of a GPU, with its profile's figures.
type MIG struct {
	Index           int    `json:"index"`
	UUID            string `json:"uuid"`
	Profile         string `json:"profile"`
	MemoryMiB       int    `json:"memory_mib"`
	GI              int    `json:"gi"`
	CI              int    `json:"ci"`
	GICapMinor      int    `json:"gi_cap_minor"`
	CICapMinor      int    `json:"ci_cap_minor"`
	Multiprocessors int    `json:"multiprocessors"`
	Bar1MiB         int    `json:"bar1_mib"`
	CopyEngines     int    `json:"copy_engines"`
	Decoders        int    `json:"decoders"`
	Encoders        int    `json:"encoders"`
	JPEG            int    `json:"jpeg"`
	OFA             int    `json:"ofa"`
}

// Usage is what the workloads on a GPU report (usage.json); it counts only
// while now < Until.
type Usage struct {
	GPUUtilPercent int     `json:"gpu_util_percent"`
	FBUsedMiB      int     `json:"fb_used_mib"`
	Until          float64 `json:"until"`
}

// GPU is one GPU's document (gpu.json) plus, once loaded, its usage.
type GPU struct {
	Index       int    `json:"index"` // the node's index; Render numbers what the container sees
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryMiB   int    `json:"memory_mib"`
	BusID       string `json:"bus_id"`
	Minor       int    `json:"minor"`
	Serial      string `json:"serial"`
	PCIDeviceID string `json:"pci_device_id"`
	ComputeCap  string `json:"compute_cap"`
	ECC         bool   `json:"ecc"`
	IdlePowerW  int    `json:"idle_power_w"`
	PowerCapW   int    `json:"power_cap_w"`
	MIGEnabled  bool   `json:"mig_enabled"`
	MIG         []MIG  `json:"mig"`
	// Fault effects, as the driver projects them.
	Missing                   bool `json:"missing"`
	Lost                      bool `json:"lost"`
	ECCErrorsUncorrected      int  `json:"ecc_errors_uncorrected"`
	RemappedRowsUncorrectable int  `json:"remapped_rows_uncorrectable"`
	RemappedRowsPending       bool `json:"remapped_rows_pending"`

	Usage  Usage `json:"-"`
	Number int   `json:"-"` // its index as the container sees it (Run numbers them)
}

// View is what one container's nvidia-smi sees. A nil Driver means no driver
// was found (its view is not mounted): the driver is not loaded.
type View struct {
	Driver *Driver
	GPUs   []GPU // visible GPUs in PCI order, with only their visible MIG devices
}
