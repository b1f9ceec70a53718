package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

var cmdVersion = &command{
	name: "version", args: "", maxArgs: 0,
	summary: "print the version of tide and of Go it was built with",
	help: `
Print the version of this tide command: its module version when installed
with 'go install github.com/tidequeue/tide/cmd/tide@<version>', or "(devel)"
when built from a source checkout; the version of the tide library in it;
the Go version and platform it was built with; and the source revision when
the build recorded one.

Examples:
  tide version
  tide version --json | jq -r .version`,
	run: runVersion,
}

// versionJSON is `tide version --json`.
type versionJSON struct {
	Version        string `json:"version"`                   // this module's, or "(devel)"
	LibraryVersion string `json:"library_version,omitempty"` // github.com/tidequeue/tide's, when a dependency
	Go             string `json:"go"`
	OS             string `json:"os"`
	Arch           string `json:"arch"`
	Revision       string `json:"vcs_revision,omitempty"`
	Modified       bool   `json:"vcs_modified,omitempty"`
}

// buildVersion reads the build information of the running binary.
func buildVersion() versionJSON {
	v := versionJSON{Version: "(devel)", Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, d := range bi.Deps {
		if d.Path == "github.com/tidequeue/tide" {
			v.LibraryVersion = d.Version
			if d.Replace != nil {
				v.LibraryVersion = "(devel)" // a replace, as in the source tree
				if d.Replace.Version != "" {
					v.LibraryVersion = d.Replace.Version
				}
			}
		}
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func runVersion(_ context.Context, a *app, _ *cmdOpts, _ []string) error {
	v := buildVersion()
	if a.globals.json {
		return a.printJSON(v)
	}
	fmt.Fprintf(a.stdout, "tide %s, built with %s for %s/%s\n", v.Version, v.Go, v.OS, v.Arch)
	if v.LibraryVersion != "" && v.LibraryVersion != v.Version {
		fmt.Fprintf(a.stdout, "library github.com/tidequeue/tide %s\n", v.LibraryVersion)
	}
	if v.Revision != "" {
		rev := v.Revision
		if v.Modified {
			rev += " (with local changes)"
		}
		fmt.Fprintf(a.stdout, "revision %s\n", rev)
	}
	return nil
}
