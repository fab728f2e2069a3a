"""Measured choices: what mtkit measures on the machine at hand, how it times it, where the
choice is stored, and how a later run or process reuses it.

What is measured (each where it depends on the hardware, and only where asked for `auto`):
- training's precision (`precision`: fp32 or bf16, a Linear of the model's shapes timed
  forward+backward), attention kernel (`attention`: SDPA or matmul + softmax), batch
  shapes (`shapes`: token batches or few shapes) and CUDA graphs for its updates
  (`capture`: eager or replayed, timed by training's own update);
- translation's precision (forward only, in bf16 weights; int8 only when asked, with the
  weight range this CPU multiplies exactly), attention kernel (one beam-search step),
  whether decoder steps are captured (`capture.graph_choice`), on a CPU whether they are
  compiled (`compile`: eager or Inductor's, timed on a full batch of real steps), and on
  a GPU the batch budget (`budget`, from the memory free at load).

How it is timed (`timing`): each candidate warmed up first, then the fastest of runs that
alternate between the candidates, on one thread on a CPU: load from another process
only ever adds time, so the fastest run is the least disturbed.

Where it is stored, the one rule: a choice is stored with what it shapes, and reused from
there without measuring again.
- A training run's choices (`run`: precision, attention, batch shapes, CUDA graphs) are
  decided at the run's first start and stored in every checkpoint (`train.precision`,
  which holds the others) and in metrics.jsonl's `start` record. A resume reuses the
  checkpoint's choices, never measures them again, and refuses a config that asks for
  another value (`auto` always agrees). Under DDP every rank takes rank 0's choice.
- Translation's CPU choices under `auto` (precision, attention kernel, compiled steps)
  are kept per machine in measured.json (`measured`: `$MTKIT_CACHE_DIR`, by default
  `~/.cache/mtkit/measured.json`), keyed by the CPU, the vector instructions its kernels
  run, torch's version, the threads and the shape measured: every later process on the
  same machine takes the first one's choice, so that it translates the same input the
  same way. An entry is measured again only where it is missing or cannot be used (not
  JSON, not a choice this mtkit makes); delete the file to measure everything again.
  Distillation stores its teacher's choices with its corpus (`mtkit.stages.distill`), so
  a resumed distillation translates as it began.
- Everything else translation decides (a value asked for; on CUDA bf16 and matmul
  attention, unmeasured; whether decoder steps are captured; int8's weight range; the GPU
  batch budget, from the memory free at load) is decided again at each load, shown in the
  engine's record (`TorchEngine.precision`), and never stored.

Modules: `measured` (measured.json), `timing`, `precision`, `attention`, `shapes`,
`capture` (the one definition of capturing CUDA work, `CAPTURES`, and whether updates and
decoder steps are captured), `compile` (a CPU's decoder steps compiled by Inductor, a
capture of its own, and whether they are), `budget`, `run` (a training run's choices,
`decided_once`).
This layer sits above `model/` and `data/`, whose kernels and batches it times, and below
`search/`, `training/` and `engines/`, which use it.
"""
