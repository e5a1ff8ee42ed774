"""Bytes in and out: record codecs, recordings, source URLs, random access to recorded files, snapshot sinks."""
