# pytester's in-process runs drop the modules each run imported. torch's C extension can't be imported a
# second time in one process (it segfaults), and a re-imported multiprocessing.forkserver would start a
# fresh forkserver (and its torch import) for every run: both are imported once here, before any run.
import multiprocessing.forkserver  # noqa: F401

import torch  # noqa: F401

import pytest_collectives.execution.pool  # noqa: F401
