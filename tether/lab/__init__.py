"""The lab: an offline world with a known gold reward, simulated annotators and a tiny model of our own.

arith.py and assist.py define the two tasks and their gold functions;
annotators.py the simulated labellers; world.py writes every stage's data
files; evaluate.py measures a model against gold; pipeline.py runs `tether lab`;
tokenizer.py trains the lab's BPE tokenizer; demo.py is `tether sft --demo`.

May import: every floor below it, stages included: the lab composes the stages.
"""
