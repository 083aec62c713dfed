"""Errors that carry a message for the person who built the workflow.

ComfyUI shows an exception's text on the node that raised it, so every error a user
can cause says what is wrong and what to change.
"""


class UserInputError(ValueError):
    """Something in the workflow (a model name, a size, a setting) cannot work as given."""


class ModelLoadError(RuntimeError):
    """A model folder exists but could not be read (corrupt, truncated, incomplete)."""


class SettingError(ValueError):
    """One of the pack's environment variables has a value it cannot use (see runtime/settings.py)."""
