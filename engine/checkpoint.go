package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/spill-ml/spill/dataset"
	"github.com/spill-ml/spill/kernels"
)

// A checkpoint is a directory CheckpointDir/step-00000123/ holding
//
//	model.safetensors      fp32 master weights, nanoGPT names
//	optimizer.safetensors  "<name>.exp_avg" and "<name>.exp_avg_sq" per parameter
//	state.json             TrainState, with the SHA-256 of both files
//
// SaveCheckpoint writes the three files into a temporary directory
// (CheckpointDir/.tmp-step-00000123-*), fsyncs them and renames the
// directory into place, so a checkpoint directory with its final name is
// always complete; a crash leaves at most a temporary directory, which the
// next SaveCheckpoint removes.

// Checkpoint file names.
const (
	CheckpointModelFile = "model.safetensors"
	CheckpointOptimFile = "optimizer.safetensors"
	CheckpointStateFile = "state.json"
)

const (
	checkpointPrefix    = "step-"
	checkpointTmpPrefix = ".tmp-step-"
	checkpointFormat    = 1
)

// TrainState is a checkpoint's state.json: everything besides the tensors
// that a resumed run needs to continue bit for bit.
type TrainState struct {
	FormatVersion int `json:"format_version"`
	// Step is the number of optimizer steps taken.
	Step int `json:"step"`
	// Tokens is the number of training tokens (samples for the MLP)
	// consumed.
	Tokens int64 `json:"tokens"`
	// Cursor is the training loader's position: rank 0's, which is every
	// rank's (the loader drops the tail).
	Cursor dataset.Cursor `json:"cursor"`
	// WorldSize is the number of data-parallel ranks the run trained with
	// (1 for one process), so that a resume with another number can remap
	// Cursor (RemapCursor). 0 in checkpoints written before it was
	// recorded: taken to be the resuming run's (no remap).
	WorldSize int `json:"world_size,omitempty"`
	// RNG is the state of the run's random generator (dropout etc.).
	RNG uint64 `json:"rng"`
	// LossScale and GoodSteps are the fp16 dynamic loss scaler's state.
	LossScale float64 `json:"loss_scale"`
	GoodSteps int     `json:"good_steps"`
	// ConfigHash is Config.Hash() of the run's config.
	ConfigHash string `json:"config_hash"`
	Config     Config `json:"config"`
	// Files maps the checkpoint's other files to their hex SHA-256.
	// SaveCheckpoint fills it; LoadCheckpoint checks it.
	Files map[string]string `json:"files"`
}

// Checkpoint is the content of one checkpoint directory.
type Checkpoint struct {
	State   TrainState
	Weights []NamedTensor // fp32 master weights, nanoGPT names
	Optim   []NamedTensor // "<name>.exp_avg", "<name>.exp_avg_sq"
}

// CheckpointPath is the directory of the checkpoint of step in dir.
func CheckpointPath(dir string, step int) string {
	return filepath.Join(dir, fmt.Sprintf("%s%08d", checkpointPrefix, step))
}

