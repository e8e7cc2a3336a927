package engine

import (
	"strings"
	"testing"
)

func TestCheckWorld(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if err := checkWorld(env(nil)); err != nil {
		t.Fatalf("not launched: %v", err)
	}
	if err := checkWorld(env(map[string]string{"RANK": "0", "WORLD_SIZE": "1"})); err != nil {
		t.Fatalf("world size 1: %v", err)
	}
	full := map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
	if err := checkWorld(env(full)); err == nil || !strings.Contains(err.Error(), "rank 1 of 2: data-parallel training is not implemented yet") {
		t.Fatalf("world size 2: %v", err)
	}
	if err := checkWorld(env(map[string]string{"WORLD_SIZE": "2"})); err == nil || !strings.Contains(err.Error(), "RANK is not set") {
		t.Fatalf("bad environment: %v", err)
	}
}
