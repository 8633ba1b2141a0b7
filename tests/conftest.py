# pytester's in-process runs drop the modules each run imported; torch's C extension can't be imported a
# second time in one process (it segfaults), so it is imported once here, before any run.
import torch  # noqa: F401
