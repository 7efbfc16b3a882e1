"""cudal1's built-in task suite: original tasks in KernelBench format, so cudal1 works out of the box.

Layout (task id = ``builtin/level{N}/{name}``):

- ``level1/<name>.py``: single operators (elementwise, reductions, softmax and norms, matmul shapes,
  convolutions, scans).
- ``level2/<name>.py``: fused chains (a GEMM, convolution or batched matmul followed by norms and
  activations, plus a few references written with an avoidable large intermediate).
- ``level3/<name>.py``: small full networks (MLP, pre-norm transformer block, CNN, LSTM step, ResNet stack).
- ``examples/<name>.py``: hand-written candidates (``class ModelNew``) with a real CUDA kernel compiled
  through ``torch.utils.cpp_extension.load_inline``; ``examples/<name>__torch.py``: PyTorch-level rewrites
  without custom CUDA. An example's name (before ``__torch``) is the name of the task it solves.

Each task module holds a docstring, module-level UPPER_CASE size constants, ``SMALL_SIZES`` (overrides for a
small CPU problem), ``class Model``, ``get_inputs()`` and ``get_init_inputs()``; both factories read the
constants at call time so a harness can override them. All tasks are FP32. Full sizes target roughly 1-15 ms
of eager time on an H100/H200; each file states its FLOP/byte estimate next to its constants.
"""

from pathlib import Path

BUILTIN_DIR = Path(__file__).parent
