// CoreDNS for the e2e cluster's real node, with only the plugins its Corefile uses
// (e2e/node.sh). Upstream's main imports every plugin (cloud DNS providers, etcd, ...);
// this one compiles a fraction of that. The plugin order is upstream's
// (core/dnsserver/zdirectives.go), filtered to the imported plugins.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

var directives = []string{"bind", "ready", "health", "errors", "cache", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
