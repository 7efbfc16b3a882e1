"""The contrastive study: does putting scored exemplars in the prompt make RL learn better?

One module per job: `recipes` (the recipe grammar), `ops` (tasks, features, split), `kernels` (recipe ->
CUDA, launch, candidate module), `bench` + `measure` (the GPU table), `spotcheck` (the table against the
evaluator), `table` (reading it, and drawing an evaluation's noise), `perturb` (held-out tables relabelled),
`surrogate` (an analytic stand-in for CPU tests, never a result), `landscapes` (synthetic pre-training
landscapes), `prompting` (vocabulary, prompts, styles, the refinement's history), `improver` (the policy),
`arms` (how each arm spends its evaluations), `run` (seeds, resumption, the summary), `stats`, `shaping`
(the advantages' noise, measured), `provenance` (code, libraries, host and date of a result).
The command line is `scripts/contrastive_study.py`.
"""
