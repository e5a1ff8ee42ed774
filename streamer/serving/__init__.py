"""Released models at work: loading snapshots and scoring records, hold-out evaluation."""
