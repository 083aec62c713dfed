"""Tensor parallelism: one worker process per chip, kept warm, driven from the ComfyUI process.

This package sits below the engine: it imports none of the engine's modules (the request's plan reaches
group.py as plain data), and the program each rank runs, which runs an engine, is runtime/worker_program.py.

mesh.py       the TP Mesh spec and the checks made before anything is launched
sharding.py   how each pipeline component loads on a rank (sharded by its TP plan, or whole)
cpu_mesh.py   the two things diffusers lacks for TP on a CPU mesh (development and tests)
channel.py    the authenticated control channel between ComfyUI and rank 0
launcher.py   starts torchrun, whose ranks run runtime/worker_program.py
group.py      launching / attaching to a worker group and calling it
"""
