package nvidiasmi

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const fixtures = "../../../tests/fixtures/nvidia-smi/"

// recorded is a sample's verbatim output (everything after its delimiter line).
func recorded(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	_, out, ok := strings.Cut(string(data), "# ----- verbatim output below this line -----\n")
	if !ok {
		t.Fatalf("%s has no delimiter line", name)
	}
	return out
}

var now = time.Date(2026, 7, 14, 9, 0, 26, 0, time.UTC)

// Figures as the topology's models give them (sandbox/gpuspawner_sandbox/topology.py).
func h100(bus string) GPU {
	return GPU{UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "NVIDIA H100 80GB HBM3",
		MemoryMiB: 81559, BusID: bus, Serial: "0000000000000", PCIDeviceID: "0x233010DE",
		ComputeCap: "9.0", ECC: true, IdlePowerW: 69, PowerCapW: 700}
}

func a100(n int) GPU {
	return GPU{UUID: "GPU-a100000" + strconv.Itoa(n) + "-0000-0000-0000-000000000000", Name: "NVIDIA A100-SXM4-80GB",
		MemoryMiB: 81920, BusID: "00000000:" + []string{"18", "2A", "3A", "5D"}[n] + ":00.0", Minor: n,
		ComputeCap: "8.0", ECC: true, IdlePowerW: 59, PowerCapW: 500}
}

func h100MIG() GPU {
	g := h100("00000000:00:09.0")
	g.MIGEnabled = true
	for i, p := range []struct {
		name                            string
		mem, sm, bar1, ce, dec, ofa, gi int
	}{{"3g.40gb", 40448, 60, 24739, 3, 3, 0, 2}, {"2g.20gb", 20096, 32, 12369, 2, 2, 0, 3}, {"1g.10gb", 9984, 16, 6184, 1, 1, 0, 9}, {"1g.10gb", 9984, 16, 6184, 1, 1, 0, 10}} {
		g.MIG = append(g.MIG, MIG{Index: i, UUID: "MIG-" + strconv.Itoa(i), Profile: p.name, MemoryMiB: p.mem, GI: p.gi,
			Multiprocessors: p.sm, Bar1MiB: p.bar1, CopyEngines: p.ce, Decoders: p.dec, OFA: p.ofa, JPEG: p.dec})
	}
	return g
}

func driver(version, cuda string) *Driver {
	return &Driver{DriverVersion: version, CUDAVersion: cuda, Loaded: true}
}

func capture(t *testing.T) Capture {
	t.Helper()
	c, err := LoadCapture()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func run(t *testing.T, argv []string, view View) (string, string, int) {
	t.Helper()
	return Run(argv, view, capture(t), now)
}

// layout is each line's length and where its cell borders are: the table's shape.
func layout(lines []string) []string {
	border := regexp.MustCompile(`[|+]`)
	var shape []string
	for _, l := range lines {
		shape = append(shape, strconv.Itoa(len(l))+":"+strings.Join(
			func() []string {
				var at []string
				for _, m := range border.FindAllStringIndex(l, -1) {
					at = append(at, strconv.Itoa(m[0]))
				}
				return at
			}(), ","))
	}
	return shape
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s differs:\n got: %q\nwant: %q", what, got, want)
	}
}

func TestTableMatchesRecordedH100ExactlyApartFromTheTimestamp(t *testing.T) {
	want := strings.Split(recorded(t, "table__h100-80gb-hbm3_590.48.01__idle.txt"), "\n")
	out, _, rc := run(t, nil, View{driver("590.48.01", "13.1"), []GPU{h100("00000000:00:09.0")}})
	got := strings.Split(out, "\n")
	if rc != 0 || len(got[0]) != 31 || !strings.HasPrefix(got[0], "Tue Jul 14 09:00:26 2026") {
		t.Fatalf("rc %d, first line %q", rc, got[0])
	}
	equal(t, "table", got[1:], want[1:])
}

