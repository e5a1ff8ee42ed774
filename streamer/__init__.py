"""The panpriv service: sources, codecs, the processing loop, checkpoints, sinks, metrics, CLI."""
