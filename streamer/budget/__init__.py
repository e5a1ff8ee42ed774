"""The privacy budget store shared by every run over the same data: SQLite or a compacted Kafka topic, and one run's session with it."""