// SaveCheckpoint writes ck as dir/step-NNNNNNNN/ (see the file comment)
// and then deletes all but the newest keep checkpoints in dir (keep <= 0
// keeps all). It fills ck.State.Files and FormatVersion. If a checkpoint of
// the same step exists it is replaced. It returns the checkpoint's path.
func SaveCheckpoint(dir string, ck *Checkpoint, keep int) (path string, err error) {
	if ck.State.Step < 0 {
		return "", fmt.Errorf("checkpoint: negative step %d", ck.State.Step)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	removeStaleTemps(dir)
	final := CheckpointPath(dir, ck.State.Step)
	tmp, err := os.MkdirTemp(dir, checkpointTmpPrefix+fmt.Sprintf("%08d-", ck.State.Step))
	if err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()

	ck.State.FormatVersion = checkpointFormat
	ck.State.Files = map[string]string{}
	var scratch []byte // the tensors read as they are written (Fill) go through it
	for _, f := range []struct {
		name string
		ts   []NamedTensor
	}{{CheckpointModelFile, ck.Weights}, {CheckpointOptimFile, ck.Optim}} {
		sum, err := writeSyncedFile(filepath.Join(tmp, f.name), func(w io.Writer) error {
			return encodeSafetensors(w, f.ts, map[string]string{"format": "pt", "step": strconv.Itoa(ck.State.Step)}, &scratch)
		})
		if err != nil {
			return "", fmt.Errorf("checkpoint %s: %w", filepath.Join(final, f.name), err)
		}
		ck.State.Files[f.name] = sum
	}
	js, err := json.MarshalIndent(&ck.State, "", "  ")
	if err != nil {
		return "", fmt.Errorf("checkpoint state: %w", err)
	}
	js = append(js, '\n')
	if _, err := writeSyncedFile(filepath.Join(tmp, CheckpointStateFile), func(w io.Writer) error {
		_, err := w.Write(js)
		return err
	}); err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", filepath.Join(final, CheckpointStateFile), err)
	}
	if err := syncDir(tmp); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if statErr := func() error { _, e := os.Stat(final); return e }(); statErr == nil {
		// Same step again (e.g. an interrupt right after a periodic
		// checkpoint): move the old one aside first.
		if err := os.Rename(final, filepath.Join(dir, checkpointTmpPrefix+"old-"+filepath.Base(final))); err != nil {
			return "", fmt.Errorf("checkpoint: replacing %s: %w", final, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return "", fmt.Errorf("checkpoint: %w", err)
	}
	removeStaleTemps(dir)
	if keep > 0 {
		steps, _ := listCheckpoints(dir)
		for i := 0; i < len(steps)-keep; i++ {
			if err := os.RemoveAll(CheckpointPath(dir, steps[i])); err != nil {
				return final, fmt.Errorf("checkpoint: pruning old checkpoints: %w", err)
			}
		}
	}
	return final, nil
}

// writeSyncedFile creates path, writes it through write, fsyncs it and
// returns its hex SHA-256.
func writeSyncedFile(path string, write func(io.Writer) error) (string, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	err = write(io.MultiWriter(f, h))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// removeStaleTemps deletes temporary directories left by interrupted
// saves. Only one trainer writes a checkpoint directory at a time.
func removeStaleTemps(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), checkpointTmpPrefix) {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// listCheckpoints returns the steps of the checkpoint directories in dir,
// ascending.
func listCheckpoints(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var steps []int
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !strings.HasPrefix(name, checkpointPrefix) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimPrefix(name, checkpointPrefix))
		if err != nil || n < 0 || name != filepath.Base(CheckpointPath("", n)) {
			continue
		}
		steps = append(steps, n)
	}
	sort.Ints(steps)
	return steps, nil
}

// LatestCheckpoint returns the newest complete checkpoint in dir: the
// highest step whose state.json parses and whose listed files exist. It
// returns "", nil when dir has none (or does not exist). It does not verify
// checksums; LoadCheckpoint does. FindCheckpoint also says what it skipped.
func LatestCheckpoint(dir string) (string, error) {
	path, _, err := FindCheckpoint(dir)
	return path, err
}

// FindCheckpoint is LatestCheckpoint that also returns why each newer
// checkpoint directory was skipped (one error per directory, naming it),
// for the caller to warn about.
func FindCheckpoint(dir string) (path string, skipped []error, err error) {
	steps, err := listCheckpoints(dir)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("checkpoint dir: %w", err)
	}
	for i := len(steps) - 1; i >= 0; i-- {
		p := CheckpointPath(dir, steps[i])
		if err := checkComplete(p); err != nil {
			skipped = append(skipped, err)
			continue
		}
		return p, skipped, nil
	}
	return "", skipped, nil
}

// checkComplete checks that the checkpoint directory p has a state.json
// that parses and every file it lists (not their checksums).
func checkComplete(p string) error {
	st, err := readState(p)
	if err != nil {
		return err
	}
	if len(st.Files) == 0 {
		return fmt.Errorf("checkpoint %s: state.json lists no files", p)
	}
	names := make([]string, 0, len(st.Files))
	for f := range st.Files {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if _, err := os.Stat(filepath.Join(p, filepath.Base(f))); err != nil {
			return fmt.Errorf("checkpoint %s: %s is missing (%v)", p, f, errors.Unwrap(err))
		}
	}
	return nil
}

// IsCheckpoint reports whether dir is a checkpoint directory (it holds a
// state.json), as opposed to a CheckpointDir of them.
func IsCheckpoint(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, CheckpointStateFile))
	return err == nil && st.Mode().IsRegular()
}

// ReadCheckpointState reads and checks the state.json of the checkpoint
// directory path, without reading the tensors.
func ReadCheckpointState(path string) (*TrainState, error) {
	return readState(path)
}

