package deviceplugin

import (
	"fmt"
	"sort"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GPUResource is the extended resource of whole GPUs (and of MIG devices
// under the single strategy), as NVIDIA's plugin names it.
const GPUResource = "nvidia.com/gpu"

// MIG strategies, as NVIDIA's plugin's --mig-strategy takes them.
const (
	MIGNone   = "none"
	MIGSingle = "single"
	MIGMixed  = "mixed"
)

// Device list strategies, as NVIDIA's plugin's --device-list-strategy takes them.
const (
	StrategyEnvvar         = "envvar"
	StrategyCDIAnnotations = "cdi-annotations"
	StrategyCDICRI         = "cdi-cri"
)

// VisibleDevicesEnv is the variable NVIDIA's container runtime reads.
const VisibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"

// CDIKind is the CDI vendor/class of the node's GPUs; a device is named
// CDIKind=<id>.
const CDIKind = "nvidia.com/gpu"

// CDIAnnotationPrefix and CDIAnnotationPlugin make the annotation key
// cdi.k8s.io/nvidia-device-plugin_<response id>, as the CDI library's
// UpdateAnnotations does for NVIDIA's plugin.
const (
	CDIAnnotationPrefix = "cdi.k8s.io/"
	CDIAnnotationPlugin = "nvidia-device-plugin"
)

// Device is one allocatable unit of a resource: a GPU or a MIG device.
type Device struct {
	ID      string // the GPU's or MIG device's UUID
	Healthy bool
	// Domain is the NVLink/NVSwitch domain of the (parent) GPU.
	Domain int
}

// Resources maps each extended resource the node advertises under a MIG
// strategy to its devices, in GPU order (then MIG order). Resources without
// devices are left out, as NVIDIA's plugin starts no server for them.
func Resources(s *DriverState, migStrategy string) (map[string][]Device, error) {
	out := map[string][]Device{}
	add := func(resource string, d Device) { out[resource] = append(out[resource], d) }
	switch migStrategy {
	case MIGNone:
		for _, g := range s.GPUs {
			add(GPUResource, Device{g.UUID, g.Health == Healthy, g.NVLinkDomain})
		}
	case MIGSingle:
		profile := ""
		for _, g := range s.GPUs {
			if len(g.MIG) == 0 {
				return nil, fmt.Errorf("the single MIG strategy needs MIG on every GPU; GPU %d (%s) has none", g.Index, g.UUID)
			}
			for _, m := range g.MIG {
				if profile == "" {
					profile = m.Profile
				}
				if m.Profile != profile {
					return nil, fmt.Errorf("the single MIG strategy needs one MIG profile on every GPU; found %s and %s", profile, m.Profile)
				}
				add(GPUResource, Device{m.UUID, g.Health == Healthy && m.Health == Healthy, g.NVLinkDomain})
			}
		}
	case MIGMixed:
		for _, g := range s.GPUs {
			if len(g.MIG) == 0 {
				add(GPUResource, Device{g.UUID, g.Health == Healthy, g.NVLinkDomain})
				continue
			}
			for _, m := range g.MIG {
				add("nvidia.com/mig-"+m.Profile, Device{m.UUID, g.Health == Healthy && m.Health == Healthy, g.NVLinkDomain})
			}
		}
	default:
		return nil, fmt.Errorf("unknown MIG strategy %q; expected %s, %s or %s", migStrategy, MIGNone, MIGSingle, MIGMixed)
	}
	return out, nil
}

// SocketName is the plugin's socket file (in the kubelet's device-plugins
// directory) for a resource, e.g. nvidia-gpu.sock, nvidia-mig-1g.10gb.sock.
func SocketName(resource string) string {
	return "nvidia-" + strings.TrimPrefix(resource, "nvidia.com/") + ".sock"
}

// APIDevices is what ListAndWatch sends for a resource's devices.
func APIDevices(devices []Device) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(devices))
	for _, d := range devices {
		health := pluginapi.Healthy
		if !d.Healthy {
			health = pluginapi.Unhealthy
		}
		out = append(out, &pluginapi.Device{ID: d.ID, Health: health})
	}
	return out
}

// ParseStrategies reads a comma-separated --device-list-strategy value.
func ParseStrategies(value string) ([]string, error) {
	var out []string
	for _, s := range strings.Split(value, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case StrategyEnvvar, StrategyCDIAnnotations, StrategyCDICRI:
			out = append(out, s)
		default:
			return nil, fmt.Errorf("unknown device list strategy %q; expected %s, %s or %s", s, StrategyEnvvar, StrategyCDIAnnotations, StrategyCDICRI)
		}
	}
	return out, nil
}

