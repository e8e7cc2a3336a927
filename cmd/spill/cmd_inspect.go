package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spill-ml/spill/dataset"
)

func init() {
	register(&command{name: "inspect", summary: "describe a dataset and optionally verify its checksums", run: runInspect})
}

const inspectUsage = `Usage: spill inspect DIR [--verify] [--json]

Prints a dataset's schema, sample counts, a table of its shards (samples, size,
chunks, compression ratio) and total sizes. Opening the dataset checks the
manifest against every shard's header and footer; --verify also reads every
chunk and checks its checksum, and fails naming the first broken shard and chunk.

Examples:
  spill inspect data/shakespeare
  spill inspect data/owt --verify
  spill inspect data/owt --json | jq .samples`

// inspectReport is the --json output of spill inspect.
type inspectReport struct {
	Dir           string              `json:"dir"`
	FormatVersion int                 `json:"format_version"`
	Created       string              `json:"created"`
	Schema        dataset.Schema      `json:"schema"`
	SampleSize    int                 `json:"sample_size"`
	Samples       int64               `json:"samples"`
	Tokens        int64               `json:"tokens,omitempty"`
	Compression   dataset.Compression `json:"compression"`
	ChunkSize     int                 `json:"chunk_size"`
	Shards        []inspectShard      `json:"shards"`
	Chunks        int                 `json:"chunks"`
	RawBytes      int64               `json:"raw_bytes"`
	StoredBytes   int64               `json:"stored_bytes"`
	FileBytes     int64               `json:"file_bytes"`
	Ratio         float64             `json:"compression_ratio"` // raw / stored
	Verify        *verifyReport       `json:"verify,omitempty"`
}

type inspectShard struct {
	Name        string  `json:"name"`
	FirstSample int64   `json:"first_sample"`
	Samples     int64   `json:"samples"`
	Size        int64   `json:"size"`
	Chunks      int     `json:"chunks"`
	RawBytes    int64   `json:"raw_bytes"`
	StoredBytes int64   `json:"stored_bytes"`
	Ratio       float64 `json:"compression_ratio"`
}

type verifyReport struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", inspectUsage, stderr)
	verify := fs.Bool("verify", false, "read every chunk and check its checksum")
	asJSON := fs.Bool("json", false, "print a machine-readable JSON report")
	quiet := fs.Bool("quiet", false, "print no progress while verifying")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("inspect: want one dataset directory, got %d arguments", len(pos))
	}
	d, err := dataset.Open(pos[0])
	if err != nil {
		return err
	}
	defer d.Close()
	rep := newInspectReport(pos[0], d)

	var verr error
	if *verify {
		prog := newProgress(stderr, "verify", unitBytes, *quiet)
		prog.SetTotal(rep.StoredBytes)
		prog.Start()
		verr = d.Verify(ctx, func(done, total int64) { prog.Set(done) })
		prog.Stop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rep.Verify = &verifyReport{OK: verr == nil}
		if verr != nil {
			rep.Verify.Error = verr.Error()
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		printInspect(stdout, rep)
	}
	if verr != nil {
		return fmt.Errorf("verify %s: %w", pos[0], verr)
	}
	return nil
}

func newInspectReport(dir string, d *dataset.Dataset) *inspectReport {
	m := d.Manifest()
	rep := &inspectReport{Dir: dir, FormatVersion: m.FormatVersion, Created: m.Created, Schema: m.Schema,
		SampleSize: d.SampleSize(), Samples: m.Samples, Tokens: m.Tokens, Compression: m.Compression,
		ChunkSize: m.ChunkSize, RawBytes: m.RawBytes, StoredBytes: m.StoredBytes,
		Ratio: ratio(m.RawBytes, m.StoredBytes), Shards: []inspectShard{}}
	for _, s := range m.Shards {
		rep.Shards = append(rep.Shards, inspectShard{Name: s.Name, FirstSample: s.FirstSample, Samples: s.Samples,
			Size: s.Size, Chunks: s.Chunks, RawBytes: s.RawBytes, StoredBytes: s.StoredBytes,
			Ratio: ratio(s.RawBytes, s.StoredBytes)})
		rep.Chunks += s.Chunks
		rep.FileBytes += s.Size
	}
	return rep
}

