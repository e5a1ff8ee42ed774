"""A role's durable state: checkpoints, their seal (integrity), the lock on a state directory, atomic files, and what a run holds between checkpoints."""
