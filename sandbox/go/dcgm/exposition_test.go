package dcgm

import (
	"os"
	"strings"
	"testing"

	"gpuspawner/sandbox/k8s/deviceplugin"
	"gpuspawner/sandbox/k8s/gpuusage"
	"gpuspawner/sandbox/k8s/podresources"
)

// The recorded exporter scrape (hand-assembled from NVIDIA's sources; see its README).
const sample = "../../../tests/fixtures/dcgm/exporter-sample.prom"

// The node of the sample: two whole A100s and, on a third, MIG instance 7 (1g.10gb).
// Memory totals are what the sample's free + used add up to.
func sampleNode() *deviceplugin.DriverState {
	return &deviceplugin.DriverState{
		Node:          "gpu-a100-0",
		DriverVersion: "580.95.05",
		GPUs: []deviceplugin.GPU{
			{Index: 0, UUID: "GPU-5d6e1f2a-8c3b-4a7e-9f10-2b3c4d5e6f70", Name: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81037, BusID: "00000000:07:00.0", Minor: 0, Health: deviceplugin.Healthy},
			{Index: 1, UUID: "GPU-9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", Name: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81037, BusID: "00000000:0F:00.0", Minor: 1, Health: deviceplugin.Healthy},
			{Index: 2, UUID: "GPU-3e2d1c0b-a9f8-4e7d-b6c5-a4b3c2d1e0f9", Name: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, BusID: "00000000:47:00.0", Minor: 2, Health: deviceplugin.Healthy,
				MIG: []deviceplugin.MIG{{Index: 0, UUID: "MIG-0b1c2d3e-4f50-5a6b-8c7d-9e0f1a2b3c4d", Profile: "1g.10gb", MemoryMiB: 9613, GI: 7, CI: 0, Health: deviceplugin.Healthy}}},
		},
	}
}

func sampleOwners() map[string]podresources.Owner {
	assignments := []podresources.Assignment{
		{Namespace: "jupyterhub", Pod: "jupyter-alice", Container: "notebook", Resource: "nvidia.com/gpu", DeviceIDs: []string{"GPU-5d6e1f2a-8c3b-4a7e-9f10-2b3c4d5e6f70"}},
		{Namespace: "jupyterhub", Pod: "jupyter-bob", Container: "notebook", Resource: "nvidia.com/mig-1g.10gb", DeviceIDs: []string{"MIG-0b1c2d3e-4f50-5a6b-8c7d-9e0f1a2b3c4d"}},
		// Not a GPU: never mapped.
		{Namespace: "other", Pod: "nic-user", Container: "main", Resource: "example.com/nic", DeviceIDs: []string{"GPU-9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"}},
	}
	return podresources.Owners(assignments, IsGPUResource)
}

func usageOf(m map[string]gpuusage.Usage) func(string) gpuusage.Usage {
	return func(uuid string) gpuusage.Usage { return m[uuid] }
}

// blocks splits an exposition into metric name -> its lines (HELP, TYPE, series).
func blocks(t *testing.T, text string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		var name string
		if strings.HasPrefix(line, "# ") {
			name = strings.Fields(line)[2]
		} else {
			name = line[:strings.IndexAny(line, "{ ")]
		}
		out[name] = append(out[name], line)
	}
	return out
}

func TestRenderMatchesTheExportersFormatLabelsAndValues(t *testing.T) {
	data, err := os.ReadFile(sample)
	if err != nil {
		t.Fatal(err)
	}
	want := blocks(t, string(data))
	usage := usageOf(map[string]gpuusage.Usage{
		"GPU-5d6e1f2a-8c3b-4a7e-9f10-2b3c4d5e6f70": {UtilPercent: 0, FBUsedMiB: 480},
		// The MIG instance's figures are its own.
		"MIG-0b1c2d3e-4f50-5a6b-8c7d-9e0f1a2b3c4d": {UtilPercent: 0, FBUsedMiB: 13},
	})
	got := blocks(t, Render(Devices(sampleNode(), sampleOwners(), usage)))
	if len(got) != len(Fields) {
		t.Fatalf("served %d metrics, want %d: %v", len(got), len(Fields), got)
	}
	for _, f := range Fields {
		if strings.Join(got[f.Name], "\n") != strings.Join(want[f.Name], "\n") {
			t.Errorf("%s:\n got:\n%s\nwant (recorded):\n%s", f.Name, strings.Join(got[f.Name], "\n"), strings.Join(want[f.Name], "\n"))
		}
	}
}

func TestUtilisationReachesOnlyItsDevice(t *testing.T) {
	usage := usageOf(map[string]gpuusage.Usage{
		"GPU-9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d": {UtilPercent: 87, FBUsedMiB: 1000},
		"MIG-0b1c2d3e-4f50-5a6b-8c7d-9e0f1a2b3c4d": {UtilPercent: 40, FBUsedMiB: 20000},
		// The parent of MIG devices: never given to a container whole, so not read.
		"GPU-3e2d1c0b-a9f8-4e7d-b6c5-a4b3c2d1e0f9": {UtilPercent: 99, FBUsedMiB: 1},
	})
	got := blocks(t, Render(Devices(sampleNode(), nil, usage)))
	util := got["DCGM_FI_DEV_GPU_UTIL"][2:]
	if len(util) != 2 || !strings.HasSuffix(util[0], "} 0") || !strings.HasSuffix(util[1], "} 87") {
		t.Errorf("GPU_UTIL: %v", util)
	}
	engine := got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][2:]
	if len(engine) != 3 || !strings.HasSuffix(engine[1], "} 0.870000") || !strings.HasSuffix(engine[2], "} 0.400000") {
		t.Errorf("GR_ENGINE_ACTIVE: %v", engine)
	}
	// A MIG device's reported use is capped at its own memory.
	used := got["DCGM_FI_DEV_FB_USED"][2:]
	free := got["DCGM_FI_DEV_FB_FREE"][2:]
	if !strings.HasSuffix(used[2], "} 9613") || !strings.HasSuffix(free[2], "} 0") || !strings.HasSuffix(free[1], "} 80037") {
		t.Errorf("FB: used %v free %v", used, free)
	}
	// No owners: every device has empty pod labels.
	for _, line := range used {
		if !strings.Contains(line, `container="",namespace="",pod=""}`) {
			t.Errorf("unowned device with pod labels: %s", line)
		}
	}
}

func TestLabelValuesAreEscaped(t *testing.T) {
	state := &deviceplugin.DriverState{Node: `a"b\c`, GPUs: []deviceplugin.GPU{{UUID: "GPU-x", Name: "x\ny", Health: deviceplugin.Healthy}}}
	text := Render(Devices(state, nil, usageOf(nil)))
	if !strings.Contains(text, `modelName="x\ny",Hostname="a\"b\\c"`) {
		t.Errorf("not escaped: %s", text)
	}
}

func TestIsGPUResource(t *testing.T) {
	for r, want := range map[string]bool{"nvidia.com/gpu": true, "nvidia.com/mig-1g.10gb": true, "nvidia.com/gpu.shared": false, "example.com/gpu": false} {
		if IsGPUResource(r) != want {
			t.Errorf("%s: want %v", r, want)
		}
	}
}