func TestTableLayoutMatchesRecorded4xA100R555(t *testing.T) {
	want := strings.Split(strings.TrimRight(recorded(t, "table__A100SXMx4_555.42.02.txt"), "\n"), "\n")
	gpus := []GPU{a100(0), a100(1), a100(2), a100(3)}
	for i := range gpus {
		gpus[i].Number = i
	}
	out, _, rc := run(t, nil, View{driver("555.42.02", "12.5"), gpus})
	got := strings.Split(strings.TrimRight(out, "\n"), "\n")[1:] // the sample has no timestamp
	if rc != 0 {
		t.Fatal(rc)
	}
	equal(t, "layout", layout(got), layout(want))
	for i := range got {
		if !strings.Contains(want[i], "MiB") && !strings.Contains(want[i], "00000000:") && got[i] != want[i] {
			t.Errorf("line %d: %q, recorded %q", i, got[i], want[i])
		}
	}
}

func TestTableWithMIGDevicesMatchesRecordedLayout(t *testing.T) {
	want := strings.Split(recorded(t, "table__h100-80gb-hbm3-MIG_590.48.01__idle.txt"), "\n")
	out, _, _ := run(t, nil, View{driver("590.48.01", "13.1"), []GPU{h100MIG()}})
	got := strings.Split(out, "\n")
	equal(t, "layout", layout(got[1:]), layout(want[1:]))
	var ours, theirs []string
	for _, l := range got {
		if strings.HasPrefix(l, "|  0  ") {
			ours = append(ours, l[:19])
		}
	}
	for _, l := range want {
		if strings.HasPrefix(l, "|  0  ") {
			theirs = append(theirs, l[:19])
		}
	}
	equal(t, "MIG rows", ours, theirs)
}

func TestLegacyDriverGetsTheNarrowLayout(t *testing.T) {
	want := strings.Split(recorded(t, "table__t4_510.47.03__openshift.txt"), "\n")
	t4 := GPU{UUID: "GPU-t4", Name: "Tesla T4", MemoryMiB: 15360, BusID: "00000000:00:1E.0", ECC: true, IdlePowerW: 15, PowerCapW: 70}
	out, _, _ := run(t, nil, View{driver("510.47.03", "11.6"), []GPU{t4}})
	got := strings.Split(out, "\n")
	equal(t, "layout", layout(got[1:]), layout(want[1:]))
	if got[2] != want[2] || !strings.HasPrefix(got[8], "|   0  Tesla T4            On   | 00000000:00:1E.0 Off |") {
		t.Errorf("banner %q, row %q", got[2], got[8])
	}
}

func TestListWithMIGMatchesRecorded(t *testing.T) {
	want := recorded(t, "list-L__h100-80gb-hbm3-MIG_590.48.01.txt")
	out, _, rc := run(t, []string{"-L"}, View{driver("590.48.01", "13.1"), []GPU{h100MIG()}})
	uuid := regexp.MustCompile(`UUID: [^)]+`)
	if rc != 0 || uuid.ReplaceAllString(out, "U") != uuid.ReplaceAllString(want, "U") {
		t.Errorf("rc %d\n%s", rc, out)
	}
}

func TestVersionMatchesRecorded(t *testing.T) {
	out, _, rc := run(t, []string{"--version"}, View{Driver: driver("590.48.01", "13.1")})
	if rc != 0 || out != recorded(t, "version__h100-80gb-hbm3_590.48.01.txt") {
		t.Errorf("rc %d\n%s", rc, out)
	}
}

func TestQueryMatchesRecordedProjection(t *testing.T) {
	want := strings.Split(recorded(t, "query-gpu-csv-PROJECTED__h100-80gb-hbm3_590.48.01__idle.txt"), "\n")
	var fields []string
	for _, h := range strings.Split(want[0], ", ") {
		name, _, _ := strings.Cut(h, " [")
		fields = append(fields, name)
	}
	g := h100("00000000:00:09.0")
	out, _, rc := run(t, []string{"--query-gpu=" + strings.Join(fields, ","), "--format=csv"}, View{driver("590.48.01", "13.1"), []GPU{g}})
	got := strings.Split(out, "\n")
	theirs := strings.Split(want[1], ", ")
	theirs[1] = g.UUID // the sample's UUID is masked
	if rc != 0 || got[0] != want[0] || got[1] != strings.Join(theirs, ", ") {
		t.Errorf("rc %d\n got %q\nwant %q", rc, got[:2], []string{want[0], strings.Join(theirs, ", ")})
	}
}