// ResolveResume picks the checkpoint a run resumes from and records it in
// cfg.ResumeFrom: cfg.ResumeFrom itself when set (it must be a complete
// checkpoint), else, when cfg.Resume, the newest complete checkpoint in
// cfg.CheckpointDir (warn is called once for each newer one skipped, with
// the reason), else none. No checkpoint leaves ResumeFrom "".
//
// Call it before EnsureDefaults: a field that EnsureDefaults would derive
// from Steps (Warmup, steps/20) and that cfg leaves unset is taken from the
// checkpoint's config instead, so that a resume which only raises Steps
// continues the same schedule.
func ResolveResume(cfg *Config, warn func(error)) error {
	if cfg.ResumeFrom == "" {
		if !cfg.Resume || cfg.CheckpointDir == "" {
			return nil
		}
		path, skipped, err := FindCheckpoint(cfg.CheckpointDir)
		if err != nil {
			return err
		}
		for _, s := range skipped {
			if warn != nil {
				warn(fmt.Errorf("skipping an incomplete checkpoint: %w", s))
			}
		}
		if path == "" {
			return nil
		}
		cfg.ResumeFrom = path
	} else if err := checkComplete(cfg.ResumeFrom); err != nil {
		return fmt.Errorf("resume from: %w", err)
	}
	st, err := readState(cfg.ResumeFrom)
	if err != nil {
		return err
	}
	if cfg.Warmup < 0 {
		cfg.Warmup = st.Config.Warmup
	}
	return nil
}

// olderCheckpoints lists the checkpoints of path's directory older than
// path, newest first (for the hint of a refused checkpoint).
func olderCheckpoints(path string) []string {
	dir := filepath.Dir(filepath.Clean(path))
	steps, _ := listCheckpoints(dir)
	var older []string
	for i := len(steps) - 1; i >= 0; i-- {
		if p := CheckpointPath(dir, steps[i]); p < filepath.Clean(path) {
			older = append(older, p)
		}
	}
	return older
}

// resumeHint is what to do about a checkpoint that cannot be loaded.
func resumeHint(path string) string {
	if older := olderCheckpoints(path); len(older) > 0 {
		return fmt.Sprintf("resume from an older checkpoint with --resume-from %s, or start over", older[0])
	}
	return "no older checkpoint is left: start over"
}

func readState(path string) (*TrainState, error) {
	name := filepath.Join(path, CheckpointStateFile)
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var st TrainState
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("checkpoint %s: corrupt state (%v)", name, err)
	}
	if st.FormatVersion != checkpointFormat {
		return nil, fmt.Errorf("checkpoint %s: format version %d, this spill reads %d", name, st.FormatVersion, checkpointFormat)
	}
	return &st, nil
}

// checkpointFiles reads the state of the checkpoint directory path and
// returns it with the names of the files it lists checksums for, sorted;
// both tensor files must be among them.
func checkpointFiles(path string) (*TrainState, []string, error) {
	st, err := readState(path)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range []string{CheckpointModelFile, CheckpointOptimFile} {
		if _, ok := st.Files[f]; !ok {
			return nil, nil, fmt.Errorf("checkpoint %s: state.json lists no checksum for %s", path, f)
		}
	}
	names := make([]string, 0, len(st.Files))
	for name := range st.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	return st, names, nil
}

// LoadCheckpoint reads the checkpoint directory path. It checks every
// file against the SHA-256 recorded in state.json and that both tensor
// files are present, and refuses a corrupted or truncated checkpoint with
// an error naming the file.
func LoadCheckpoint(path string) (*Checkpoint, error) {
	st, names, err := checkpointFiles(path)
	if err != nil {
		return nil, err
	}
	ck := &Checkpoint{State: *st}
	for _, name := range names {
		want := st.Files[name]
		file := filepath.Join(path, filepath.Base(name))
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != want {
			return nil, fmt.Errorf("checkpoint %s: checksum mismatch (file is corrupted or truncated: %d bytes, sha256 %s, state.json expects %s); %s",
				file, len(data), got[:12], want[:min(12, len(want))], resumeHint(path))
		}
		ts, _, err := decodeSafetensorsBytes(data)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", file, err)
		}
		switch name {
		case CheckpointModelFile:
			ck.Weights = ts
		case CheckpointOptimFile:
			ck.Optim = ts
		}
	}
	return ck, nil
}

