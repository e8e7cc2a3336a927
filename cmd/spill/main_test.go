package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/spill-ml/spill/kernels"
)

func TestExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if got := runMain(context.Background(), []string{"no-such-command"}, &out, &errb); got != exitUsage {
		t.Fatalf("unknown command: exit %d, want %d", got, exitUsage)
	}
	if !strings.Contains(errb.String(), "unknown command") {
		t.Fatalf("unknown command: stderr %q", errb.String())
	}
	cases := []struct {
		err  error
		want int
	}{
		{nil, exitOK},
		{fmt.Errorf("wrapped: %w", context.Canceled), exitInterrupted},
		{usagef("bad"), exitUsage},
		{fmt.Errorf("boom"), exitFailure},
		{&silentError{code: 7}, 7},
	}
	for _, c := range cases {
		if got := exitCode(c.err, io.Discard); got != c.want {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestHelpListsCommands(t *testing.T) {
	var out bytes.Buffer
	if got := runMain(context.Background(), []string{"--help"}, &out, io.Discard); got != exitOK {
		t.Fatalf("--help: exit %d", got)
	}
	for name := range commands {
		if !strings.Contains(out.String(), name) {
			t.Errorf("help does not list %q", name)
		}
	}
}

// TestVersion: spill --version names the version, commit, build tags and
// whether CUDA is built in.
func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		var out bytes.Buffer
		if code := runMain(context.Background(), []string{arg}, &out, io.Discard); code != exitOK {
			t.Fatalf("%s: exit %d", arg, code)
		}
		cuda := "cuda        off (build with -tags cuda"
		if slices.Contains(kernels.Backends(), "cuda") {
			cuda = "cuda        on"
		}
		for _, want := range []string{"spill ", "commit ", "build tags ", cuda, "backends    cpu", "go          go1."} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s: no %q in\n%s", arg, want, out.String())
			}
		}
	}
}
