package engine

import (
	"context"
	"strings"
	"testing"

	"github.com/spill-ml/spill/engine/internal/dist"
)

func TestCheckWorld(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if w, err := checkWorld(env(nil), "cpu"); err != nil || w.WorldSize != 1 {
		t.Fatalf("not launched: %+v, %v", w, err)
	}
	if _, err := checkWorld(env(map[string]string{"RANK": "0", "WORLD_SIZE": "1"}), "cpu"); err != nil {
		t.Fatalf("world size 1: %v", err)
	}
	full := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
	if _, err := checkWorld(env(full), "cpu"); err == nil || !strings.Contains(err.Error(), "rank 1 of 2: data-parallel training over several processes needs the cuda device") {
		t.Fatalf("world size 2 on the cpu: %v", err)
	}
	if w, err := checkWorld(env(full), "cuda"); err != nil || w.Rank != 1 || w.WorldSize != 2 || w.LocalRank != 1 {
		t.Fatalf("world size 2 on cuda: %+v, %v", w, err)
	}
	if _, err := checkWorld(env(map[string]string{"WORLD_SIZE": "2"}), "cuda"); err == nil || !strings.Contains(err.Error(), "RANK is not set") {
		t.Fatalf("bad environment: %v", err)
	}
}

// TestOpenCommRefusesCPU: --device auto that fell back to the CPU in a
// job of several processes is refused before any rendezvous (which
// would wait for the other ranks); a job of one process needs no
// communicator.
func TestOpenCommRefusesCPU(t *testing.T) {
	be := openCPU(t)
	if c, err := openComm(context.Background(), dist.Single, be); c != nil || err != nil {
		t.Fatalf("single process: %v, %v", c, err)
	}
	w := dist.Config{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1}
	if _, err := openComm(context.Background(), w, be); err == nil || !strings.Contains(err.Error(), "needs the cuda device") {
		t.Fatalf("cpu, 2 ranks: %v", err)
	}
}