func includes(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// CheckKnown fails for any requested id the resource does not have, as
// NVIDIA's plugin does ("unknown device").
func CheckKnown(resource string, devices []Device, ids []string) error {
	known := map[string]bool{}
	for _, d := range devices {
		known[d.ID] = true
	}
	for _, id := range ids {
		if !known[id] {
			return fmt.Errorf("invalid allocation request for '%s': unknown device: %s", resource, id)
		}
	}
	return nil
}

// ContainerResponse is Allocate's answer for one container given its device
// ids, for the chosen device list strategies (NVIDIA's plugin's shape):
// envvar sets NVIDIA_VISIBLE_DEVICES=<ids>; cdi-annotations adds the
// annotation cdi.k8s.io/nvidia-device-plugin_<responseID> naming the CDI
// devices nvidia.com/gpu=<id>; cdi-cri lists the same names as CDIDevices
// for the container runtime's own CDI support.
func ContainerResponse(ids []string, strategies []string, responseID string) *pluginapi.ContainerAllocateResponse {
	resp := &pluginapi.ContainerAllocateResponse{}
	names := make([]string, 0, len(ids))
	for _, id := range ids {
		names = append(names, CDIKind+"="+id)
	}
	if includes(strategies, StrategyCDIAnnotations) && len(names) > 0 {
		key := CDIAnnotationPrefix + CDIAnnotationPlugin + "_" + responseID
		resp.Annotations = map[string]string{key: strings.Join(names, ",")}
	}
	if includes(strategies, StrategyCDICRI) {
		for _, n := range names {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
		}
	}
	if includes(strategies, StrategyEnvvar) {
		resp.Envs = map[string]string{VisibleDevicesEnv: strings.Join(ids, ",")}
	}
	return resp
}

// PreferredAllocation picks size devices from available (always including
// mustInclude), preferring devices that share one NVLink/NVSwitch domain:
//   - if one domain can hold the rest of the request, the fullest fit wins
//     (the domain with the fewest available devices that still suffices,
//     keeping larger domains whole for larger requests); domains of the
//     must-include devices are tried first;
//   - otherwise the request spans as few domains as it can, largest first.
//
// Within a domain, devices are taken in the node's order. Ids the resource
// does not know are ignored.
func PreferredAllocation(devices []Device, available, mustInclude []string, size int) []string {
	domain := map[string]int{}
	order := map[string]int{}
	for i, d := range devices {
		domain[d.ID] = d.Domain
		order[d.ID] = i
	}
	chosen := []string{}
	taken := map[string]bool{}
	mustDomains := map[int]bool{}
	for _, id := range mustInclude {
		if _, ok := domain[id]; ok && !taken[id] && len(chosen) < size {
			chosen = append(chosen, id)
			taken[id] = true
			mustDomains[domain[id]] = true
		}
	}
	need := size - len(chosen)
	if need <= 0 {
		return chosen
	}
	free := map[int][]string{}
	for _, id := range available {
		if _, ok := domain[id]; ok && !taken[id] {
			taken[id] = true
			free[domain[id]] = append(free[domain[id]], id)
		}
	}
	var domains []int
	for d, ids := range free {
		sort.Slice(ids, func(i, j int) bool { return order[ids[i]] < order[ids[j]] })
		domains = append(domains, d)
	}
	sort.Ints(domains)

	bestFit := func(only map[int]bool) (int, bool) {
		best, found := 0, false
		for _, d := range domains {
			if (only != nil && !only[d]) || len(free[d]) < need {
				continue
			}
			if !found || len(free[d]) < len(free[best]) {
				best, found = d, true
			}
		}
		return best, found
	}
	if len(mustDomains) > 0 {
		if d, ok := bestFit(mustDomains); ok {
			return append(chosen, free[d][:need]...)
		}
	}
	if d, ok := bestFit(nil); ok {
		return append(chosen, free[d][:need]...)
	}
	sort.SliceStable(domains, func(i, j int) bool {
		a, b := domains[i], domains[j]
		if mustDomains[a] != mustDomains[b] {
			return mustDomains[a]
		}
		return len(free[a]) > len(free[b])
	})
	for _, d := range domains {
		for _, id := range free[d] {
			if need == 0 {
				return chosen
			}
			chosen = append(chosen, id)
			need--
		}
	}
	return chosen
}
