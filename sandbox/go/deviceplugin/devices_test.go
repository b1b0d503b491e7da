package deviceplugin

import (
	"reflect"
	"strings"
	"testing"
)

// eight GPUs on two NVLink domains (0-3, 4-7), GPU 5 unhealthy.
func hgx() *DriverState {
	s := &DriverState{Node: "n", DriverVersion: "580.95.05"}
	for i := 0; i < 8; i++ {
		health := Healthy
		if i == 5 {
			health = Unhealthy
		}
		s.GPUs = append(s.GPUs, GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), Minor: i, Health: health, NVLinkDomain: i / 4})
	}
	return s
}

func migNode(profiles ...string) *DriverState {
	s := &DriverState{}
	for i := 0; i < 2; i++ {
		g := GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), Health: Healthy, NVLinkDomain: 0}
		for j, p := range profiles {
			g.MIG = append(g.MIG, MIG{Index: j, UUID: g.UUID + "-mig" + string(rune('0'+j)), Profile: p, Health: Healthy})
		}
		s.GPUs = append(s.GPUs, g)
	}
	return s
}

func ids(devices []Device) []string {
	var out []string
	for _, d := range devices {
		out = append(out, d.ID)
	}
	return out
}

func TestResourcesWholeGPUsCarryHealthAndDomain(t *testing.T) {
	r, err := Resources(hgx(), MIGNone)
	if err != nil {
		t.Fatal(err)
	}
	devs := r[GPUResource]
	if len(r) != 1 || len(devs) != 8 {
		t.Fatalf("want 8 nvidia.com/gpu only, got %v", r)
	}
	if devs[5].Healthy || !devs[4].Healthy || devs[5].Domain != 1 || devs[3].Domain != 0 {
		t.Fatalf("health or domain wrong: %+v", devs)
	}
	api := APIDevices(devs)
	if api[5].Health != "Unhealthy" || api[0].Health != "Healthy" || api[0].ID != "GPU-a" {
		t.Fatalf("ListAndWatch devices wrong: %v", api)
	}
}

func TestResourcesMixedAdvertisesOneResourcePerProfile(t *testing.T) {
	s := migNode("3g.40gb", "1g.10gb", "1g.10gb")
	s.GPUs = append(s.GPUs, GPU{Index: 2, UUID: "GPU-plain", Health: Healthy})
	s.GPUs[1].Health = Unhealthy // a broken parent makes its MIG devices unhealthy
	r, err := Resources(s, MIGMixed)
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(r["nvidia.com/mig-1g.10gb"]); !reflect.DeepEqual(got, []string{"GPU-a-mig1", "GPU-a-mig2", "GPU-b-mig1", "GPU-b-mig2"}) {
		t.Fatalf("1g.10gb devices: %v", got)
	}
	if got := ids(r["nvidia.com/mig-3g.40gb"]); !reflect.DeepEqual(got, []string{"GPU-a-mig0", "GPU-b-mig0"}) {
		t.Fatalf("3g.40gb devices: %v", got)
	}
	if got := ids(r[GPUResource]); !reflect.DeepEqual(got, []string{"GPU-plain"}) {
		t.Fatalf("whole GPUs: %v", got)
	}
	if r["nvidia.com/mig-3g.40gb"][1].Healthy || !r["nvidia.com/mig-3g.40gb"][0].Healthy {
		t.Fatalf("parent health not inherited: %+v", r["nvidia.com/mig-3g.40gb"])
	}
}

func TestResourcesSingleAdvertisesMIGDevicesAsGPUs(t *testing.T) {
	r, err := Resources(migNode("1g.10gb", "1g.10gb"), MIGSingle)
	if err != nil {
		t.Fatal(err)
	}
	if len(r) != 1 || len(r[GPUResource]) != 4 || r[GPUResource][0].ID != "GPU-a-mig0" {
		t.Fatalf("single strategy: %v", r)
	}
	if _, err := Resources(migNode("3g.40gb", "1g.10gb"), MIGSingle); err == nil || !strings.Contains(err.Error(), "one MIG profile") {
		t.Fatalf("mixed profiles under single must fail, got %v", err)
	}
	if _, err := Resources(hgx(), MIGSingle); err == nil {
		t.Fatal("single strategy without MIG must fail")
	}
	if _, err := Resources(hgx(), "both"); err == nil {
		t.Fatal("unknown strategy must fail")
	}
}

