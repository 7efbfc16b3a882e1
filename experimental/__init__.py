"""Research code beside the library, NOT part of it: `pip install cudal1` does not ship this folder
(pyproject.toml packages `src/` only), and nothing under `src/cudal1` imports it.

Each subpackage is one piece of research with its own command line under `scripts/` (which puts the
repository's root on `sys.path`) and its tests under `tests/experimental/`. It may use any public part of
`cudal1`; its interfaces may change without notice.

    contrastive_study   does putting scored exemplars in the prompt make RL learn better?
                        (`scripts/contrastive_study.py`; results in docs/results/contrastive_study/)
"""