// CheckResume reports whether a run configured as cur may resume from a
// checkpoint with state saved: the math-defining fields (see Config.Hash)
// must match, and Steps must not be below the checkpoint's step. Steps may
// be raised to extend a run. The error lists every differing field.
func CheckResume(saved *TrainState, cur *Config) error {
	var problems []string
	if saved.ConfigHash != cur.Hash() {
		diffs := saved.Config.MathDiff(cur)
		if len(diffs) == 0 {
			diffs = []string{"(config hash differs: checkpoint written by a different spill version?)"}
		}
		problems = append(problems, "the config differs from the checkpoint's in fields that define the run:\n  "+
			strings.Join(diffs, "\n  ")+
			"\nresume with the checkpoint's values (only steps may be raised), or start a new run in another checkpoint_dir")
	}
	if cur.Steps < saved.Step {
		problems = append(problems, fmt.Sprintf("steps = %d but the checkpoint is already at step %d", cur.Steps, saved.Step))
	}
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("cannot resume: %s", strings.Join(problems, "; "))
}

// Checkpoints of a model larger than the host's memory are written and
// read tensor by tensor. CheckpointTensors gives SaveCheckpoint the
// trainer's tensors without gathering them: a tensor in host memory is
// written from where it lives, one on the device or the disk tier is read
// into the encoder's one buffer only when its turn comes. RestoreCheckpoint
// reads the files in one pass, each tensor into one reused buffer and on
// to its tier, hashing as it goes. Either way the extra host memory is
// one tensor (the largest) and the files' I/O buffers.

// ckptSuffix names a checkpoint tensor of each kind after its parameter.
var ckptSuffix = [3]string{"", ".exp_avg", ".exp_avg_sq"}

// CheckpointTensors returns the tensors SaveTensors returns, as
// SaveCheckpoint writes them without gathering them in host memory: each
// is a view of the host memory that holds it or is read from the device
// or the disk tier when it is written (NamedTensor.Fill). They are valid
// until the trainer's next step: save them before it.
//
// With a sharded optimizer (ShardsOptimizer) it is a collective: every
// rank must call it, and it gathers the sharded layers' state whole into
// the host memory of every rank (rank 0 writes it).
func (t *Trainer) CheckpointTensors(ctx context.Context) (weights, optim []NamedTensor, err error) {
	if t.off != nil {
		if err := t.off.host.waitUpdates(); err != nil {
			return nil, nil, err
		}
	} else if err := t.q.Synchronize(ctx); err != nil {
		return nil, nil, err
	}
	for i, l := range t.model.Layers {
		var whole [3][]byte // a sharded layer's state, gathered (engine/zero.go)
		if t.off != nil && t.off.opts.sharded(i) {
			if whole[0], whole[1], whole[2], err = t.gatherOptim(ctx, i); err != nil {
				return nil, nil, err
			}
		}
		for _, ps := range l.Params() {
			for kind, suffix := range ckptSuffix {
				nt := NamedTensor{Name: ps.Name + suffix, DType: "F32", Shape: append([]int(nil), ps.Shape...)}
				if whole[kind] != nil {
					nt.Data = whole[kind][4*ps.Offset : 4*(ps.Offset+ps.Elems())]
				} else {
					nt.Data, nt.Fill = t.tensorSource(ctx, i, kind, ps)
				}
				if kind == ckptMaster {
					weights = append(weights, nt)
				} else {
					optim = append(optim, nt)
				}
			}
		}
	}
	return weights, optim, nil
}

// tensorSource is hostState.tensorSource for any trainer.
func (t *Trainer) tensorSource(ctx context.Context, i, kind int, ps ParamSpec) ([]byte, func([]byte) error) {
	if t.off != nil {
		return t.off.host.tensorSource(ctx, i, kind, ps)
	}
	s := t.st.Layers[i]
	x := param([3]kernels.Tensor{s.Master, s.M, s.V}[kind], ps)
	return nil, func(dst []byte) error {
		t.be.CopyToHost(t.q, dst, x)
		return t.q.Synchronize(ctx)
	}
}

// setTensor is hostState.setTensor for any trainer.
func (t *Trainer) setTensor(ctx context.Context, i, kind int, ps ParamSpec, data []byte) error {
	if t.off != nil {
		return t.off.host.setTensor(ctx, i, kind, ps, data)
	}
	s := t.st.Layers[i]
	t.be.CopyToDevice(t.q, param([3]kernels.Tensor{s.Master, s.M, s.V}[kind], ps), data)
	if kind == ckptMaster && s.Weights.Buf != s.Master.Buf {
		t.be.Cast(t.q, param(s.Weights, ps), param(s.Master, ps))
	}
	return t.q.Synchronize(ctx) // data must outlive the copy
}

