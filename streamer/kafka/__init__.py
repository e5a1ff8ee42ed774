"""Kafka clients of the process: their construction and security settings, bounded broker calls, and the local development broker."""
