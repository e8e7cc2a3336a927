package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/spill-ml/spill/kernels"
)

// printVersion writes what spill --version says: the module version, the
// commit it was built from (when the build stamped it), the build tags,
// whether CUDA is built in, and the Go toolchain.
func printVersion(w io.Writer) {
	version, commit, tags := "(devel)", "unknown (built without VCS stamping, e.g. go test or -buildvcs=false)", "none"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" {
			version = v
		}
		var rev, at string
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			case "-tags":
				if s.Value != "" {
					tags = s.Value
				}
			}
		}
		if rev != "" {
			commit = rev
			if at != "" {
				commit += " (" + at + ")"
			}
			if modified {
				commit += ", with uncommitted changes"
			}
		}
	}
	cuda := "off (build with -tags cuda for the GPU backend)"
	if slices.Contains(kernels.Backends(), "cuda") {
		cuda = "on"
	}
	fmt.Fprintf(w, "spill %s\n", version)
	fmt.Fprintf(w, "  commit      %s\n", commit)
	fmt.Fprintf(w, "  build tags  %s\n", tags)
	fmt.Fprintf(w, "  cuda        %s\n", cuda)
	fmt.Fprintf(w, "  backends    %s\n", strings.Join(kernels.Backends(), ", "))
	fmt.Fprintf(w, "  go          %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
