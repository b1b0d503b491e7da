// Command tool is the sandbox's test image: one static binary with a few
// subcommands that tests run as real containers on real nodes.
//
//	tool sleep [SECONDS|infinity]   wait (exits 0 on SIGTERM)
//	tool fail CODE MESSAGE          write MESSAGE to /dev/termination-log, exit CODE
//	tool info                       print hostname=, pid=, memory_limit=, routes=
//	tool serve PORT                 answer HTTP GET with the same lines as info
//	tool alloc MIB                  touch MIB mebibytes of memory, then sleep
package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const usage = "usage: tool sleep [SECONDS|infinity] | fail CODE MESSAGE | info | serve PORT | alloc MIB"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "sleep":
		os.Exit(sleep(args))
	case "fail":
		os.Exit(fail(args))
	case "info":
		fmt.Print(info())
	case "serve":
		os.Exit(serve(args))
	case "alloc":
		os.Exit(alloc(args))
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}

func sleep(args []string) int {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var timeout <-chan time.Time
	if len(args) > 0 && args[0] != "infinity" {
		seconds, err := strconv.ParseFloat(args[0], 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "sleep: %q is not a number of seconds\n", args[0])
			return 2
		}
		timeout = time.After(time.Duration(seconds * float64(time.Second)))
	}
	select {
	case <-stop:
	case <-timeout:
	}
	return 0
}

func fail(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: tool fail CODE MESSAGE")
		return 2
	}
	code, err := strconv.Atoi(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "fail: %q is not an exit code\n", args[0])
		return 2
	}
	// The kubelet reads this file into the container's terminated state.
	if err := os.WriteFile("/dev/termination-log", []byte(args[1]), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "fail: %v\n", err)
	}
	fmt.Fprintln(os.Stderr, args[1])
	return code
}

// info describes the container as seen from inside it, one key=value a line.
func info() string {
	host, _ := os.Hostname()
	var b strings.Builder
	fmt.Fprintf(&b, "hostname=%s\n", host)
	fmt.Fprintf(&b, "pid=%d\n", os.Getpid())
	fmt.Fprintf(&b, "pid1=%s\n", cmdline(1))
	fmt.Fprintf(&b, "memory_limit=%s\n", memoryLimit())
	fmt.Fprintf(&b, "routes=%s\n", strings.Join(routes(), ","))
	fmt.Fprintf(&b, "addresses=%s\n", strings.Join(addresses(), ","))
	return b.String()
}

func cmdline(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "?"
	}
	return strings.TrimRight(strings.ReplaceAll(string(raw), "\x00", " "), " ")
}

// memoryLimit reads the limit of the container's own memory cgroup: cgroup v2
// (memory.max) or v1 (memory.limit_in_bytes), both mounted at /sys/fs/cgroup
// by the runtime.
func memoryLimit() string {
	for _, path := range []string{
		"/sys/fs/cgroup/memory.max",
		"/sys/fs/cgroup/memory/memory.limit_in_bytes",
	} {
		if raw, err := os.ReadFile(path); err == nil {
			return strings.TrimSpace(string(raw))
		}
	}
	return "?"
}

// routes lists the IPv4 routing table as DESTINATION/PREFIX[via GATEWAY].
func routes() []string {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return []string{"?"}
	}
	defer f.Close()
	var out []string
	scan := bufio.NewScanner(f)
	scan.Scan() // header
	for scan.Scan() {
		fields := strings.Fields(scan.Text())
		if len(fields) < 8 {
			continue
		}
		dst, gw, mask := hexIP(fields[1]), hexIP(fields[2]), hexIP(fields[7])
		ones, _ := net.IPMask(mask.To4()).Size()
		route := fmt.Sprintf("%s/%d", dst, ones)
		if !gw.Equal(net.IPv4zero) {
			route += " via " + gw.String()
		}
		out = append(out, route)
	}
	return out
}

func hexIP(s string) net.IP {
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		return net.IPv4zero
	}
	return net.IPv4(byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

func addresses() []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return []string{"?"}
	}
	var out []string
	for _, a := range addrs {
		out = append(out, a.String())
	}
	return out
}

func serve(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: tool serve PORT")
		return 2
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	server := &http.Server{
		Addr: ":" + args[0],
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, info())
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errs := make(chan error, 1)
	go func() { errs <- server.ListenAndServe() }()
	select {
	case <-stop:
		return 0
	case err := <-errs:
		fmt.Fprintf(os.Stderr, "serve: %v\n", err)
		return 1
	}
}

// alloc holds MIB mebibytes of written memory (so it is really resident),
// then sleeps: under a lower memory limit the kernel kills it first.
func alloc(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: tool alloc MIB")
		return 2
	}
	mib, err := strconv.Atoi(args[0])
	if err != nil || mib < 0 {
		fmt.Fprintf(os.Stderr, "alloc: %q is not a number of MiB\n", args[0])
		return 2
	}
	held := make([][]byte, 0, mib)
	for i := 0; i < mib; i++ {
		chunk := make([]byte, 1<<20)
		for j := 0; j < len(chunk); j += 4096 {
			chunk[j] = 1
		}
		held = append(held, chunk)
	}
	fmt.Printf("holding %d MiB\n", len(held))
	return sleep([]string{"infinity"})
}
