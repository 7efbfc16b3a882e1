"""Tasks (reference modules in KernelBench format), their loaders and the built-in suite."""

from cudal1.tasks.sources import builtin_examples, find_task, load_candidates, load_release, load_tasks
from cudal1.tasks.task import Candidate, Reference, Task, load_reference, source_hash

__all__ = ["Task", "Candidate", "Reference", "load_reference", "source_hash", "load_tasks", "load_release",
           "load_candidates", "find_task", "builtin_examples"]
