"""The training side: what a user attaches to a model (policies, the attachment and what compresses each
gradient, the noise ratio and guard, QAT), and what the pipeline trains with (configuration, data, models,
the training loop, probes and distributed runs)."""
