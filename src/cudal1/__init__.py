"""cudal1: CUDA-L1 end to end — contrastive RL that teaches LLMs to write faster CUDA, and an evaluator
that proves the code is correct and really faster.

Main entry points:
- `cudal1.tasks.load_tasks(spec)`                 tasks from builtin, KernelBench, HF, JSONL releases, files
- `cudal1.eval.evaluate_candidate(task, source)`  the hardened evaluator (the reward)
- `cudal1.analysis.analyze_source(source)`        static analysis and kernel classification
"""

__version__ = "0.1.0"
