"""The libraries behind pyspec's smaller commands, each usable without the CLI:
``check.py`` (`pyspec check`, `bench verify`: the sampling checks), ``info.py``
(`pyspec info`: the build and the machine), ``quantize.py`` (`pyspec quantize`).
The larger commands have rooms of their own: ``pyspec/agree/``,
``pyspec/bench/``, ``pyspec/server/``; ``pyspec/cli/`` holds only the click
layer over all of them."""
