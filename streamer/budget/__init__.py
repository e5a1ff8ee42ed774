"""The privacy budget shared by every run over the same data: the store (SQLite, or a compacted Kafka topic), the
rules both follow, charging ahead, and one run's session with it."""
