"""The scheduling loop: request intake, scheduler, sequences, the model runner and its CUDA
graphs, sampling, detokenization, output."""
