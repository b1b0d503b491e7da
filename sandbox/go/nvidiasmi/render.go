package nvidiasmi

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Return codes from the nvidia-smi man page (NVML's nvmlReturn_t).
const (
	RCInvalidArgument = 2
	RCNotFound        = 6
	RCDriverNotLoaded = 9
	RCGPULost         = 15
)

const (
	driverNotLoaded = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. " +
		"Make sure that the latest NVIDIA driver is installed and running."
	noDevices    = "No devices were found"
	gpuLost      = "Unable to determine the device handle for GPU%s: GPU is lost.  Reboot the system to recover this GPU"
	invalidField = `Field "%s" is not a valid field to query.`
	invalidArgs  = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
	// What 580.159.04 prints for `nvidia-smi -i 0 -L` (real__error-option-i-with-L__h200_580.159.04.txt).
	invalidOption = "ERROR: Option %s is not valid for this command. Please run 'nvidia-smi -h' for help."
	throttle      = "clocks_throttle_reasons."
)

// Old names nvidia-smi still accepts for a field; the header echoes the canonical name.
var fieldAliases = map[string]string{
	"gpu_name":                        "name",
	"gpu_serial":                      "serial",
	"gpu_uuid":                        "uuid",
	"gpu_bus_id":                      "pci.bus_id",
	"clocks.gr":                       "clocks.current.graphics",
	"clocks.sm":                       "clocks.current.sm",
	"clocks.mem":                      "clocks.current.memory",
	"clocks.video":                    "clocks.current.video",
	"clocks.max.gr":                   "clocks.max.graphics",
	"clocks.max.mem":                  "clocks.max.memory",
	"clocks.applications.gr":          "clocks.applications.graphics",
	"clocks.applications.mem":         "clocks.applications.memory",
	"clocks.default_applications.gr":  "clocks.default_applications.graphics",
	"clocks.default_applications.mem": "clocks.default_applications.memory",
}

// fieldMinDriver names the fields of capture.json (a 590.48.01 header) that an older
// recorded driver rejects, with the first driver branch recorded to accept them. It is
// derived from the recorded captures in tests/fixtures/nvidia-smi, not guessed: the real
// 580.159.04 (real__query-gpu-allfields__h200_580.159.04__idle.txt) accepts every field of
// the 590.48.01 header but these (real__error-invalid-field__edpp_multiplier__h200_580.159.04.txt);
// the 595 and 610 captures hold all of them. No complete field list of a driver before 580
// is recorded, so older drivers get the 580 set (TestFieldMinimumsAreTheRecordedOnes
// recomputes this table from the fixtures).
var fieldMinDriver = map[string]int{
	"edpp_multiplier": 590,
}

// deprecatedIn is the driver branch from which nvidia-smi prints "[Requested functionality
// has been deprecated]" for the fields of deprecatedFields, derived from the recorded
// captures: the same board (an H200) reports them on 580.159.04
// (real__query-gpu-allfields__h200_580.159.04__idle.txt) and prints the deprecation on
// 590.48.01 (query-gpu-csv-ALLFIELDS__h200_590.48.01__idle.txt). On 580.159.04 power
// management read "Enabled" and the application clocks were the board's maximum clocks.
const deprecatedIn = 590

var deprecatedFields = []string{
	"power.management",
	"clocks.applications.graphics",
	"clocks.applications.memory",
	"clocks.default_applications.graphics",
	"clocks.default_applications.memory",
}

//go:embed capture.json
var captureJSON []byte

// Field is one --query-gpu field of the recorded capture.
type Field struct {
	Header string // the header text, with its unit
	Unit   string
	Value  string // the recorded value
}

// Capture is the recorded complete --query-gpu run: field -> recorded header and value,
// without MIG ("gpu") and the values that differ with MIG enabled.
type Capture struct {
	Fields    map[string]Field
	MIGValues map[string]string
}

type recordedRun struct {
	Header string `json:"header"`
	Row    string `json:"row"`
}

// LoadCapture parses the embedded capture (capture.json).
func LoadCapture() (Capture, error) {
	var data struct {
		GPU recordedRun `json:"gpu"`
		MIG recordedRun `json:"mig"`
	}
	if err := json.Unmarshal(captureJSON, &data); err != nil {
		return Capture{}, err
	}
	c := Capture{Fields: map[string]Field{}, MIGValues: map[string]string{}}
	headers, values := strings.Split(data.GPU.Header, ", "), strings.Split(data.GPU.Row, ", ")
	if len(headers) != len(values) {
		return Capture{}, fmt.Errorf("capture: %d headers, %d values", len(headers), len(values))
	}
	for i, h := range headers {
		name, unit, _ := strings.Cut(h, " [")
		c.Fields[name] = Field{h, strings.TrimSuffix(unit, "]"), values[i]}
	}
	headers, values = strings.Split(data.MIG.Header, ", "), strings.Split(data.MIG.Row, ", ")
	for i, h := range headers {
		name, _, _ := strings.Cut(h, " [")
		c.MIGValues[name] = values[i]
	}
	return c, nil
}

// canonicalField is a --query-gpu field's recorded name, and whether this driver knows it.
func canonicalField(name string, c Capture, driver string) (string, bool) {
	name = strings.TrimSpace(name)
	if alias, ok := fieldAliases[name]; ok {
		name = alias
	}
	if strings.HasPrefix(name, throttle) {
		name = "clocks_event_reasons." + name[len(throttle):]
	}
	_, ok := c.Fields[name]
	if least, newer := fieldMinDriver[name]; newer && major(driver) < least {
		ok = false
	}
	return name, ok
}

func major(driver string) int {
	m, _ := strconv.Atoi(strings.SplitN(driver, ".", 2)[0])
	return m
}

func firstInt(value string) int {
	n, _ := strconv.Atoi(strings.Fields(value + " 0")[0])
	return n
}

func clamp(n, lo, hi int) int {
	return max(lo, min(n, hi))
}

// Values is every field's value for one GPU (count: how many the container sees):
// the recorded capture, with what the driver knows put in.
func Values(g GPU, count int, d Driver, c Capture, now time.Time) map[string]string {
	v := make(map[string]string, len(c.Fields))
	for name, f := range c.Fields {
		v[name] = f.Value
	}
	if g.MIGEnabled {
		for name, value := range c.MIGValues {
			v[name] = value
		}
	}
	bus := strings.Split(g.BusID, ":")
	if len(bus) != 3 {
		bus = []string{"0000", "00", "00.0"} // not a PCI address; the state writer never does this
	}
	domain := bus[0]
	if len(domain) > 4 {
		domain = domain[len(domain)-4:]
	}
	device, _, _ := strings.Cut(bus[2], ".")
	// Keep the recorded free/reserved relation (NVML rounds each figure on its own).
	recordedTotal, recordedFree := firstInt(v["memory.total"]), firstInt(v["memory.free"])
	used := clamp(g.Usage.FBUsedMiB, 0, g.MemoryMiB)
	idle := fmt.Sprintf("%.2f W", float64(g.IdlePowerW))
	limit := fmt.Sprintf("%.2f W", float64(g.PowerCapW))
	ecc := "Disabled"
	if g.ECC {
		ecc = "Enabled"
	}
	set := map[string]string{
		"timestamp":            now.Format("2006/01/02 15:04:05.000"),
		"driver_version":       d.DriverVersion,
		"count":                strconv.Itoa(count),
		"name":                 g.Name,
		"serial":               g.Serial,
		"uuid":                 g.UUID,
		"pci.bus_id":           g.BusID,
		"pci.domain":           "0x" + domain,
		"pci.bus":              "0x" + bus[1],
		"pci.device":           "0x" + device,
		"index":                strconv.Itoa(g.Number),
		"compute_cap":          g.ComputeCap,
		"memory.total":         fmt.Sprintf("%d MiB", g.MemoryMiB),
		"memory.used":          fmt.Sprintf("%d MiB", firstInt(v["memory.used"])+used),
		"memory.free":          fmt.Sprintf("%d MiB", recordedFree+g.MemoryMiB-recordedTotal-used),
		"ecc.mode.current":     ecc,
		"ecc.mode.pending":     ecc,
		"power.draw":           idle,
		"power.draw.average":   idle,
		"power.draw.instant":   idle,
		"power.limit":          limit,
		"enforced.power.limit": limit,
		"power.default_limit":  limit,
		"power.max_limit":      limit,
	}
	for name, value := range set {
		v[name] = value
	}
	if g.PCIDeviceID != "" {
		v["pci.device_id"] = g.PCIDeviceID
	}
	if major(d.DriverVersion) < deprecatedIn {
		v["power.management"] = "Enabled"
		for _, kind := range []string{"graphics", "memory"} {
			v["clocks.applications."+kind] = v["clocks.max."+kind]
			v["clocks.default_applications."+kind] = v["clocks.max."+kind]
		}
	}
	if !g.MIGEnabled {
		// With MIG enabled utilisation is not reported per GPU ([N/A] in the capture).
		v["utilization.gpu"] = fmt.Sprintf("%d %%", clamp(g.Usage.GPUUtilPercent, 0, 100))
	}
	if g.ECCErrorsUncorrected > 0 {
		n := strconv.Itoa(g.ECCErrorsUncorrected)
		for _, scope := range []string{"volatile", "aggregate"} {
			for _, part := range []string{"device_memory", "dram", "total"} {
				v["ecc.errors.uncorrected."+scope+"."+part] = n
			}
		}
	}
	if !g.MIGEnabled && g.RemappedRowsUncorrectable > 0 {
		v["remapped_rows.uncorrectable"] = strconv.Itoa(g.RemappedRowsUncorrectable)
	}
	if !g.MIGEnabled && g.RemappedRowsPending {
		v["remapped_rows.pending"] = "Yes"
	}
	return v
}

// QueryGPU is --query-gpu=<fields> --format=<format>: stdout and the exit code.
func QueryGPU(view View, fields, format string, c Capture, now time.Time) (string, int) {
	var canonical []string
	for _, name := range strings.Split(fields, ",") {
		if strings.TrimSpace(name) == "" {
			continue
		}
		field, ok := canonicalField(name, c, view.Driver.DriverVersion)
		if !ok {
			return fmt.Sprintf(invalidField, strings.TrimSpace(name)) + "\n\n", RCInvalidArgument
		}
		canonical = append(canonical, field)
	}
	options := map[string]bool{}
	for _, o := range strings.Split(format, ",") {
		options[strings.TrimSpace(o)] = true
	}
	for o := range options {
		if o != "csv" && o != "noheader" && o != "nounits" {
			return invalidArgs + "\n", RCInvalidArgument
		}
	}
	if !options["csv"] {
		return invalidArgs + "\n", RCInvalidArgument
	}
	var b strings.Builder
	if !options["noheader"] {
		headers := make([]string, len(canonical))
		for i, f := range canonical {
			headers[i] = c.Fields[f].Header
		}
		b.WriteString(strings.Join(headers, ", ") + "\n")
	}
	for _, g := range view.GPUs {
		values := Values(g, len(view.GPUs), *view.Driver, c, now)
		row := make([]string, len(canonical))
		for j, f := range canonical {
			value, unit := values[f], c.Fields[f].Unit
			if options["nounits"] && unit != "" && strings.HasSuffix(value, " "+unit) {
				value = strings.TrimSuffix(value, " "+unit)
			}
			row[j] = value
		}
		b.WriteString(strings.Join(row, ", ") + "\n")
	}
	return b.String(), 0
}

func tableName(name string, width int) string {
	if len(name) <= width {
		return name
	}
	return name[:width-3] + "..."
}

func eccCell(g GPU) string {
	switch {
	case g.MIGEnabled:
		return "On"
	case g.ECC:
		return strconv.Itoa(g.ECCErrorsUncorrected)
	}
	return "N/A"
}

func migMode(g GPU) string {
	if g.MIGEnabled {
		return "Enabled"
	}
	return "Disabled"
}

// modernTable is the 91-column layout of R530+ drivers (the R580+ variant from R580 on).
func modernTable(view View, c Capture, now time.Time) []string {
	d := *view.Driver
	plus := major(d.DriverVersion) >= 580
	corner := "|"
	if plus {
		corner = "+"
	}
	dash, eq, rep := "-", "=", strings.Repeat
	lines := []string{
		"+" + rep(dash, 89) + "+",
		fmt.Sprintf("| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|", d.DriverVersion, d.DriverVersion, d.CUDAVersion),
		corner + rep(dash, 41) + "+" + rep(dash, 24) + "+" + rep(dash, 22) + "+",
		"| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
		"| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
		"|                                         |                        |               MIG M. |",
		"|" + rep(eq, 41) + "+" + rep(eq, 24) + "+" + rep(eq, 22) + "|",
	}
	separator := "+" + rep(dash, 41) + "+" + rep(dash, 24) + "+" + rep(dash, 22) + "+"
	for _, g := range view.GPUs {
		v := Values(g, len(view.GPUs), d, c, now)
		util := "N/A"
		if !g.MIGEnabled {
			util = strings.ReplaceAll(v["utilization.gpu"], " ", "")
		}
		lines = append(lines,
			fmt.Sprintf("|%4d  %-31s%-3s |%19s %3s |%21s |", g.Number, tableName(g.Name, 31), "On", g.BusID, "Off", eccCell(g)),
			fmt.Sprintf("| %3s   %2sC    %-2s%15dW / %4dW |%8dMiB / %6dMiB |%8s%13s |",
				"N/A", v["temperature.gpu"], "P0", g.IdlePowerW, g.PowerCapW, firstInt(v["memory.used"]), g.MemoryMiB, util, "Default"),
			fmt.Sprintf("|%41s|%24s|%21s |", "", "", migMode(g)),
			separator,
		)
	}
	spacer := rep(" ", 89)
	if plus {
		spacer = ""
	}
	if rows := migTable(view.GPUs); rows != nil {
		lines = append(append(lines, spacer), rows...)
	}
	header := "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |"
	if major(d.DriverVersion) >= 570 {
		header = "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"
	}
	return append(lines,
		spacer,
		"+"+rep(dash, 89)+"+",
		"| Processes:"+rep(" ", 78)+"|",
		header,
		"|        ID   ID                                                               Usage      |",
		"|"+rep(eq, 89)+"|",
		"|  No running processes found"+rep(" ", 61)+"|",
		"+"+rep(dash, 89)+"+",
	)
}

// migTable is the R590 "MIG devices" table, with the container's MIG devices only.
func migTable(gpus []GPU) []string {
	rep := strings.Repeat
	sep := "+" + rep("-", 18) + "+" + rep("-", 34) + "+" + rep("-", 11) + "+" + rep("-", 23) + "+"
	var lines []string
	for _, g := range gpus {
		for dev, m := range g.MIG {
			lines = append(lines,
				fmt.Sprintf("|%3d%5d%4d%4d  |%16dMiB / %5dMiB    | %2d%7d |%3d%4d%5d%5d%5d |",
					g.Number, m.GI, m.CI, dev, 0, m.MemoryMiB, m.Multiprocessors, g.ECCErrorsUncorrected,
					m.CopyEngines, m.Encoders, m.Decoders, m.OFA, m.JPEG),
				fmt.Sprintf("|%18s|%16dMiB / %5dMiB    |%11s|%23s|", "", 0, m.Bar1MiB, "", ""),
				sep,
			)
		}
	}
	if lines == nil {
		return nil
	}
	return append([]string{
		"+" + rep("-", 89) + "+",
		"| MIG devices:" + rep(" ", 76) + "|",
		sep,
		"| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
		"|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
		"|                  |                                  |        ECC|                       |",
		"|" + rep("=", 18) + "+" + rep("=", 34) + "+" + rep("=", 11) + "+" + rep("=", 23) + "|",
	}, lines...)
}

// legacyTable is the 79-column layout of drivers before R530 (e.g. 470.82.01, 510.47.03).
func legacyTable(view View) []string {
	d := *view.Driver
	rep := strings.Repeat
	lines := []string{
		"+" + rep("-", 77) + "+",
		fmt.Sprintf("| NVIDIA-SMI %-13sDriver Version: %-13sCUDA Version: %-9s|", d.DriverVersion, d.DriverVersion, d.CUDAVersion),
		"|" + rep("-", 31) + "+" + rep("-", 22) + "+" + rep("-", 22) + "+",
		"| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
		"| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |",
		"|                               |                      |               MIG M. |",
		"|" + rep("=", 31) + "+" + rep("=", 22) + "+" + rep("=", 22) + "|",
	}
	for _, g := range view.GPUs {
		util := fmt.Sprintf("%d%%", clamp(g.Usage.GPUUtilPercent, 0, 100))
		if g.MIGEnabled {
			util = "N/A"
		}
		lines = append(lines,
			fmt.Sprintf("|%4d  %-18s  %-3s  | %s %3s |%21s |", g.Number, tableName(g.Name, 18), "On", g.BusID, "Off", eccCell(g)),
			fmt.Sprintf("| %3s   %2dC    %-2s%6dW / %3dW |%7dMiB / %5dMiB |%8s%13s |",
				"N/A", 41, "P0", g.IdlePowerW, g.PowerCapW, clamp(g.Usage.FBUsedMiB, 0, g.MemoryMiB), g.MemoryMiB, util, "Default"),
			fmt.Sprintf("|%31s|%22s|%21s |", "", "", migMode(g)),
			"+"+rep("-", 31)+"+"+rep("-", 22)+"+"+rep("-", 22)+"+",
		)
	}
	return append(lines,
		"",
		"+"+rep("-", 77)+"+",
		"| Processes:"+rep(" ", 66)+"|",
		"|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |",
		"|        ID   ID                                                   Usage      |",
		"|"+rep("=", 77)+"|",
		"|  No running processes found"+rep(" ", 49)+"|",
		"+"+rep("-", 77)+"+",
	)
}

// Table is the default nvidia-smi output, timestamp line first.
func Table(view View, c Capture, now time.Time) string {
	stamp := fmt.Sprintf("%-31s", now.Format("Mon Jan _2 15:04:05 2006"))
	var body []string
	if major(view.Driver.DriverVersion) >= 530 {
		body = modernTable(view, c, now)
	} else {
		body = legacyTable(view)
	}
	return strings.Join(append([]string{stamp}, body...), "\n") + "\n"
}

// ListGPUs is nvidia-smi -L.
func ListGPUs(view View) string {
	var b strings.Builder
	for _, g := range view.GPUs {
		fmt.Fprintf(&b, "GPU %d: %s (UUID: %s)\n", g.Number, g.Name, g.UUID)
		for dev, m := range g.MIG {
			fmt.Fprintf(&b, "  MIG %-12sDevice %2d: (UUID: %s)\n", m.Profile, dev, m.UUID)
		}
	}
	return b.String()
}

// Version is nvidia-smi --version (the R5xx form).
func Version(d Driver) string {
	parts := strings.Split(d.DriverVersion, ".")
	nvml := strings.Join(parts[:min(2, len(parts))], ".")
	return fmt.Sprintf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\nCUDA Version        : %s\n",
		d.DriverVersion, nvml, d.DriverVersion, d.CUDAVersion)
}

