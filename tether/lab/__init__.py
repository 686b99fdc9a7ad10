"""The lab: an offline world with a known gold reward, simulated annotators and a tiny model of our own.

arith.py and assist.py define the two tasks and their gold functions (phrases.py: the assist world's phrase
banks; rewards.py: the arith world's reward functions); annotators.py the simulated labellers; world.py writes
every stage's data files; evaluate.py measures a model against gold; stats.py holds the lab's noise (bootstrap and
95 % intervals, standard errors, the noise of a difference, how an interval is written); reward_eval.py is the
reward-model stage, rl.py the online RL stages and agents.py the tool-using tasks; coding.py the coding agent's
world (visible and hidden tests), which examples/monitor_bench.py runs.

`tether lab` (pipeline.py, its entry: run_lab and run_base) reads its settings from settings.py (LabConfig, QUICK,
`--set`), its stages from plan.py (which stages, with what settings, after which) and their runners from
runners.py; schedule.py caches the stages and runs them side by side; lessons.py judges each lesson on a run's
figures; tables.py prints the tables and the headline and writes report.html. tokenizer.py trains the lab's BPE
tokenizer; demo.py is `tether sft --demo`.

`tether lab --multimodal` is the visual world: scenes.py draws the scenes of coloured shapes and holds their gold,
demonstrators and annotator panels; visual.py runs its stages over seeds and judges its lessons.

May import: every floor below it, stages included: the lab composes the stages.
"""
