package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
)

func TestWithoutFlag(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"--nproc-per-node", "2", "--steps", "3"}, []string{"--steps", "3"}},
		{[]string{"--steps=3", "-nproc-per-node=4"}, []string{"--steps=3"}},
		{[]string{"--data", "nproc-per-node", "--nproc-per-node-x", "1"}, []string{"--data", "nproc-per-node", "--nproc-per-node-x", "1"}},
		{[]string{"--", "--nproc-per-node", "2"}, []string{"--", "--nproc-per-node", "2"}},
	} {
		if got := withoutFlag(tc.in, "nproc-per-node"); !slices.Equal(got, tc.want) {
			t.Errorf("withoutFlag(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestNprocPerNodeRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"train", "--nproc-per-node", "-1"}, "", "--nproc-per-node -1: want at least 1"},
		{[]string{"train", "--nproc-per-node", "2"}, "2", "launched as a rank (WORLD_SIZE=2)"},
	} {
		if tc.env != "" {
			t.Setenv("WORLD_SIZE", tc.env)
		}
		var out, errOut bytes.Buffer
		if code := runMain(context.Background(), tc.args, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut.String(), exitUsage, tc.want)
		}
	}
}