func TestEveryRecordedFieldIsAccepted(t *testing.T) {
	want := strings.Split(recorded(t, "query-gpu-csv-ALLFIELDS__h100-80gb-hbm3_590.48.01__idle.txt"), "\n")
	var fields []string
	for _, h := range strings.Split(want[0], ", ") {
		name, _, _ := strings.Cut(h, " [")
		fields = append(fields, name)
	}
	out, _, rc := run(t, []string{"--query-gpu=" + strings.Join(fields, ","), "--format=csv"}, View{driver("590.48.01", "13.1"), []GPU{h100("00000000:00:09.0")}})
	got := strings.Split(out, "\n")
	if rc != 0 || got[0] != want[0] || len(strings.Split(got[1], ", ")) != len(strings.Split(want[1], ", ")) {
		t.Errorf("rc %d, header %v", rc, got[0] == want[0])
	}
}

func TestUnknownFieldAndDriverNotLoadedAreTheRecordedMessages(t *testing.T) {
	view := View{driver("590.48.01", "13.1"), []GPU{h100("00000000:00:09.0")}}
	out, errOut, rc := run(t, []string{"--query-gpu=device_minor,gpu_uuid,pci.bus_id", "--format=csv,noheader,nounits"}, view)
	if rc != 2 || out != recorded(t, "error-invalid-field__rc2__cohdi-37.txt") || errOut != "" {
		t.Errorf("invalid field: rc %d %q", rc, out)
	}
	view.Driver.Loaded = false
	out, errOut, rc = run(t, nil, view)
	if rc != 9 || out != recorded(t, "error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt") || strings.TrimSpace(errOut) != strings.TrimSpace(out) {
		t.Errorf("not loaded: rc %d %q", rc, out)
	}
	out, _, rc = run(t, nil, View{})
	if rc != 9 || !strings.Contains(out, "couldn't communicate") {
		t.Errorf("no driver view: rc %d %q", rc, out)
	}
}

func TestFaultEffects(t *testing.T) {
	a, b := a100(0), a100(1)
	b.ECCErrorsUncorrected, b.RemappedRowsUncorrectable, b.RemappedRowsPending = 3, 3, true
	view := View{driver("580.95.05", "13.0"), []GPU{a, b}}
	out, _, rc := run(t, []string{"--query-gpu=index,ecc.errors.uncorrected.volatile.total,remapped_rows.pending", "--format=csv,noheader"}, view)
	if rc != 0 || out != "0, 0, No\n1, 3, Yes\n" {
		t.Errorf("ecc: rc %d %q", rc, out)
	}
	a.Missing = true
	out, _, rc = run(t, []string{"-L"}, View{view.Driver, []GPU{a, b}})
	if rc != 0 || out != "GPU 0: NVIDIA A100-SXM4-80GB (UUID: "+b.UUID+")\n" {
		t.Errorf("missing: rc %d %q", rc, out)
	}
	out, _, rc = run(t, []string{"-L"}, View{view.Driver, []GPU{a}})
	if rc != 6 || out != "No devices were found\n" {
		t.Errorf("none left: rc %d %q", rc, out)
	}
	b.Lost = true
	out, _, rc = run(t, []string{"--query-gpu=uuid", "--format=csv"}, View{view.Driver, []GPU{b}})
	sample := strings.ReplaceAll(recorded(t, "error-gpu-lost__windows-369.30__darknet-86.txt"), "\n", "")
	want := strings.Replace(sample, "GPU 0000:03:00.0", "GPU0000:2A:00.0", 1)
	if rc != 15 || strings.TrimSpace(out) != strings.TrimSpace(want) {
		t.Errorf("lost: rc %d %q, want %q", rc, out, want)
	}
}