// Args is the subset of nvidia-smi's options emulated.
type Args struct {
	Mode   string // table | list | version | query
	Query  string
	Format string
	IDs    []string
}

// ParseArgs parses the command line; false for anything not emulated.
func ParseArgs(argv []string) (Args, bool) {
	a := Args{Mode: "table"}
	for i := 0; i < len(argv); i++ {
		arg := argv[i]
		key, value, eq := strings.Cut(arg, "=")
		next := func() string {
			if eq {
				return value
			}
			i++
			if i < len(argv) {
				return argv[i]
			}
			return ""
		}
		switch {
		case arg == "-L" || arg == "--list-gpus":
			a.Mode = "list"
		case arg == "--version":
			a.Mode = "version"
		case key == "--query-gpu" || key == "-q-gpu":
			a.Mode = "query"
			a.Query = next()
		case key == "--format":
			a.Format = next()
		case key == "-i" || key == "--id":
			a.IDs = strings.Split(next(), ",")
		default:
			return a, false
		}
	}
	if a.Mode == "query" && a.Format == "" {
		return a, false
	}
	return a, true
}

// refusedOption is the option a real nvidia-smi refuses for this mode, or "": -L lists
// every GPU and takes no -i (580.159.04 answers `-i 0 -L` with exit 2).
func refusedOption(a Args) string {
	if a.Mode == "list" && a.IDs != nil {
		return "-i"
	}
	return ""
}

