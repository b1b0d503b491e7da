// Package dcgm is the sandbox's emulated NVIDIA DCGM exporter: what
// dcgm-exporter serves on /metrics, for GPUs that exist only in a node's
// emulated driver.
//
// The series, their help texts and label sets are those of dcgm-exporter
// (recorded in tests/fixtures/dcgm): one series per whole GPU, or per MIG
// instance on a GPU with MIG devices (those carry GPU_I_PROFILE and GPU_I_ID
// and have no DCGM_FI_DEV_GPU_UTIL, as NVML reports no utilisation per MIG
// device), and the container, namespace and pod holding the device (empty
// when none does), from the kubelet's PodResources API. Static facts come
// from the driver state (deviceplugin.DriverState); utilisation and
// framebuffer use from what workloads write (gpuusage: per whole GPU, or per
// MIG device for its instance). Only fields with a
// source are served: power draw and memory-copy utilisation have none here.
//
// Everything in this file is pure: data in, exposition text out.
package dcgm

import (
	"fmt"
	"strconv"
	"strings"

	"gpuspawner/sandbox/k8s/deviceplugin"
	"gpuspawner/sandbox/k8s/gpuusage"
	"gpuspawner/sandbox/k8s/podresources"
)

// Label is one name="value" pair; dcgm-exporter's order is kept.
type Label struct {
	Name, Value string
}

// Device is one entity dcgm-exporter reports: a whole GPU or a MIG instance.
type Device struct {
	Labels    []Label
	MIG       bool
	MemoryMiB int
	Usage     gpuusage.Usage
}

// Field is one DCGM field as dcgm-exporter serves it.
type Field struct {
	Name, Type, Help string
	// WholeGPUOnly: not reported for MIG instances.
	WholeGPUOnly bool
	Value        func(Device) string
}

// Fields are served in this order, with dcgm-exporter's help texts
// (etc/default-counters.csv, etc/dcp-metrics-included.csv).
var Fields = []Field{
	{"DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", true,
		func(d Device) string { return strconv.Itoa(d.Usage.UtilPercent) }},
	{"DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", false,
		func(d Device) string { return strconv.Itoa(d.MemoryMiB - usedMiB(d)) }},
	{"DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", false,
		func(d Device) string { return strconv.Itoa(usedMiB(d)) }},
	{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", false,
		func(d Device) string { return fmt.Sprintf("%.6f", float64(d.Usage.UtilPercent)/100) }},
}

// IsGPUResource says whether a kubelet resource name is one of NVIDIA's
// device plugin (nvidia.com/gpu, nvidia.com/mig-<profile>), the resources
// whose devices dcgm-exporter maps to pods.
func IsGPUResource(resource string) bool {
	return resource == "nvidia.com/gpu" || strings.HasPrefix(resource, "nvidia.com/mig-")
}

func usedMiB(d Device) int {
	if d.Usage.FBUsedMiB > d.MemoryMiB {
		return d.MemoryMiB
	}
	return d.Usage.FBUsedMiB
}

// Devices lists the entities of a node's driver state with their labels, the
// pod holding each (owners by device ID = UUID) and its usage.
func Devices(state *deviceplugin.DriverState, owners map[string]podresources.Owner, usage func(uuid string) gpuusage.Usage) []Device {
	var out []Device
	for _, g := range state.GPUs {
		base := []Label{
			{"gpu", strconv.Itoa(g.Index)},
			{"UUID", g.UUID},
			{"pci_bus_id", g.BusID},
			{"device", fmt.Sprintf("nvidia%d", g.Minor)},
			{"modelName", g.Name},
			{"Hostname", state.Node},
		}
		if len(g.MIG) == 0 {
			out = append(out, Device{
				Labels:    withOwner(base, state.DriverVersion, owners[g.UUID]),
				MemoryMiB: g.MemoryMiB,
				Usage:     usage(g.UUID),
			})
			continue
		}
		for _, m := range g.MIG {
			labels := append(append([]Label(nil), base...),
				Label{"GPU_I_PROFILE", m.Profile}, Label{"GPU_I_ID", strconv.Itoa(m.GI)})
			out = append(out, Device{
				Labels:    withOwner(labels, state.DriverVersion, owners[m.UUID]),
				MIG:       true,
				MemoryMiB: m.MemoryMiB,
				// Each MIG device has its own usage directory (the CDI spec's
				// layout, gpudriver.py), so a busy instance never makes its
				// neighbours on the same GPU look busy.
				Usage: usage(m.UUID),
			})
		}
	}
	return out
}

func withOwner(labels []Label, driver string, o podresources.Owner) []Label {
	return append(append([]Label(nil), labels...),
		Label{"DCGM_FI_DRIVER_VERSION", driver},
		Label{"container", o.Container},
		Label{"namespace", o.Namespace},
		Label{"pod", o.Pod},
	)
}

// Render is the Prometheus text exposition of the devices, field by field.
func Render(devices []Device) string {
	var b strings.Builder
	for _, f := range Fields {
		var lines []string
		for _, d := range devices {
			if d.MIG && f.WholeGPUOnly {
				continue
			}
			lines = append(lines, fmt.Sprintf("%s{%s} %s", f.Name, labelText(d.Labels), f.Value(d)))
		}
		if len(lines) == 0 {
			continue
		}
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", f.Name, f.Help, f.Name, f.Type)
		for _, l := range lines {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

var escaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

func labelText(labels []Label) string {
	parts := make([]string, len(labels))
	for i, l := range labels {
		parts[i] = fmt.Sprintf(`%s="%s"`, l.Name, escaper.Replace(l.Value))
	}
	return strings.Join(parts, ",")
}