func TestIDOptionKeepsTheContainerIndex(t *testing.T) {
	gpus := []GPU{a100(0), a100(1), a100(2)}
	out, _, rc := run(t, []string{"--query-gpu=index,uuid", "--format=csv,noheader", "-i", "2"}, View{driver("580.95.05", "13.0"), gpus})
	if rc != 0 || out != "2, "+gpus[2].UUID+"\n" {
		t.Errorf("rc %d %q", rc, out)
	}
}

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadSeesOnlyInjectedDevicesAndLiveUsage(t *testing.T) {
	root := t.TempDir()
	l := Layout{ViewRoot: "/view", DevRoot: "/dev", DriverDir: "driver", GPUsDir: "gpus", UsageDir: "usage",
		DriverFile: "driver.json", GPUFile: "gpu.json", UsageFile: "usage.json", CapsDir: "nvidia-caps", EmulatedRootEnv: "ROOT"}
	l = l.Rooted(func(string) string { return root })
	write(t, filepath.Join(root, "view/driver/driver.json"), `{"driver_version": "580.95.05", "cuda_version": "13.0", "loaded": true}`)
	gpu := func(uuid, bus string, minor int, mig string) {
		write(t, filepath.Join(root, "view/gpus", uuid, "gpu.json"),
			`{"uuid": "`+uuid+`", "bus_id": "`+bus+`", "minor": `+strconv.Itoa(minor)+`, "mig": [`+mig+`]}`)
	}
	gpu("GPU-b", "00000000:2A:00.0", 1, `{"uuid": "MIG-1", "gi_cap_minor": 147, "ci_cap_minor": 148}, {"uuid": "MIG-2", "gi_cap_minor": 156, "ci_cap_minor": 157}`)
	gpu("GPU-a", "00000000:18:00.0", 0, "")
	gpu("GPU-c", "00000000:3A:00.0", 2, "") // mounted, but its device node was not injected
	write(t, filepath.Join(root, "dev/nvidia0"), "")
	write(t, filepath.Join(root, "dev/nvidia1"), "")
	write(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap156"), "")
	write(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap157"), "")
	write(t, filepath.Join(root, "dev/nvidia-caps/nvidia-cap147"), "") // only the GI of MIG-1
	write(t, filepath.Join(root, "view/usage/GPU-a/usage.json"), `{"gpu_util_percent": 90, "fb_used_mib": 1000, "until": `+strconv.FormatInt(now.Unix()+60, 10)+`}`)
	write(t, filepath.Join(root, "view/usage/GPU-b/usage.json"), `{"gpu_util_percent": 50, "fb_used_mib": 10, "until": `+strconv.FormatInt(now.Unix()-1, 10)+`}`)
	view := Load(l, now)
	if view.Driver == nil || view.Driver.DriverVersion != "580.95.05" {
		t.Fatalf("driver %+v", view.Driver)
	}
	var seen []string
	for _, g := range view.GPUs {
		seen = append(seen, g.UUID)
		for _, m := range g.MIG {
			seen = append(seen, m.UUID)
		}
	}
	equal(t, "devices", seen, []string{"GPU-a", "GPU-b", "MIG-2"})
	if view.GPUs[0].Usage.GPUUtilPercent != 90 || view.GPUs[1].Usage != (Usage{}) {
		t.Errorf("usage %+v %+v", view.GPUs[0].Usage, view.GPUs[1].Usage)
	}
}

// --- the real H200 captured by this project (scripts/gpu-checks.sh --capture) ---

const realH200 = "h200_580.159.04"

// h200 is the captured board as the emulated driver would describe it (its real UUID and
// bus address, and the idle power and cap its table shows).
func h200() GPU {
	return GPU{UUID: "GPU-52b0c693-a3d5-f989-2ab8-cda89f0e8b18", Name: "NVIDIA H200",
		MemoryMiB: 143771, BusID: "00000000:00:06.0", Serial: "1653824161992",
		ComputeCap: "9.0", ECC: true, IdlePowerW: 79, PowerCapW: 700}
}

func h200View() View {
	return View{driver("580.159.04", "13.0"), []GPU{h200()}}
}

func real(t *testing.T, what string) string {
	t.Helper()
	return recorded(t, "real__"+what+"__"+realH200+".txt")
}

// header is a fixture's `# key:` header value.
func header(t *testing.T, name, key string) string {
	t.Helper()
	data, err := os.ReadFile(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if value, ok := strings.CutPrefix(line, "# "+key+": "); ok {
			return value
		}
	}
	t.Fatalf("%s has no %s header", name, key)
	return ""
}

// fieldNames are the field names of a --format=csv header line.
func fieldNames(headerLine string) []string {
	var names []string
	for _, h := range strings.Split(headerLine, ", ") {
		name, _, _ := strings.Cut(h, " [")
		names = append(names, name)
	}
	return names
}

// sensors blanks what a real board measures and the emulation cannot know: the
// temperature and the power draw (the cells keep their width).
func sensors(lines []string) []string {
	temperature, power := regexp.MustCompile(`\d+C `), regexp.MustCompile(` *\d+W / `)
	var out []string
	for _, l := range lines {
		l = temperature.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat("t", len(s)) })
		out = append(out, power.ReplaceAllStringFunc(l, func(s string) string { return strings.Repeat("p", len(s)) }))
	}
	return out
}

