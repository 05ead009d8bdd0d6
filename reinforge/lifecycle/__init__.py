"""A run's life, shared by RL, SFT and reward-model training: checkpoints, what a resume may
change, stopping on a signal, progress lines and the end-of-run summary."""
