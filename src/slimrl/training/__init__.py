"""Running a training to its end, or stopping it without loss: interruption (interrupt.py), checkpoints and resume
(checkpoints.py, adapter_resume.py), out-of-memory handling (oom.py), the thread policy between steps
(thread_watch.py)."""
