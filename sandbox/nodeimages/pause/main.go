// Command pause is the first process of every pod sandbox on the sandbox's
// real nodes: it holds the pod's namespaces, reaps orphans (it is pid 1 of a
// pod with a shared pid namespace) and exits on SIGTERM or SIGINT, as
// Kubernetes' own pause image does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
