"""Tests of ``bayesattn.predictive``."""