// Run behaves like `nvidia-smi argv` on the view: stdout, stderr, exit code.
func Run(argv []string, view View, c Capture, now time.Time) (string, string, int) {
	args, ok := ParseArgs(argv)
	if !ok {
		return invalidArgs + "\n", "", RCInvalidArgument
	}
	if option := refusedOption(args); option != "" {
		return fmt.Sprintf(invalidOption, option) + "\n\n", "", RCInvalidArgument
	}
	if view.Driver == nil || !view.Driver.Loaded {
		return driverNotLoaded + "\n\n", driverNotLoaded + "\n", RCDriverNotLoaded
	}
	if args.Mode == "version" {
		return Version(*view.Driver), "", 0
	}
	var gpus []GPU
	for _, g := range view.GPUs {
		if !g.Missing {
			g.Number = len(gpus)
			gpus = append(gpus, g)
		}
	}
	if args.IDs != nil {
		wanted := map[string]bool{}
		for _, id := range args.IDs {
			wanted[strings.TrimSpace(id)] = true
		}
		var chosen []GPU
		for _, g := range gpus {
			if wanted[strconv.Itoa(g.Number)] || wanted[g.UUID] {
				chosen = append(chosen, g)
			}
		}
		gpus = chosen
	}
	view.GPUs = gpus
	if len(gpus) == 0 {
		return noDevices + "\n", "", RCNotFound
	}
	var lost []string
	for _, g := range gpus {
		if g.Lost {
			lost = append(lost, fmt.Sprintf(gpuLost, g.BusID[min(4, len(g.BusID)):])+"\n")
		}
	}
	if lost != nil {
		return strings.Join(lost, ""), "", RCGPULost
	}
	switch args.Mode {
	case "list":
		return ListGPUs(view), "", 0
	case "query":
		out, rc := QueryGPU(view, args.Query, args.Format, c, now)
		return out, "", rc
	}
	return Table(view, c, now), "", 0
}
