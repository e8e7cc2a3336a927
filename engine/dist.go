package engine

import (
	"context"
	"fmt"
	"os"

	"github.com/spill-ml/spill/engine/internal/dist"
	"github.com/spill-ml/spill/kernels"
)

// checkLaunch is checkWorld on the process's environment.
func checkLaunch(device string) (dist.Config, error) { return checkWorld(os.Getenv, device) }

// checkWorld reads the torchrun-style launch environment (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; see spill train
// --nproc-per-node): this process's place in a data-parallel job, or
// dist.Single when it was not launched as a rank. A job of several ranks
// on the cpu device is refused here, with the same error on every rank:
// the CPU backend's communicator joins ranks of one process only (the
// in-process API, TrainerOptions.Comm, is what tests use).
func checkWorld(getenv func(string) string, device string) (dist.Config, error) {
	w, _, err := dist.FromEnv(getenv)
	if err != nil {
		return w, fmt.Errorf("engine: %w", err)
	}
	if w.WorldSize > 1 && device == "cpu" {
		return w, multiCPUError(w)
	}
	return w, nil
}

func multiCPUError(w dist.Config) error {
	return fmt.Errorf("engine: rank %d of %d: data-parallel training over several processes needs the cuda device "+
		"(NCCL); the cpu backend trains one process: run without --nproc-per-node, or with WORLD_SIZE=1", w.Rank, w.WorldSize)
}

// openComm joins this process to the job's communicator on be: rank 0
// creates the id, the rendezvous at MASTER_ADDR:MASTER_PORT hands it to
// every rank, and every rank opens it (NCCL on the cuda backend). It
// returns nil for a job of one process. be must implement
// kernels.CommOpener and must not be the CPU backend.
func openComm(ctx context.Context, w dist.Config, be kernels.Backend) (kernels.Comm, error) {
	if w.WorldSize <= 1 {
		return nil, nil
	}
	if be.Name() == "cpu" { // --device auto fell back to the CPU
		return nil, multiCPUError(w)
	}
	op, ok := be.(kernels.CommOpener)
	if !ok {
		return nil, fmt.Errorf("engine: rank %d of %d: the %s backend has no communicator for data-parallel training", w.Rank, w.WorldSize, be.Name())
	}
	var id []byte
	if w.Rank == 0 {
		var err error
		if id, err = op.NewCommID(); err != nil {
			return nil, fmt.Errorf("engine: rank 0 of %d: %w", w.WorldSize, err)
		}
	}
	id, err := dist.ExchangeID(ctx, w, id, 0)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	comm, err := op.OpenComm(ctx, id, w.Rank, w.WorldSize)
	if err != nil {
		return nil, fmt.Errorf("engine: rank %d of %d: opening the communicator: %w", w.Rank, w.WorldSize, err)
	}
	return comm, nil
}
