package gpuusage

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	now := time.Unix(1000, 0)
	cases := []struct {
		name string
		doc  string
		want Usage
	}{
		{"live", `{"gpu_util_percent": 87, "fb_used_mib": 2048, "until": 1001}`, Usage{87, 2048}},
		{"fractional until", `{"gpu_util_percent": 50.4, "fb_used_mib": 1, "until": 1000.5}`, Usage{50, 1}},
		{"expired", `{"gpu_util_percent": 87, "fb_used_mib": 2048, "until": 1000}`, Usage{}},
		{"no until", `{"gpu_util_percent": 87, "fb_used_mib": 2048}`, Usage{}},
		{"clamped", `{"gpu_util_percent": 250, "fb_used_mib": -5, "until": 2000}`, Usage{100, 0}},
		{"util only", `{"gpu_util_percent": 10, "until": 2000}`, Usage{10, 0}},
		{"not json", `{"gpu_util`, Usage{}},
		{"wrong types", `{"gpu_util_percent": "high", "until": 2000}`, Usage{}},
	}
	for _, c := range cases {
		if got := Parse([]byte(c.doc), now); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestReadMissingIsIdle(t *testing.T) {
	dir := t.TempDir()
	if got := Read(dir, "GPU-x", time.Now()); got != (Usage{}) {
		t.Fatalf("missing file: got %+v", got)
	}
	os.MkdirAll(filepath.Join(dir, "GPU-x"), 0o755)
	os.WriteFile(filepath.Join(dir, "GPU-x", FileName), []byte(`{"gpu_util_percent": 40, "until": 4102444800}`), 0o644)
	if got := Read(dir, "GPU-x", time.Unix(1000, 0)); got.UtilPercent != 40 {
		t.Fatalf("written file: got %+v", got)
	}
}
