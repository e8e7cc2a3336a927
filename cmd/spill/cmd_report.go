package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spill-ml/spill/cmd/spill/internal/report"
)

func init() {
	register(&command{name: "report", summary: "draw a training run's metrics as an HTML page of plots", run: runReport})
}

const reportUsage = `Usage: spill report METRICS.jsonl --out DIR [--trace TRACE.json] [--plan PLAN.json]

Draws a run written by 'spill train --metrics METRICS.jsonl' as one
self-contained HTML page, DIR/index.html (the plots are inlined: it opens
offline, and can be mailed as one file), and the plots as DIR/*.png:

  loss and eval loss against steps and against tokens
  tokens/s, and the model TFLOP/s it amounts to
  device and host memory against the trainer's plan
  each step's time split into compute, exposed transfer, host optimizer and
    loader wait (runs with --trace)
  bytes moved between device, host and disk per step (when recorded)

--trace adds the busy time of each track of the run's trace (spill train
--trace); --plan draws the budgets and throughput of 'spill plan --json'.
Plots whose fields the metrics lines lack are listed on the page as not
drawn, with what would draw them.

Example:
  spill train --steps 200 --metrics run.jsonl --trace trace.json
  spill report run.jsonl --trace trace.json --out report/`

func runReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("report", reportUsage, stderr)
	out := fs.String("out", "", "output `directory` (created; required)")
	trace := fs.String("trace", "", "Chrome trace `file` of the run (spill train --trace)")
	plan := fs.String("plan", "", "plan `file` (spill plan --json)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("report: want one metrics file, got %d arguments", len(pos))
	}
	if *out == "" {
		return usagef("report: --out is required")
	}
	run, err := report.Load(pos[0], *trace, *plan)
	if err != nil {
		return err
	}
	rep, err := report.Render(run)
	if err != nil {
		return err
	}
	files, err := rep.Write(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (%d plots from %d steps)\n", files[len(files)-1], len(rep.Charts), len(run.Steps))
	for _, m := range rep.Missing {
		fmt.Fprintf(stdout, "  not drawn: %s\n", m)
	}
	return nil
}
