"""Datasets shipped with panpriv (package data), with their canonical encoders."""