func TestTableMatchesRealH200ExactlyApartFromTimestampAndSensors(t *testing.T) {
	want := strings.Split(recorded(t, "real__table__"+realH200+"__idle.txt"), "\n")
	out, _, rc := run(t, nil, h200View())
	got := strings.Split(out, "\n")
	if rc != 0 || len(got[0]) != len(want[0]) {
		t.Fatalf("rc %d, first line %q (recorded %q)", rc, got[0], want[0])
	}
	equal(t, "table", sensors(got[1:]), sensors(want[1:]))
}

func TestTableUnderLoadShowsTheRealH200sGPURows(t *testing.T) {
	want := strings.Split(recorded(t, "real__table__"+realH200+"__load.txt"), "\n")
	view := h200View()
	view.GPUs[0].Usage = Usage{GPUUtilPercent: 99, FBUsedMiB: 21491}
	out, _, _ := run(t, nil, view)
	got := strings.Split(out, "\n")
	// Up to the end of the GPU block: the emulation lists no processes (the real board
	// listed the load's python3 process), so the process rows differ.
	equal(t, "GPU rows under load", sensors(got[1:13]), sensors(want[1:13]))
	equal(t, "layout", layout(got[1:]), layout(want[1:]))
}

func TestListAndVersionMatchTheRealH200(t *testing.T) {
	out, _, rc := run(t, []string{"-L"}, h200View())
	if rc != 0 || out != real(t, "list-L") {
		t.Errorf("-L: rc %d %q", rc, out)
	}
	out, _, rc = run(t, []string{"--version"}, h200View())
	if rc != 0 || out != real(t, "version") {
		t.Errorf("--version: rc %d %q", rc, out)
	}
}

func TestTheChecksQueriesMatchTheRealH200(t *testing.T) {
	for _, what := range []string{"query-gpu-core", "query-gpu-health", "query-gpu-id"} {
		argv := strings.Fields(strings.TrimPrefix(header(t, "real__"+what+"__"+realH200+".txt", "command"), "nvidia-smi "))
		out, errOut, rc := run(t, argv, h200View())
		if rc != 0 || errOut != "" || out != real(t, what) {
			t.Errorf("%s: rc %d\n got %q\nwant %q", what, rc, out, real(t, what))
		}
	}
}

func TestDriver580RejectsEdppMultiplierWithTheRealMessage(t *testing.T) {
	name := "real__error-invalid-field__edpp_multiplier__" + realH200 + ".txt"
	argv := strings.Fields(strings.TrimPrefix(header(t, name, "command"), "nvidia-smi "))
	out, errOut, rc := run(t, argv, h200View())
	if rc != 2 || errOut != "" || out != recorded(t, name) {
		t.Errorf("rc %d %q", rc, out)
	}
	// The same list on the driver it was recorded from is accepted.
	if _, _, rc := run(t, argv, View{driver("590.48.01", "13.1"), []GPU{h200()}}); rc != 0 {
		t.Errorf("590.48.01: rc %d", rc)
	}
	// What 580.159.04 accepted, it answers with the real header, cell for cell.
	want := strings.Split(recorded(t, "real__query-gpu-allfields__"+realH200+"__idle.txt"), "\n")
	out, _, rc = run(t, []string{"--query-gpu=" + strings.Join(fieldNames(want[0]), ","), "--format=csv"}, h200View())
	got := strings.Split(out, "\n")
	if rc != 0 || got[0] != want[0] || len(strings.Split(got[1], ", ")) != len(strings.Split(want[1], ", ")) {
		t.Errorf("rc %d, header as recorded: %v", rc, got[0] == want[0])
	}
}

