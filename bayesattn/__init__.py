"""bayesattn: attention as explicit Bayesian inference, with calibrated uncertainty."""
