"""Tests of ``bayesattn.diagnostics``."""