func TestFieldMinimumsAreTheRecordedOnes(t *testing.T) {
	// Every recorded complete field list, with its driver branch.
	files, err := filepath.Glob(fixtures + "*ALLFIELDS*")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, fixtures+"real__query-gpu-allfields__"+realH200+"__idle.txt")
	seen := map[string]int{} // field -> the oldest branch whose list has it
	branches := map[int]map[string]bool{}
	for _, path := range files {
		name := filepath.Base(path)
		version, _, _ := strings.Cut(header(t, name, "driver_version"), " ")
		branch := major(version)
		if branches[branch] == nil {
			branches[branch] = map[string]bool{}
		}
		for _, field := range fieldNames(strings.SplitN(recorded(t, name), "\n", 2)[0]) {
			branches[branch][field] = true
			if first, ok := seen[field]; !ok || branch < first {
				seen[field] = branch
			}
		}
	}
	// A minimum is known where the older driver was asked for the field and refused it:
	// the real 580 capture asked for every field of capture.json.
	derived := map[string]int{}
	for field := range capture(t).Fields {
		if !branches[580][field] {
			derived[field] = seen[field]
		}
	}
	if len(derived) != len(fieldMinDriver) {
		t.Errorf("derived %v, table %v", derived, fieldMinDriver)
	}
	for field, least := range derived {
		if fieldMinDriver[field] != least {
			t.Errorf("%s: derived %d, table %d", field, least, fieldMinDriver[field])
		}
	}
}

func TestIDOptionIsRefusedWithListAndAnUnknownIDFindsNoDevice(t *testing.T) {
	for _, argv := range [][]string{{"-i", "0", "-L"}, {"-L", "-i", "0"}, {"--id=0", "--list-gpus"}} {
		out, errOut, rc := run(t, argv, h200View())
		if rc != 2 || errOut != "" || out != real(t, "error-option-i-with-L") {
			t.Errorf("%v: rc %d %q", argv, rc, out)
		}
	}
	argv := strings.Fields(strings.TrimPrefix(header(t, "real__error-id-not-found__"+realH200+".txt", "command"), "nvidia-smi "))
	out, errOut, rc := run(t, argv, h200View())
	if rc != 6 || errOut != "" || out != real(t, "error-id-not-found") {
		t.Errorf("%v: rc %d %q", argv, rc, out)
	}
}

func TestFieldsDeprecatedIn590AreReportedByOlderDrivers(t *testing.T) {
	const deprecated = "[Requested functionality has been deprecated]"
	row := func(name string) map[string]string {
		lines := strings.Split(recorded(t, name), "\n")
		values := map[string]string{}
		for i, v := range strings.Split(lines[1], ", ") {
			values[fieldNames(lines[0])[i]] = v
		}
		return values
	}
	old := row("real__query-gpu-allfields__" + realH200 + "__idle.txt")
	recent := row("query-gpu-csv-ALLFIELDS__h200_590.48.01__idle.txt")
	var derived []string
	for _, field := range fieldNames(strings.SplitN(recorded(t, "real__query-gpu-allfields__"+realH200+"__idle.txt"), "\n", 2)[0]) {
		if recent[field] == deprecated && old[field] != deprecated {
			derived = append(derived, field)
		}
	}
	equal(t, "fields deprecated in 590", derived, deprecatedFields)
	query := []string{"--query-gpu=" + strings.Join(deprecatedFields, ",") + ",clocks.max.graphics,clocks.max.memory", "--format=csv,noheader"}
	out, _, _ := run(t, query, h200View())
	got := strings.Split(strings.TrimSpace(out), ", ")
	if got[0] != old["power.management"] || got[1] != got[5] || got[2] != got[6] || got[3] != got[5] || got[4] != got[6] {
		t.Errorf("580: %q", got)
	}
	// The real 580 board's application clocks are its maximum clocks, as emulated.
	if old["clocks.applications.graphics"] != old["clocks.max.graphics"] || old["clocks.applications.memory"] != old["clocks.max.memory"] {
		t.Errorf("recorded 580 clocks: %v", old)
	}
	out, _, _ = run(t, query, View{driver("590.48.01", "13.1"), []GPU{h200()}})
	if strings.Count(out, deprecated) != len(deprecatedFields) {
		t.Errorf("590: %q", out)
	}
}
