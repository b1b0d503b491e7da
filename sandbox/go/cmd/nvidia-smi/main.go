// Command nvidia-smi is the sandbox's emulated nvidia-smi (package nvidiasmi),
// a static binary that NVIDIA's container runtime mounts into GPU containers.
//
// Where it reads the driver's files is set at link time from the constants of
// sandbox/gpuspawner_sandbox/gpudriver.py (nodebuild passes them with -X), so
// the layout is written down in one place. A binary linked without them knows
// no driver and says so, as nvidia-smi does without one.
package main

import (
	"fmt"
	"os"
	"time"

	"gpuspawner/sandbox/k8s/nvidiasmi"
)

// Set with -ldflags "-X main.name=value" (see gpuspawner_sandbox.nodebuild).
var (
	viewRoot        string
	driverDir       string
	gpusDir         string
	usageDir        string
	driverFile      string
	gpuFile         string
	usageFile       string
	capsDir         string
	emulatedRootEnv string
)

func main() {
	layout := nvidiasmi.Layout{
		ViewRoot:        viewRoot,
		DevRoot:         "/dev",
		DriverDir:       driverDir,
		GPUsDir:         gpusDir,
		UsageDir:        usageDir,
		DriverFile:      driverFile,
		GPUFile:         gpuFile,
		UsageFile:       usageFile,
		CapsDir:         capsDir,
		EmulatedRootEnv: emulatedRootEnv,
	}.Rooted(os.Getenv)
	capture, err := nvidiasmi.LoadCapture()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvidia-smi: the embedded capture is unreadable: %v\n", err)
		os.Exit(1)
	}
	now := time.Now()
	var view nvidiasmi.View
	if viewRoot != "" {
		view = nvidiasmi.Load(layout, now)
	}
	stdout, stderr, rc := nvidiasmi.Run(os.Args[1:], view, capture, now)
	os.Stdout.WriteString(stdout)
	os.Stderr.WriteString(stderr)
	os.Exit(rc)
}
