"""What both halves of the evaluator use: the socket channel, the typed protocol, doorbells, arenas in host and
device memory, the CUDA driver bindings and the output comparison. Nothing here imports the runners' side
(`cudal1.eval.inside`) or the trusted parent's modules."""
