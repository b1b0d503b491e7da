package nvidiasmi

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// Layout names where the driver's projections and device nodes are. The
// values come from gpudriver.py's constants (nodebuild passes them to the
// linker), so the paths are written down once.
type Layout struct {
	ViewRoot        string // CONTAINER_VIEW_ROOT
	DevRoot         string // /dev
	DriverDir       string // VIEW_DRIVER_DIR, under ViewRoot
	GPUsDir         string // VIEW_GPUS_DIR
	UsageDir        string // USAGE_DIR
	DriverFile      string // DRIVER_VIEW_FILE
	GPUFile         string // GPU_VIEW_FILE
	UsageFile       string // USAGE_FILE
	CapsDir         string // NVIDIA_CAPS_DIR, under DevRoot
	EmulatedRootEnv string // EMULATED_ROOT_ENV: test-only prefix of ViewRoot and DevRoot
}

// Rooted returns the layout with ViewRoot and DevRoot under the test-only
// override root (environment variable EmulatedRootEnv), if it is set.
func (l Layout) Rooted(getenv func(string) string) Layout {
	if l.EmulatedRootEnv == "" {
		return l
	}
	if root := getenv(l.EmulatedRootEnv); root != "" {
		l.ViewRoot = filepath.Join(root, l.ViewRoot)
		l.DevRoot = filepath.Join(root, l.DevRoot)
	}
	return l
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func readJSON(path string, into any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

// Load reads what the container was given. A GPU view that cannot be read is
// treated as not mounted; a usage file that cannot be read as an idle GPU.
func Load(l Layout, now time.Time) View {
	var view View
	var driver Driver
	if err := readJSON(filepath.Join(l.ViewRoot, l.DriverDir, l.DriverFile), &driver); err == nil {
		view.Driver = &driver
	}
	entries, err := os.ReadDir(filepath.Join(l.ViewRoot, l.GPUsDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return view
	}
	for _, e := range entries {
		var g GPU
		if err := readJSON(filepath.Join(l.ViewRoot, l.GPUsDir, e.Name(), l.GPUFile), &g); err != nil {
			continue
		}
		if !exists(filepath.Join(l.DevRoot, "nvidia"+strconv.Itoa(g.Minor))) {
			continue
		}
		var migs []MIG
		for _, m := range g.MIG {
			caps := filepath.Join(l.DevRoot, l.CapsDir, "nvidia-cap")
			if exists(caps+strconv.Itoa(m.GICapMinor)) && exists(caps+strconv.Itoa(m.CICapMinor)) {
				migs = append(migs, m)
			}
		}
		g.MIG = migs
		var u Usage
		if readJSON(filepath.Join(l.ViewRoot, l.UsageDir, g.UUID, l.UsageFile), &u) == nil {
			if float64(now.UnixNano())/1e9 < u.Until {
				g.Usage = u
			}
		}
		view.GPUs = append(view.GPUs, g)
	}
	sort.Slice(view.GPUs, func(i, j int) bool { return view.GPUs[i].BusID < view.GPUs[j].BusID })
	return view
}