// describeSchema renders a schema on one line.
func describeSchema(s dataset.Schema, sampleSize int) string {
	switch s.Kind {
	case dataset.KindTokens:
		vocab := "vocab unknown"
		if s.VocabSize > 0 {
			vocab = fmt.Sprintf("vocab %d", s.VocabSize)
		}
		if s.Tokenizer != "" {
			vocab += ", tokenizer " + s.Tokenizer
		}
		return fmt.Sprintf("tokens %s, seq_len %d (%d tokens, %d bytes per sample), %s",
			s.TokenDType, s.SeqLen, s.SeqLen+1, sampleSize, vocab)
	case dataset.KindRecords:
		out := fmt.Sprintf("records of %d %s features + %s label (%d bytes per sample)",
			s.Features, s.FeatureDType, s.LabelDType, sampleSize)
		if len(s.Columns) > 0 {
			cols := s.Columns
			more := ""
			if len(cols) > 8 {
				cols, more = cols[:8], fmt.Sprintf(", ... (%d more)", len(s.Columns)-8)
			}
			out += fmt.Sprintf("; features %s%s", strings.Join(cols, ", "), more)
		}
		if s.Label != "" {
			out += fmt.Sprintf("; label %s", s.Label)
		}
		if n := len(s.LabelClasses); n > 0 {
			cls := make([]string, 0, min(n, 8))
			for i, c := range s.LabelClasses[:min(n, 8)] {
				cls = append(cls, fmt.Sprintf("%d=%s", i, c))
			}
			more := ""
			if n > 8 {
				more = fmt.Sprintf(", ... (%d classes)", n)
			}
			out += fmt.Sprintf("; classes %s%s", strings.Join(cls, ", "), more)
		}
		return out
	}
	return string(s.Kind) + " (variable-length records)"
}

func printInspect(w io.Writer, r *inspectReport) {
	fmt.Fprintf(w, "dataset      %s\n", r.Dir)
	fmt.Fprintf(w, "format       version %d, created %s\n", r.FormatVersion, r.Created)
	fmt.Fprintf(w, "schema       %s\n", describeSchema(r.Schema, r.SampleSize))
	if r.Schema.Kind == dataset.KindTokens {
		fmt.Fprintf(w, "samples      %d (%d tokens)\n", r.Samples, r.Tokens)
	} else {
		fmt.Fprintf(w, "samples      %d\n", r.Samples)
	}
	fmt.Fprintf(w, "compression  %s, %s chunks\n\n", r.Compression, formatBytes(int64(r.ChunkSize)))

	// Right-aligned numbers; names padded to one width so that they read left-aligned.
	total := fmt.Sprintf("total (%d)", len(r.Shards))
	nw := len(total)
	for _, s := range r.Shards {
		nw = max(nw, len(s.Name))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%-*s\tFIRST\tSAMPLES\tSIZE\tCHUNKS\tRATIO\t\n", nw, "SHARD")
	for _, s := range r.Shards {
		fmt.Fprintf(tw, "%-*s\t%d\t%d\t%s\t%d\t%.2f\t\n", nw, s.Name, s.FirstSample, s.Samples, formatBytes(s.Size), s.Chunks, s.Ratio)
	}
	fmt.Fprintf(tw, "%-*s\t\t%d\t%s\t%d\t%.2f\t\n", nw, total, r.Samples, formatBytes(r.FileBytes), r.Chunks, r.Ratio)
	tw.Flush()
	fmt.Fprintf(w, "\nraw %s, stored %s, files %s, compression ratio %.2f\n",
		formatBytes(r.RawBytes), formatBytes(r.StoredBytes), formatBytes(r.FileBytes), r.Ratio)
	if r.Verify != nil {
		if r.Verify.OK {
			fmt.Fprintf(w, "verify       ok: %d chunks in %d shards\n", r.Chunks, len(r.Shards))
		} else {
			fmt.Fprintf(w, "verify       FAILED: %s\n", r.Verify.Error)
		}
	}
}
