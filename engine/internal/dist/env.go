// Package dist is the process side of data-parallel training: where this
// process stands in the job (Config, read from the torchrun-style
// environment) and the rendezvous through which rank 0 hands every rank
// the communicator's id (ExchangeID). The collectives themselves are
// kernels.Comm.
package dist

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// The environment variables of a launched rank, as torchrun sets them
// (spill train --nproc-per-node sets the same; on several hosts, set them
// on each).
const (
	EnvRank       = "RANK"        // this process's rank, 0 <= RANK < WORLD_SIZE
	EnvWorldSize  = "WORLD_SIZE"  // the number of processes in the job
	EnvLocalRank  = "LOCAL_RANK"  // the rank on this host: the CUDA device it uses
	EnvMasterAddr = "MASTER_ADDR" // host of rank 0, where the rendezvous listens
	EnvMasterPort = "MASTER_PORT" // its TCP port
)

// Config is this process's place in a data-parallel job.
type Config struct {
	Rank       int    // RANK
	WorldSize  int    // WORLD_SIZE; 1 for a process that was not launched
	LocalRank  int    // LOCAL_RANK: the device ordinal on this host
	MasterAddr string // MASTER_ADDR
	MasterPort int    // MASTER_PORT
}

// Single is the Config of a process that was not launched as a rank.
var Single = Config{WorldSize: 1}

// Addr is MASTER_ADDR:MASTER_PORT.
func (c Config) Addr() string { return net.JoinHostPort(c.MasterAddr, strconv.Itoa(c.MasterPort)) }

func (c Config) String() string {
	return fmt.Sprintf("rank %d of %d (local rank %d, rendezvous %s)", c.Rank, c.WorldSize, c.LocalRank, c.Addr())
}

// FromEnv reads the launch variables through getenv (os.Getenv). With
// none of them set it returns Single and launched false. Otherwise
// WORLD_SIZE and RANK are required, and with WORLD_SIZE > 1 also
// LOCAL_RANK, MASTER_ADDR and MASTER_PORT (with WORLD_SIZE 1 they default
// to 0, "127.0.0.1" and 0). The error lists every problem at once.
func FromEnv(getenv func(string) string) (cfg Config, launched bool, err error) {
	names := []string{EnvRank, EnvWorldSize, EnvLocalRank, EnvMasterAddr, EnvMasterPort}
	for _, n := range names {
		if getenv(n) != "" {
			launched = true
		}
	}
	if !launched {
		return Single, false, nil
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	num := func(name string, required bool, def int) int {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			if required {
				bad("%s is not set", name)
			}
			return def
		}
		v, err := strconv.Atoi(s)
		if err != nil {
			bad("%s=%q is not an integer", name, s)
			return def
		}
		return v
	}
	cfg.WorldSize = num(EnvWorldSize, true, 1)
	cfg.Rank = num(EnvRank, true, 0)
	multi := cfg.WorldSize > 1
	cfg.LocalRank = num(EnvLocalRank, multi, 0)
	cfg.MasterPort = num(EnvMasterPort, multi, 0)
	cfg.MasterAddr = strings.TrimSpace(getenv(EnvMasterAddr))
	switch {
	case cfg.WorldSize < 1:
		bad("%s=%d must be at least 1", EnvWorldSize, cfg.WorldSize)
	case cfg.Rank < 0 || cfg.Rank >= cfg.WorldSize:
		bad("%s=%d is out of range for %s=%d (0 <= %s < %s)", EnvRank, cfg.Rank, EnvWorldSize, cfg.WorldSize, EnvRank, EnvWorldSize)
	}
	if cfg.LocalRank < 0 {
		bad("%s=%d must not be negative", EnvLocalRank, cfg.LocalRank)
	}
	if cfg.MasterAddr == "" {
		if multi {
			bad("%s is not set (the host of rank 0)", EnvMasterAddr)
		}
		cfg.MasterAddr = "127.0.0.1"
	}
	if cfg.MasterPort < 0 || cfg.MasterPort > 65535 || multi && cfg.MasterPort == 0 {
		bad("%s=%d is not a TCP port (1-65535)", EnvMasterPort, cfg.MasterPort)
	}
	if len(errs) > 0 {
		return Config{}, true, fmt.Errorf("dist: bad launch environment: %w", errors.Join(errs...))
	}
	return cfg, true, nil
}
