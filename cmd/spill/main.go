// Command spill is an out-of-core deep-learning trainer.
//
// Each subcommand lives in its own file (cmd_<name>.go) and registers itself
// in init. Errors are mapped to exit codes once, here: 0 success, 1 failure,
// 2 usage error, 130 interrupted (Ctrl-C).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130
)

// command is one subcommand. run receives the arguments after the
// subcommand's name; it parses its own flags.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("spill: duplicate command " + c.name)
	}
	commands[c.name] = c
}

// usageError marks an error caused by how spill was invoked (bad flag, bad
// argument count). It maps to exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errSilent is returned by a command that has already printed what went
// wrong (for example flag.ContinueOnError's own message); main prints nothing
// more but still exits with the mapped code.
type silentError struct {
	code int
}

func (e *silentError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// runMain dispatches to a subcommand and maps its error to an exit code.
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 && args[0] == "help" {
			if c, ok := commands[args[1]]; ok {
				return exitCode(c.run(ctx, []string{"--help"}, stdout, stderr), stderr)
			}
		}
		printUsage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" || args[0] == "-version" || args[0] == "version" {
		printVersion(stdout)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "spill: unknown command %q\n\n", args[0])
		printUsage(stderr)
		return exitUsage
	}
	return exitCode(c.run(ctx, args[1:], stdout, stderr), stderr)
}

// exitCode is the one place errors become exit codes.
func exitCode(err error, stderr io.Writer) int {
	var ue *usageError
	var se *silentError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &se):
		return se.code
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "spill: interrupted")
		return exitInterrupted
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "spill: %v\n(see 'spill help')\n", err)
		return exitUsage
	default:
		fmt.Fprintf(stderr, "spill: %v\n", err)
		return exitFailure
	}
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, `spill trains deep-learning models larger than the accelerator's memory by
streaming weights, optimizer state and activations between device, host and disk.

Usage:
  spill <command> [flags] [arguments]

Commands:`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, `
Run 'spill <command> --help' for a command's flags and examples, and
'spill --version' for the version, commit and build.`)
}
