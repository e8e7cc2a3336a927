package dist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFromEnv(t *testing.T) {
	cfg, launched, err := FromEnv(env(nil))
	if err != nil || launched || cfg != Single {
		t.Fatalf("empty environment: %+v %v %v, want Single", cfg, launched, err)
	}
	cfg, launched, err = FromEnv(env(map[string]string{"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}))
	want := Config{Rank: 2, WorldSize: 4, LocalRank: 1, MasterAddr: "node0", MasterPort: 29500}
	if err != nil || !launched || cfg != want {
		t.Fatalf("got %+v %v %v, want %+v", cfg, launched, err, want)
	}
	if cfg.Addr() != "node0:29500" {
		t.Fatalf("Addr %q", cfg.Addr())
	}
	cfg, _, err = FromEnv(env(map[string]string{"RANK": "0", "WORLD_SIZE": "1"}))
	if err != nil || cfg != (Config{WorldSize: 1, MasterAddr: "127.0.0.1"}) {
		t.Fatalf("world size 1 without the rest: %+v %v", cfg, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"RANK": "1"}, []string{"WORLD_SIZE is not set", "RANK=1 is out of range"}},
		{map[string]string{"WORLD_SIZE": "2"}, []string{"RANK is not set", "LOCAL_RANK is not set", "MASTER_ADDR is not set", "MASTER_PORT is not set"}},
		{map[string]string{"RANK": "x", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, []string{`RANK="x" is not an integer`}},
		{map[string]string{"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "-1", "MASTER_ADDR": "h", "MASTER_PORT": "70000"},
			[]string{"RANK=2 is out of range for WORLD_SIZE=2", "LOCAL_RANK=-1", "MASTER_PORT=70000 is not a TCP port"}},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, []string{"WORLD_SIZE=0 must be at least 1"}},
	} {
		_, launched, err := FromEnv(env(tc.env))
		if err == nil || !launched {
			t.Errorf("%v: no error", tc.env)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v\nwant it to say %q", tc.env, err, w)
			}
		}
	}
}

// freePort returns a loopback port nothing listens on (for a moment).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// exchange runs ExchangeID for the given ranks, each in its own
// goroutine, and returns what each got.
func exchange(ctx context.Context, port int, worldSize int, ranks []int, sizes []int, timeout time.Duration) ([][]byte, []error) {
	ids, errs := make([][]byte, len(ranks)), make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, r := range ranks {
		wg.Go(func() {
			ws := worldSize
			if sizes != nil {
				ws = sizes[i]
			}
			cfg := Config{Rank: r, WorldSize: ws, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port}
			var id []byte
			if r == 0 {
				id = []byte("the id")
			}
			ids[i], errs[i] = ExchangeID(ctx, cfg, id, timeout)
		})
	}
	wg.Wait()
	return ids, errs
}

func TestExchangeID(t *testing.T) {
	for _, n := range []int{1, 2, 5} {
		ranks := make([]int, n)
		for i := range ranks {
			ranks[i] = n - 1 - i // rank 0 starts last: the others retry
		}
		ids, errs := exchange(context.Background(), freePort(t), n, ranks, nil, 10*time.Second)
		for i := range ranks {
			if errs[i] != nil || !bytes.Equal(ids[i], []byte("the id")) {
				t.Fatalf("world %d: rank %d got %q, %v", n, ranks[i], ids[i], errs[i])
			}
		}
	}
}

func TestExchangeIDTimeout(t *testing.T) {
	port := freePort(t)
	_, errs := exchange(context.Background(), port, 3, []int{0, 1}, nil, 300*time.Millisecond)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "timed out after 300ms waiting for rank 2 of 3") ||
		!strings.Contains(errs[0].Error(), fmt.Sprintf("127.0.0.1:%d", port)) {
		t.Errorf("rank 0: %v", errs[0])
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "rank 1: rendezvous with rank 0") {
		t.Errorf("rank 1: %v", errs[1])
	}
}

// TestExchangeIDWrongWorldSize: rank 0 and the rank with the wrong
// WORLD_SIZE say what is wrong; a rank that had joined by then is told
// too, and one that dials after rank 0 gave up fails at its timeout (as
// under torchrun): either way every rank fails.
func TestExchangeIDWrongWorldSize(t *testing.T) {
	_, errs := exchange(context.Background(), freePort(t), 3, []int{0, 1, 2}, []int{3, 3, 4}, 2*time.Second)
	const why = "rank 2 has WORLD_SIZE=4, rank 0 has 3"
	for i, err := range errs {
		switch {
		case err == nil:
			t.Errorf("rank %d: no error", i)
		case i != 1 && !strings.Contains(err.Error(), why):
			t.Errorf("rank %d: %v; want it to say %q", i, err, why)
		case i == 1 && !strings.Contains(err.Error(), why) && !strings.Contains(err.Error(), "timed out"):
			t.Errorf("rank 1: %v; want %q or a timeout", err, why)
		}
	}
}

func TestExchangeIDDuplicateRank(t *testing.T) {
	_, errs := exchange(context.Background(), freePort(t), 3, []int{0, 1, 1}, nil, 10*time.Second)
	for i, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "rank 1 joined twice") {
			t.Errorf("caller %d: %v", i, err)
		}
	}
}

func TestExchangeIDRankZeroAbsent(t *testing.T) {
	port := freePort(t)
	start := time.Now()
	_, errs := exchange(context.Background(), port, 2, []int{1}, nil, 300*time.Millisecond)
	want := fmt.Sprintf("rank 1: rendezvous with rank 0 at 127.0.0.1:%d: timed out after 300ms (is rank 0 running", port)
	if errs[0] == nil || !strings.Contains(errs[0].Error(), want) {
		t.Errorf("got %v\nwant %q", errs[0], want)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("gave up after %v", d)
	}
}

func TestExchangeIDCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, errs := exchange(ctx, freePort(t), 3, []int{0, 2}, nil, time.Minute)
	for i, err := range errs {
		if !errors.Is(err, context.Canceled) && (err == nil || !strings.Contains(err.Error(), "context canceled")) {
			t.Errorf("caller %d: %v, want context.Canceled", i, err)
		}
	}
}

func TestExchangeIDStrayConnection(t *testing.T) {
	port := freePort(t)
	go func() {
		for range 100 {
			if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
				c.Close()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	ids, errs := exchange(context.Background(), port, 2, []int{0, 1}, nil, 10*time.Second)
	for i := range ids {
		if errs[i] != nil || string(ids[i]) != "the id" {
			t.Errorf("caller %d: %q %v", i, ids[i], errs[i])
		}
	}
}
