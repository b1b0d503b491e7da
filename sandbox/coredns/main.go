// The local cluster's DNS server: CoreDNS, built from its Go module with only
// the plugins a Kubernetes cluster's DNS needs.
//
// CoreDNS's own main links every plugin it ships (the cloud providers' among
// them); this one links the plugins named below, in the order of CoreDNS's
// plugin.cfg, which decides the order a query passes them. There is no
// `forward` plugin: names outside the cluster are never sent anywhere (and so
// no forwarding loop can form, which is what CoreDNS's `loop` plugin guards
// against).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The order of CoreDNS v1.15's plugin.cfg, restricted to the plugins above.
var directives = []string{
	"bind",
	"ready",
	"health",
	"errors",
	"log",
	"cache",
	"kubernetes",
}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
