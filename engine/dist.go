package engine

import (
	"fmt"
	"os"

	"github.com/spill-ml/spill/engine/internal/dist"
)

// checkLaunch is checkWorld on the process's environment.
func checkLaunch() error { return checkWorld(os.Getenv) }

// checkWorld reads the torchrun-style launch environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; see spill train
// --nproc-per-node) and refuses what the trainer cannot do yet: it trains
// one process, so a rank of a job of several fails here, with the same
// error on every rank, instead of training alone on the whole data.
func checkWorld(getenv func(string) string) error {
	w, launched, err := dist.FromEnv(getenv)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	if launched && w.WorldSize > 1 {
		return fmt.Errorf("engine: rank %d of %d: data-parallel training is not implemented yet: "+
			"run a single process (without --nproc-per-node, or with WORLD_SIZE=1)", w.Rank, w.WorldSize)
	}
	return nil
}
