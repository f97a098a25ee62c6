// Command helm is the upstream Helm client, built from the Go module proxy
// for the test/k8s harness (the docs test runs docs/operations.md's helm
// commands with it). It is not part of marksplit.
package main

import (
	"errors"
	"log/slog"
	"os"

	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"helm.sh/helm/v4/pkg/kube"
)

func main() {
	kube.ManagedFieldsManager = "helm"
	cmd, err := helmcmd.NewRootCmd(os.Stdout, os.Args[1:], helmcmd.SetupLogging)
	if err != nil {
		slog.Warn("command failed", slog.Any("error", err))
		os.Exit(1)
	}
	if err := cmd.Execute(); err != nil {
		var cerr helmcmd.CommandError
		if errors.As(err, &cerr) {
			os.Exit(cerr.ExitCode)
		}
		os.Exit(1)
	}
}
