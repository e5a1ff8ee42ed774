"""The runtime of every role: the loop that feeds a learner, its pacing, heartbeat, progress and checkpoint transaction, and the one learner factory."""