func TestParseDriverStateRejectsBadHealthAndDuplicates(t *testing.T) {
	good := `{"node":"n","gpus":[{"index":0,"uuid":"GPU-1","health":"healthy","mig":[{"index":0,"uuid":"MIG-1","profile":"1g.10gb","health":"unhealthy"}]}]}`
	s, err := ParseDriverState([]byte(good))
	if err != nil || s.GPUs[0].MIG[0].Health != Unhealthy {
		t.Fatalf("good state: %v %+v", err, s)
	}
	for _, bad := range []string{
		`{"gpus":[{"uuid":"GPU-1","health":"sick"}]}`,
		`{"gpus":[{"uuid":"GPU-1","health":"healthy"},{"uuid":"GPU-1","health":"healthy"}]}`,
		`{"gpus":[{"health":"healthy"}]}`,
		`{"gpus":[`,
	} {
		if _, err := ParseDriverState([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestContainerResponseEnvvar(t *testing.T) {
	r := ContainerResponse([]string{"GPU-a", "GPU-b"}, []string{StrategyEnvvar}, "rid")
	if !reflect.DeepEqual(r.Envs, map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) {
		t.Fatalf("envs: %v", r.Envs)
	}
	if len(r.Annotations) != 0 || len(r.CdiDevices) != 0 {
		t.Fatalf("envvar strategy must not name CDI devices: %v", r)
	}
}

func TestContainerResponseCDI(t *testing.T) {
	r := ContainerResponse([]string{"GPU-a", "GPU-b"}, []string{StrategyCDIAnnotations}, "rid")
	want := map[string]string{"cdi.k8s.io/nvidia-device-plugin_rid": "nvidia.com/gpu=GPU-a,nvidia.com/gpu=GPU-b"}
	if !reflect.DeepEqual(r.Annotations, want) || len(r.Envs) != 0 || len(r.CdiDevices) != 0 {
		t.Fatalf("cdi-annotations: %v", r)
	}
	r = ContainerResponse([]string{"MIG-x"}, []string{StrategyCDICRI, StrategyEnvvar}, "rid")
	if len(r.CdiDevices) != 1 || r.CdiDevices[0].Name != "nvidia.com/gpu=MIG-x" || r.Envs["NVIDIA_VISIBLE_DEVICES"] != "MIG-x" || len(r.Annotations) != 0 {
		t.Fatalf("cdi-cri + envvar: %v", r)
	}
}

func TestParseStrategiesAndCheckKnown(t *testing.T) {
	if s, err := ParseStrategies("envvar, cdi-cri"); err != nil || !reflect.DeepEqual(s, []string{"envvar", "cdi-cri"}) {
		t.Fatalf("%v %v", s, err)
	}
	if _, err := ParseStrategies("volume-mounts"); err == nil {
		t.Fatal("unsupported strategy accepted")
	}
	devs := []Device{{ID: "GPU-a"}, {ID: "GPU-b"}}
	if err := CheckKnown(GPUResource, devs, []string{"GPU-b"}); err != nil {
		t.Fatal(err)
	}
	if err := CheckKnown(GPUResource, devs, []string{"GPU-z"}); err == nil || !strings.Contains(err.Error(), "unknown device: GPU-z") {
		t.Fatalf("unknown id: %v", err)
	}
}

func TestSocketName(t *testing.T) {
	if SocketName(GPUResource) != "nvidia-gpu.sock" || SocketName("nvidia.com/mig-1g.10gb") != "nvidia-mig-1g.10gb.sock" {
		t.Fatal(SocketName(GPUResource))
	}
}

func domainsOf(t *testing.T, devices []Device, chosen []string) map[int]int {
	t.Helper()
	dom := map[string]int{}
	for _, d := range devices {
		dom[d.ID] = d.Domain
	}
	out := map[int]int{}
	for _, id := range chosen {
		out[dom[id]]++
	}
	return out
}

func TestPreferredAllocationKeepsARequestInOneNVLinkDomain(t *testing.T) {
	r, _ := Resources(hgx(), MIGNone)
	devs := r[GPUResource]
	// The kubelet offers the healthy free devices; 5 is unhealthy, so
	// domain 1 has only three: a 4-GPU request must go to domain 0.
	avail := []string{"GPU-a", "GPU-e", "GPU-b", "GPU-g", "GPU-c", "GPU-h", "GPU-d"}
	got := PreferredAllocation(devs, avail, nil, 4)
	if !reflect.DeepEqual(got, []string{"GPU-a", "GPU-b", "GPU-c", "GPU-d"}) {
		t.Fatalf("4 of domain 0 expected, got %v", got)
	}
	// Two GPUs: the fuller domain (1, three free) is the best fit, so domain 0 stays whole.
	got = PreferredAllocation(devs, avail, nil, 2)
	if !reflect.DeepEqual(got, []string{"GPU-e", "GPU-g"}) {
		t.Fatalf("best fit in domain 1 expected, got %v", got)
	}
}

func TestPreferredAllocationFollowsMustInclude(t *testing.T) {
	r, _ := Resources(hgx(), MIGNone)
	devs := r[GPUResource]
	all := []string{"GPU-a", "GPU-b", "GPU-c", "GPU-d", "GPU-e", "GPU-g", "GPU-h"}
	got := PreferredAllocation(devs, all, []string{"GPU-g"}, 3)
	if got[0] != "GPU-g" || len(got) != 3 || domainsOf(t, devs, got)[1] != 3 {
		t.Fatalf("must-include GPU-g's domain expected, got %v", got)
	}
}

func TestPreferredAllocationSpansFewestDomainsWhenNoneFits(t *testing.T) {
	r, _ := Resources(hgx(), MIGNone)
	devs := r[GPUResource]
	avail := []string{"GPU-a", "GPU-b", "GPU-e", "GPU-g", "GPU-h"}
	got := PreferredAllocation(devs, avail, nil, 4)
	doms := domainsOf(t, devs, got)
	if len(got) != 4 || doms[1] != 3 || doms[0] != 1 {
		t.Fatalf("all three of domain 1 plus one of domain 0 expected, got %v", got)
	}
	if got := PreferredAllocation(devs, []string{"GPU-a", "GPU-zz"}, nil, 1); !reflect.DeepEqual(got, []string{"GPU-a"}) {
		t.Fatalf("unknown ids must be ignored, got %v", got)
	}
}
