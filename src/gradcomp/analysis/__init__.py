"""Analyses that turn op outputs, theory and run artefacts into tables."""
