"""Thin adapters of the evaluator to training frameworks: TRL reward functions and verl reward/data.

`cudal1.integrations.trl.make_trl_reward` and `cudal1.integrations.verl.compute_score` /
`export_verl_parquet`. Neither imports TRL or verl: they produce the plain callables and files those
frameworks consume.
"""
