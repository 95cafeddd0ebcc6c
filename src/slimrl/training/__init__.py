"""Running a training to its end, or stopping it without loss: interruption (interrupt.py), checkpoints and resume
(checkpoints.py), out-of-memory handling (oom.py)."""
