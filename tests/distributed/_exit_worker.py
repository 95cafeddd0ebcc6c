"""Rank 0 ends its script while a gloo op it started is still waiting, with a Python callback attached: the state
groups other objects hold (DeepSpeed's module globals) can leave behind. Rank 1 joins the op 2 s later, when rank 0's
interpreter is shutting down, so gloo's worker thread runs the callback then.

    torchrun --nproc_per_node 2 _exit_worker.py plain   # rank 0 falls off the end of its script
    torchrun --nproc_per_node 2 _exit_worker.py hard    # rank 0 ends with the example's early exit
"""

import os
import sys
import time

import torch
import torch.distributed as dist

from _launch import leave_without_interpreter_teardown  # the example's own exit

dist.init_process_group("gloo")
tensor = torch.ones(8)
if dist.get_rank() == 0:
    # kept referenced past the end of the script, as DeepSpeed keeps its groups
    pending = dist.all_reduce(tensor, async_op=True).get_future().then(lambda done: done.value())
    if sys.argv[1] == "hard":
        leave_without_interpreter_teardown()
else:
    time.sleep(2)
    try:
        dist.all_reduce(tensor)
    except RuntimeError:
        pass  # under `hard` rank 0 is already gone
    os._exit(0)  # only rank 0's exit is under test