// RestoreCheckpoint loads the checkpoint directory path into the trainer
// tensor by tensor (see CheckpointTensors) and returns its state: the
// master weights (and from them the compute copy) and the Adam moments of
// every parameter, which must all be present with their exact shapes.
// Each file is checked against the SHA-256 in state.json as it is read:
// a corrupted file is refused only once its tensors have been loaded, so
// after an error the trainer's state is undefined (load another
// checkpoint or start over).
//
// Under data parallelism it is a collective: every rank reads the
// checkpoint and then checks that all of them read the same one
// (engine/ddp_sync.go).
func (t *Trainer) RestoreCheckpoint(ctx context.Context, path string) (*TrainState, error) {
	st, err := readState(path)
	if err != nil {
		return nil, err
	}
	type dest struct {
		layer, kind int
		ps          ParamSpec
		done        bool
	}
	want := map[string]*dest{}
	for i, l := range t.model.Layers {
		for _, ps := range l.Params() {
			for kind, suffix := range ckptSuffix {
				want[ps.Name+suffix] = &dest{layer: i, kind: kind, ps: ps}
			}
		}
	}
	if t.off != nil {
		if err := t.off.host.waitUpdates(); err != nil {
			return nil, err
		}
	}
	var scratch []byte // every tensor of both files goes through it
	for _, f := range []string{CheckpointModelFile, CheckpointOptimFile} {
		sum, ok := st.Files[f]
		if !ok {
			return nil, fmt.Errorf("checkpoint %s: state.json lists no checksum for %s", path, f)
		}
		err := streamSafetensors(path, f, sum, &scratch, func(nt *NamedTensor) error {
			d := want[nt.Name]
			if d == nil {
				return nil // not the model's (another file's layout): ignored, as LoadTensors does
			}
			if nt.DType != "F32" || !sameShape(nt.Shape, d.ps.Shape) {
				return fmt.Errorf("tensor %q is %s %v, the model needs F32 %v", nt.Name, nt.DType, nt.Shape, d.ps.Shape)
			}
			d.done = true
			return t.setTensor(ctx, d.layer, d.kind, d.ps, nt.Data)
		})
		if err != nil {
			return nil, err
		}
	}
	var missing []string
	for name, d := range want {
		if !d.done {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("checkpoint %s: %d tensors missing (%s)", path, len(missing), strings.Join(missing[:min(3, len(missing))], ", "))
	}
	// Under data parallelism every rank must have read the same one.
	if err := t.checkSameCheckpoint(ctx, st); err != nil {
		return nil, err
	}
	return st, nil
}

// streamSafetensors reads the safetensors file name of the checkpoint
// directory path in one pass and calls each with every tensor, in file
// order, its Data valid only during the call (*scratch, grown to the
// largest tensor, serves them all). The file's SHA-256 must be sum.
func streamSafetensors(path, name, sum string, scratch *[]byte, each func(*NamedTensor) error) error {
	file := filepath.Join(path, filepath.Base(name))
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	size := fi.Size()
	h := sha256.New()
	r := bufio.NewReaderSize(io.TeeReader(f, h), safetensorsIOBuf)
	bad := func(err error) error {
		return fmt.Errorf("checkpoint %s: %w; %s", file, err, resumeHint(path))
	}
	var nb [8]byte
	if _, err := io.ReadFull(r, nb[:]); err != nil {
		return bad(fmt.Errorf("reading the header length: %w (truncated?)", err))
	}
	n := binary.LittleEndian.Uint64(nb[:])
	if n > maxSafetensorsHeader || int64(n) > size-8 {
		return bad(fmt.Errorf("header length %d does not fit the %d-byte file (corrupted or truncated)", n, size))
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return bad(fmt.Errorf("reading the header: %w", err))
	}
	spans, _, err := parseSafetensorsHeader(hdr, size-8-int64(n))
	if err != nil {
		return bad(err)
	}
	var largest int64
	for _, s := range spans {
		largest = max(largest, s.end-s.begin)
	}
	if int64(cap(*scratch)) < largest {
		*scratch = make([]byte, largest)
	}
	buf := (*scratch)[:cap(*scratch)]
	for _, s := range spans { // in file order, back to back
		data := buf[:s.end-s.begin]
		if _, err := io.ReadFull(r, data); err != nil {
			return bad(fmt.Errorf("reading tensor %q: %w", s.name, err))
		}
		nt := NamedTensor{Name: s.name, DType: s.dtype, Shape: s.shape, Data: data}
		if err := each(&nt); err != nil {
			return fmt.Errorf("checkpoint %s: %w", file, err)
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("checkpoint %s: checksum mismatch (file is corrupted or truncated: %d bytes, sha256 %s, state.json expects %s); %s",
			file, size, got[:12], sum[:min(12, len(sum))], resumeHint(path))
	}
	return nil
}
