"""What can be done to a loaded pipeline, one module per capability, each with apply/remove and its state
(in the spirit of diffusers' hooks/): offload (placement), compilation, LoRA, previews.

The engine realises a handle's load spec, applies these as the run options ask, then runs the task.
"""
