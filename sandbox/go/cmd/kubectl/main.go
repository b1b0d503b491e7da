// Command kubectl is upstream's kubectl (k8s.io/kubectl at the staging version of
// the k8s.io/kubernetes pin in go.mod), for the local cluster.
//
// It is its own binary rather than a command of the k8s binary: changing it
// never relinks k8s, and its packages (cli-runtime, kustomize, the kubectl
// commands) stay out of every control-plane process.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

// As upstream's cmd/kubectl, without the cloud providers' client auth plugins:
// the local cluster's kubeconfigs hold client certificates and tokens only.
func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		// Pretty-print the error and exit with an error, as upstream does.
		util.CheckErr(err)
	}
}
