"""Benchmarks through servers in processes of their own: pyspec's server beside
llama-cpp-python's and llama.cpp's under concurrent clients (`pyspec
bench serve` and its modes), the soak of a long-running server (`bench soak`),
and the server process (``process.py``) the server tests start too."""
