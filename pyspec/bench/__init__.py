"""Side-by-side speed measurements (ratios from one run, never timed tests).

Two rooms over one shared floor; neither imports the other:

* ``inprocess/``: pyspec and llama-cpp-python in this process (`pyspec bench paired`,
  `--paired`, `bench parallel`, `bench multiturn`, the simulator).
* ``serve/``: servers in processes of their own, under concurrent clients
  (`pyspec bench serve`, `--llama-server`, `--multiturn`, `--turns`,
  `bench soak`), and the server process the server tests start.
* here, shared: ``suite.py`` (the prompts), ``conversations.py`` (the
  multi-turn workload), ``stats.py`` (run order, bootstrap interval),
  ``plot.py`` (matplotlib).

Importing a room imports only what it needs: the serving benches and the
server tests never load the in-process stack.
"""
