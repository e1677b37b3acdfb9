"""Tests of ``bayesattn.calibration``."""
