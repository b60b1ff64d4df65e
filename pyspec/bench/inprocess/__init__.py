"""Benchmarks that run pyspec (and llama-cpp-python) in this process: the prompt
suite (`pyspec bench paired`), paired configurations (`--paired`), batches
(`bench parallel`), multi-turn conversations (`bench multiturn`) and the
replay simulator (`pyspec bench simulate`)."""
