// Package engine trains models whose weights, optimizer state and
// activations need not fit in device memory: it builds the model (a GPT
// from a preset, or an MLP), streams its layers through the device under a
// byte budget, and runs the training loop with evaluation, checkpoints and
// metrics. cmd/spill's train and export commands are thin layers over it.
//
// # Running
//
// A run is described by a Config (TOML file and/or flags; DefaultConfig,
// LoadConfig, EnsureDefaults, Validate) and started with Run, which
// reports every step to a Reporter (JSONLReporter, ProgressReporter,
// LineReporter, MultiReporter) and returns a Summary. With Config.Data
// empty it trains on a small synthetic arithmetic corpus generated on
// first use (DefaultDataset).
//
// # Parameters
//
// Parameters carry nanoGPT's state_dict names and PyTorch's layouts:
// Linear weights are (out, in), the LM head is tied to transformer.wte.
// Export converts them to nanoGPT's or Hugging Face's GPT-2 layout in a
// safetensors file (see FormatNanoGPT and FormatHF).
//
// # Checkpoints
//
// SaveCheckpoint writes CheckpointDir/step-NNNNNNNN/ (model.safetensors
// with fp32 master weights, optimizer.safetensors with AdamW's moments,
// state.json with the step, data cursor, loss scaler, config and file
// checksums) through a temporary directory renamed into place, so a
// checkpoint that has its final name is complete. LatestCheckpoint finds
// the newest; LoadCheckpoint verifies the checksums. A trainer saves and
// resumes tensor by tensor from and to whichever tier holds each tensor
// (Trainer.CheckpointTensors, Trainer.RestoreCheckpoint), with one tensor's
// worth of extra host memory, so a checkpoint of a model larger than the
// host's memory is written and read in place. A run resumed from a
// checkpoint under a config with the same Config.Hash continues bit for bit
// as if it had never stopped; CheckResume explains any difference.
//
// # Files
//
// ReadSafetensors and WriteSafetensors implement the safetensors format
// (https://github.com/huggingface/safetensors) with full validation on
// read and atomic writes.
package engine
