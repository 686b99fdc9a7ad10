"""Training machinery that every stage shares: schedule, checkpoints, logging, the offline loop."""
