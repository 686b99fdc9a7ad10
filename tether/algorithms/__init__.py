"""The maths of post-training as small pure functions over tensors.

Everything in this package imports torch only: no models, tokenizers, configs
or logging. Trainers compose these pieces; tests check each one against a
hand-computed case.
"""
