package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile starts a Go CPU profile written to path; stop ends it and
// reports any error of writing or closing the file.
func startCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return nil, errors.Join(fmt.Errorf("--cpu-profile %s: %w", path, err), f.Close(), os.Remove(path))
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := errors.Join(f.Sync(), f.Close()); err != nil {
			return fmt.Errorf("--cpu-profile %s: %w", path, err)
		}
		return nil
	}, nil
}
