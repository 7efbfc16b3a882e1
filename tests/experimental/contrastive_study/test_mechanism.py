"""SYNTHETIC landscapes only: the mechanism the study rests on, on procedurally generated landscapes (no GPU,
no measured table). An improver pre-trained with the project's SFT stage on synthetic landscapes, smaller and
shorter than the study's (2 layers, 10,000 examples, about a minute on one core), is given k = 4 scored
recipes of 60 fresh landscapes: its answers beat random recipes, and permuting the scores among the same
recipes (the code text kept) makes them worse: it reads the scores, not only the code."""

from __future__ import annotations

import pytest

from experimental.contrastive_study.improver import ImproverSize, exemplar_reading, pretrain


@pytest.fixture(scope="module")
def improver(tmp_path_factory):
    import torch

    from cudal1.train.models import load_policy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = pretrain(tmp_path_factory.mktemp("improver"), seed=0, examples=10000, learning_rate=3e-3,
                        size=ImproverSize(hidden=128, layers=2, intermediate=256), k_choices=(3, 4, 5))
    finally:
        torch.set_num_threads(threads)
    return load_policy(str(path))


def test_synthetic_the_pretrained_improver_beats_random_and_reads_the_scores(improver):
    found = exemplar_reading(*improver, landscapes=60, samples=16)
    vs_random, vs_shuffled = found["true_minus_random"], found["true_minus_shuffled"]
    assert vs_random["mean"] > 0.05 and vs_random["mean"] > 3 * vs_random["se"], found
    assert vs_shuffled["mean"] > 0.02 and vs_shuffled["mean"] > 3 * vs_shuffled["se"], found
