"""Tests of ``bayesattn.nn``."""
