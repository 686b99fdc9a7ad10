"""Stages of the pipeline, one module each: they wire data, models and the training loops together."""
