"""Tensor parallelism: one worker process per chip, kept warm, driven from the ComfyUI process.

mesh.py       the TP Mesh spec and the checks made before anything is launched
sharding.py   how each pipeline component loads on a rank (sharded by its TP plan, or whole)
cpu_mesh.py   the two things diffusers lacks for TP on a CPU mesh (development and tests)
channel.py    the authenticated control channel between ComfyUI and rank 0
worker.py     the worker program each rank runs (started by torchrun)
group.py      launching / attaching to a worker group and calling it
"""
