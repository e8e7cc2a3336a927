package main

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spill-ml/spill/engine"
)

func TestProgressLine(t *testing.T) {
	p := newProgress(nil, "convert", unitBytes, false)
	got := p.line(1<<30, 4<<30, 512<<20)
	for _, want := range []string{"convert [======", " 25.0%", "1.0 GiB/4.0 GiB", "512.0 MiB/s", "ETA 6s"} {
		if !strings.Contains(got, want) {
			t.Errorf("line %q lacks %q", got, want)
		}
	}
	if got := p.line(10, 0, 0); got != "convert 10 B" {
		t.Errorf("unknown total: %q", got)
	}
	c := newProgress(nil, "train", unitCount, false)
	if got := c.line(50, 100, 10); !strings.Contains(got, "50/100") || !strings.Contains(got, "10/s") || !strings.Contains(got, "ETA 5s") {
		t.Errorf("count line %q", got)
	}
}

func TestProgressQuietOffTerminal(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, "x", unitBytes, false) // a buffer is not a terminal
	p.SetTotal(100)
	p.Start()
	p.Add(100)
	p.Stop()
	p.Stop() // idempotent
	if buf.Len() != 0 || p.Value() != 100 {
		t.Fatalf("drew %q on a non-terminal; value %d", buf.String(), p.Value())
	}
}

func TestProgressDraws(t *testing.T) {
	var buf bytes.Buffer
	p := newProgress(&buf, "verify", unitBytes, false)
	p.draw = true // pretend buf is a terminal
	p.interval = time.Millisecond
	var n atomic.Int64
	p.Track(n.Load)
	p.SetTotal(1 << 20)
	p.Start()
	n.Store(1 << 19)
	time.Sleep(20 * time.Millisecond)
	n.Store(1 << 20)
	p.Stop() // the ticker has exited; reading buf is safe now
	out := buf.String()
	if !strings.HasPrefix(out, "\r\x1b[K") || !strings.HasSuffix(out, "\n") || !strings.Contains(out, "100.0% 1.0 MiB/1.0 MiB") {
		t.Fatalf("output %q", out)
	}
}

func TestFormatting(t *testing.T) {
	bytesCases := map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 64 << 20: "64.0 MiB", 300 << 30: "300.0 GiB"}
	for n, want := range bytesCases {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
	durCases := map[time.Duration]string{42 * time.Second: "42s", 185 * time.Second: "3m05s", 3720 * time.Second: "1h02m"}
	for d, want := range durCases {
		if got := engine.FormatDuration(d); got != want {
			t.Errorf("engine.FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}
