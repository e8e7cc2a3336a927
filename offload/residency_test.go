package offload

import (
	"errors"
	"strings"
	"testing"
)

func TestResidencyTransitions(t *testing.T) {
	tb := NewTable()
	w := Key{Layer: 3, Class: Weights}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	refuse := func(err error, reason string) {
		t.Helper()
		var te *TransitionError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), reason) {
			t.Fatalf("got %v, want a transition error about %q", err, reason)
		}
	}
	must(tb.Add(w, 100, TierHost))
	refuse(tb.Add(w, 100, TierHost), "already recorded")
	refuse(tb.BeginCopy(w, TierDevice, TierHost), "source device holds no valid copy")
	refuse(tb.BeginCopy(w, TierDisk, TierDevice), "no direct path disk->device")
	// Prefetch to the device.
	must(tb.BeginCopy(w, TierHost, TierDevice))
	refuse(tb.BeginCopy(w, TierHost, TierDisk), "another copy is in flight")
	refuse(tb.Evict(w, TierHost), "in flight")
	refuse(tb.Drop(w), "in flight")
	if b := tb.Bytes(TierDevice); b[Weights] != 100 {
		t.Fatalf("copy in flight not counted on its destination: %v", b)
	}
	must(tb.EndCopy(w))
	r, _ := tb.Get(w)
	if !r.Valid.Has(TierDevice) || !r.Valid.Has(TierHost) || r.InFlight || r.Valid.String() != "device+host" {
		t.Fatalf("after prefetch: %+v", r)
	}
	refuse(tb.EndCopy(w), "no copy in flight")
	// Used and dropped from the device: the host copy remains.
	must(tb.Evict(w, TierDevice))
	refuse(tb.Evict(w, TierHost), "only valid copy")

	// Gradients written on the device make older copies stale.
	g := Key{Layer: 3, Class: Grads}
	must(tb.Add(g, 50, TierDevice))
	must(tb.BeginCopy(g, TierDevice, TierHost))
	refuse(tb.Modified(g, TierDevice), "in flight")
	must(tb.EndCopy(g))
	must(tb.Modified(g, TierDevice))
	if r, _ := tb.Get(g); r.Valid.String() != "device" {
		t.Fatalf("after modify: %v", r.Valid)
	}
	refuse(tb.Modified(g, TierDisk), "disk holds no valid copy")
	// An aborted copy leaves the destination invalid.
	must(tb.BeginCopy(g, TierDevice, TierHost))
	must(tb.AbortCopy(g))
	if r, _ := tb.Get(g); r.Valid.Has(TierHost) {
		t.Fatal("aborted copy became valid")
	}

	must(tb.Add(Key{Layer: 1, Class: Master}, 400, TierDisk))
	snap := tb.Snapshot()
	if len(snap) != 3 || snap[0].Key != (Key{Layer: 1, Class: Master}) || snap[2].Key != g {
		t.Fatalf("snapshot order: %+v", snap)
	}
	must(tb.Drop(g))
	refuse(tb.Drop(g), "unknown tensor")
	if b := tb.Bytes(TierDisk); b[Master] != 400 || len(b) != 1 {
		t.Fatalf("disk bytes %v", b)
	}
	refuse(tb.Add(Key{Layer: 5, Class: Activations}, 1, TierNone), "cannot live on none")

	// Overwrite: written afresh on a tier that held no valid copy.
	a, c := Key{Layer: 2, Class: Activations}, Key{Layer: 2, Class: Activations, Part: PartCheckpoint}
	must(tb.Add(a, 10, TierHost))
	must(tb.Add(c, 5, TierDevice))
	must(tb.Overwrite(a, TierDevice))
	if r, _ := tb.Get(a); r.Valid.String() != "device" {
		t.Fatalf("after overwrite: %v", r.Valid)
	}
	must(tb.BeginCopy(a, TierDevice, TierHost))
	refuse(tb.Overwrite(a, TierDevice), "in flight")
	refuse(tb.Overwrite(a, TierNone), "cannot live on none")
	must(tb.EndCopy(a))
	if b := tb.Bytes(TierDevice); b[Activations] != 15 {
		t.Fatalf("device activations %d, want 15 (activations and checkpoint apart)", b[Activations])
	}
	if c.String() != "layer 2 checkpoint" || c.FileName() == a.FileName() {
		t.Fatalf("checkpoint key %q, file %q", c, c.FileName())
	}
}
