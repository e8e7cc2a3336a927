package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// newFlagSet returns a flag set for a subcommand. usage is printed, followed
// by the flag defaults, for --help and after a flag error.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("spill "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), usage)
		fmt.Fprintln(fs.Output(), "\nFlags:")
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs. --help yields a silent exit 0; a bad flag
// (already reported by the flag package) yields a silent usage exit 2.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return &silentError{code: exitOK}
	default:
		return &silentError{code: exitUsage}
	}
}

// parseInterspersed parses flags that may appear before or after positional
// arguments ("spill inspect DIR --verify") and returns the positionals.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
