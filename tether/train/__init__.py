"""The training loops and what every stage shares around them: the offline loop (offline) and its scaffolding
(offline_run) and its language-model objective (lm_objective), the online loop (online), its one set-up of the models (online_setup) and its one sampling path (sampling), a step's experience (experience), run
folders (run), checkpoints and their tensors-only state (checkpoint, state_io), the optimizer and its schedule
(schedule), metrics sinks and console lines (logger), data parallelism (parallel), FSDP2 sharding (sharding) and the
over-fitting detector (early_stop).

May import: every floor below it (algorithms up to diagnostics). Never a stage: stages compose the loops.
"""
