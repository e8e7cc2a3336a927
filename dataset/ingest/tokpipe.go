package ingest

import (
	"context"
	"unicode"
	"unicode/utf8"

	"github.com/spill-ml/spill/dataset/tokenize"
)

// Text is tokenized in parallel, in order, with bounded memory: the
// emitter collects the text of the current input into a job of about
// tokJobBytes (several short documents, or a piece of a long one cut where
// the pre-tokenizer would cut it too, see safeCut), hands full jobs to at
// most Workers goroutines and emits their ids in job order, waiting for the
// oldest job once 2*Workers are in flight. Memory is bounded by about
// 2*Workers jobs of text and ids, whatever the size of a document.
var (
	tokJobBytes = 1 << 20
	// tokHardCap is where a document with no safe cut point (a megabyte
	// without a line break or a space between two words) is cut anyway,
	// at a character boundary.
	tokHardCap = 16 << 20
)

// tokJob is a piece of text to encode: documents separated by EOT before
// each offset in eots.
type tokJob struct {
	text []byte
	eots []int
	out  chan []uint32
}

// tokPipe is the emitter's tokenizer pipeline.
type tokPipe struct {
	tk       tokenize.Tokenizer
	encoders chan tokenize.Encoder // one per worker
	sem      chan struct{}
	inflight []*tokJob // oldest first
	cur      *tokJob
	docStart int // offset of the current document in cur.text
}

func newTokPipe(tk tokenize.Tokenizer, workers int) *tokPipe {
	p := &tokPipe{tk: tk, encoders: make(chan tokenize.Encoder, workers), sem: make(chan struct{}, workers), cur: &tokJob{}}
	for range workers {
		p.encoders <- tk.NewEncoder()
	}
	return p
}

// beginDoc starts a document: EOT separates it from the previous one.
func (p *tokPipe) beginDoc(first bool) {
	if !first {
		p.cur.eots = append(p.cur.eots, len(p.cur.text))
	}
	p.docStart = len(p.cur.text)
}

// text adds text to the current document; emit receives the ids of jobs
// that finish.
func (p *tokPipe) text(ctx context.Context, b []byte, emit func([]uint32) error) error {
	p.cur.text = append(p.cur.text, b...)
	for len(p.cur.text) >= tokJobBytes {
		cut := safeCut(p.cur.text, p.docStart)
		if cut <= 0 {
			if len(p.cur.text) < tokHardCap {
				return nil // wait for a safe cut point
			}
			cut = runeCut(p.cur.text, len(p.cur.text)-utf8.UTFMax)
		}
		if err := p.submit(ctx, cut, emit); err != nil {
			return err
		}
	}
	return nil
}

// submit starts encoding cur.text[:cut] and keeps the rest as the
// current job.
func (p *tokPipe) submit(ctx context.Context, cut int, emit func([]uint32) error) error {
	j := p.cur
	rest := &tokJob{text: append(make([]byte, 0, max(tokJobBytes, len(j.text)-cut)), j.text[cut:]...)}
	for len(j.eots) > 0 && j.eots[len(j.eots)-1] >= cut {
		// An EOT at the cut belongs before the rest.
		rest.eots = append([]int{j.eots[len(j.eots)-1] - cut}, rest.eots...)
		j.eots = j.eots[:len(j.eots)-1]
	}
	j.text = j.text[:cut]
	p.cur, p.docStart = rest, max(0, p.docStart-cut)
	return p.start(ctx, j, emit)
}

func (p *tokPipe) start(ctx context.Context, j *tokJob, emit func([]uint32) error) error {
	for len(p.inflight) >= 2*cap(p.sem) {
		if err := p.wait(ctx, emit); err != nil {
			return err
		}
	}
	j.out = make(chan []uint32, 1)
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.inflight = append(p.inflight, j)
	go func() {
		defer func() { <-p.sem }()
		enc := <-p.encoders
		ids := encodeJob(enc, p.tk.EOT(), j)
		p.encoders <- enc
		j.out <- ids
	}()
	return nil
}

// encodeJob encodes the documents of j, EOT between them.
func encodeJob(enc tokenize.Encoder, eot uint32, j *tokJob) []uint32 {
	ids := make([]uint32, 0, len(j.text)/3+len(j.eots))
	prev := 0
	for _, at := range j.eots {
		ids = enc.Encode(ids, j.text[prev:at])
		ids = append(ids, eot)
		prev = at
	}
	return enc.Encode(ids, j.text[prev:])
}

// wait emits the oldest job's ids.
func (p *tokPipe) wait(ctx context.Context, emit func([]uint32) error) error {
	j := p.inflight[0]
	var ids []uint32
	select {
	case ids = <-j.out:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.inflight = p.inflight[1:]
	return emit(ids)
}

// drain encodes what is left and emits every job's ids, in order (at the
// end of each input: no document spans two inputs).
func (p *tokPipe) drain(ctx context.Context, emit func([]uint32) error) error {
	if len(p.cur.text) > 0 || len(p.cur.eots) > 0 {
		j := p.cur
		p.cur, p.docStart = &tokJob{}, 0
		if err := p.start(ctx, j, emit); err != nil {
			return err
		}
	}
	for len(p.inflight) > 0 {
		if err := p.wait(ctx, emit); err != nil {
			return err
		}
	}
	return nil
}

// safeCut returns the last offset in text after docStart, or docStart
// itself when it is past the start, at which text can be cut without
// changing its pre-tokens (so its tokens): before a single space between
// two non-spaces (" word" starts a pre-token, and the one before ends), or
// after a line break between two non-spaces ("x\n" + "y": "\n" is a
// pre-token of its own). It returns 0 when there is none.
func safeCut(text []byte, docStart int) int {
	for i := len(text) - 2; i > docStart; i-- {
		c := text[i]
		if c != ' ' && c != '\n' {
			continue
		}
		before, _ := utf8.DecodeLastRune(text[docStart:i])
		after, _ := utf8.DecodeRune(text[i+1:])
		if before == utf8.RuneError || unicode.IsSpace(before) || unicode.IsSpace(after) {
			continue
		}
		if c == ' ' {
			return i
		}
		return i + 1
	}
	return docStart
}

// runeCut returns the start of the character that holds offset at.
func runeCut(text []byte, at int) int {
	for at > 0 && !utf8.RuneStart(text[at]) {
		at--
	}
	return at
}
