"""The loops that call an LLM and the evaluator over and over: `optimize` (CUDA-L1's iterative contrastive
loop on one task) and `augment` (stage-1 SFT data from several models and from published releases).

    from cudal1.loops import OptimizeConfig, optimize
    result = optimize(task, OptimizeConfig(llm="openai:MODEL@http://127.0.0.1:8000/v1", rounds=4), store=store)
"""

from cudal1.loops.augment import AugmentConfig, AugmentResult, augment, export_examples, format_answer
from cudal1.loops.common import RunJournal, SampleRecord, feedback_from
from cudal1.loops.optimize import OptimizeConfig, OptimizeResult, ProgressEvent, RoundSummary, optimize

__all__ = ["AugmentConfig", "AugmentResult", "OptimizeConfig", "OptimizeResult",
           "ProgressEvent", "RoundSummary", "RunJournal", "SampleRecord", "augment", "export_examples",
           "feedback_from", "format_answer", "optimize"]
