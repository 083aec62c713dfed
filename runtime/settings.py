"""The pack's environment variables: one table, read when a feature uses them, never at import.

A bad value (TPU_DIFFUSERS_LAUNCH_TIMEOUT=10m) then fails the feature that reads it, with a
message naming the variable and the value, instead of keeping the whole pack from importing.
Imports neither torch nor ComfyUI: ComfyUI's prestartup script reads it before torch starts.
docs/environment.md's table is `markdown_table()` of this one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
from typing import Callable

from .errors import SettingError, UserInputError

KEY_ENV = "TPU_DIFFUSERS_CONTROL_KEY"
ATTACH_ALLOW_ENV = "TPU_DIFFUSERS_ATTACH_ALLOW"
KEY_BYTES = 32  # 256 bits, written as 64 hex digits


def decode_key(key: str) -> bytes:
    """The key as bytes, refused unless it is 64 hex digits. The message never repeats the key."""
    how = (f"it must be {2 * KEY_BYTES} hex digits, as the workers print at start "
           f"(make one with: python -c \"import secrets; print(secrets.token_hex({KEY_BYTES}))\").")
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raise UserInputError(f"the control key is not hex: {how}") from None
    if len(raw) != KEY_BYTES:
        raise UserInputError(f"the control key has {2 * len(raw)} hex digits; {how}")
    return raw


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError("it must be a whole number of at least 1")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError("it must be a number of seconds above 0, without a unit (e.g. 600)")
    return value


def _control_key(text: str) -> str:
    try:
        decode_key(text)
    except UserInputError as e:
        raise ValueError(str(e)) from None
    return text


def _attach_allow_list(text: str) -> tuple[tuple[str, int | None], ...]:
    """(host, port) per entry, port None for a bare host; hosts lowercased and compared as written (never
    resolved). IPv6 hosts go in brackets when a port follows: [fd00::2]:7777."""
    entries = []
    for entry in filter(None, (part.strip() for part in text.split(","))):
        found = re.fullmatch(r"\[([^\[\]\s]+)\](?::(\d+))?", entry) or re.fullmatch(r"([^:\[\]\s]+)(?::(\d+))?", entry)
        if found:
            host, port = found.groups()
        elif _is_ipv6(entry):
            host, port = entry, None
        else:
            raise ValueError(f"'{entry}' is not host:port or host; separate entries with commas "
                             "(e.g. 10.0.0.2:7777,10.0.0.3)")
        entries.append((host.lower(), int(port) if port else None))
    return tuple(entries)


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


XLA_LEVELS = ("O0", "O1", "O2", "O3")


def _xla_level(text: str) -> str:
    if text.upper() not in XLA_LEVELS:
        raise ValueError(f"it must be one of {', '.join(XLA_LEVELS)}")
    return text.upper()


def _choice(*values: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in values:
            raise ValueError(f"it must be one of {', '.join(values)}")
        return text.lower()
    return parse


def _cache_location(text: str) -> str:
    """A local folder (made absolute) or a gs:// location, which TorchTPU's tier-3 cache reads itself."""
    if text.startswith("gs://"):
        return text
    if "://" in text:
        raise ValueError("it must be a local folder or a gs:// location")
    return os.path.abspath(os.path.expanduser(text))


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    kind: str  # what a value looks like, for the docs
    default: object  # used when the variable is unset or empty
    meaning: str
    parse: Callable[[str], object]  # raises ValueError saying what a value must be
    secret: bool = False  # never repeat the value in a message

    @property
    def default_text(self) -> str:
        if self.default is None:
            return "unset"
        return self.default if isinstance(self.default, str) else f"{self.default:g}"


SETTINGS = {setting.name: setting for setting in (
    Setting("TPU_DIFFUSERS_LAUNCH_TIMEOUT", "seconds", 600.0,
            "How long a locally launched TP worker group may take to start and answer.", _seconds),
    Setting("TPU_DIFFUSERS_WORKER_SILENCE_TIMEOUT", "seconds", 3600.0,
            "Longest quiet spell (no step finished) from a busy TP worker group before it is stopped as hung; "
            "a first TPU compile of a big transformer takes many minutes.", _seconds),
    Setting(KEY_ENV, "64 hex digits", None,
            "The TP control channel key: workers started with torchrun use it instead of making one, and the TP "
            "Mesh node's attach uses it: the only place attach takes a key from (a workflow's key field is refused, "
            "as the workflow travels with it).", _control_key, secret=True),
    Setting(ATTACH_ALLOW_ENV, "host:port or host, comma-separated", None,
            "Where the TP Mesh node's attach may connect: a workflow names the address, and the prompt, its input "
            "images and local paths go there, so an address not listed here is refused (nothing is allowed when "
            "unset, loopback included). A host alone allows all its ports; hosts are compared as written, never "
            "resolved; IPv6 in brackets, e.g. [fd00::2]:7777.", _attach_allow_list),
    Setting("TPU_DIFFUSERS_RECOMPILE_LIMIT", "whole number", 64,
            "Shapes (sizes, batch sizes) one compiled transformer may compile before a run fails with a message "
            "(torch's own default is 8).", _positive_int),
    Setting("TPU_DIFFUSERS_COMPILE_CACHE", "folder or gs:// location", None,
            "Where compiled artifacts persist across restarts, instead of ComfyUI/user/tpu_diffusers/compile_cache; "
            "a gs:// location is TorchTPU's tier-3 cache, which every host of a slice can share. Read when ComfyUI "
            "starts.", _cache_location),
    Setting("TPU_DIFFUSERS_WORKER_PROCESS", "tpu, always or never", "tpu",
            "Where runs execute: tpu = runs on a TPU go to a warm worker group (one rank for a single-chip workflow), "
            "so ComfyUI's own process never opens the TPU; CUDA and CPU runs stay in ComfyUI's process. always = every "
            "run goes to worker processes (any device). never = single-chip runs stay in ComfyUI's process (a TP Mesh "
            "still launches workers). Read when ComfyUI starts.", _choice("tpu", "always", "never")),
    Setting("TPU_DIFFUSERS_DOWNLOADS", "allow or forbid", "allow",
            "Whether a hub id in a workflow may download a model that is not on disk yet. forbid = only models "
            "already on disk (or in the Hugging Face cache) load, as ComfyUI itself never downloads a model "
            "because a workflow names it.", _choice("allow", "forbid")),
    Setting("TPU_DIFFUSERS_MEMORY_PLAN", "refuse or warn", "refuse",
            "What a video run does when the per-chip memory plan estimates it cannot fit: refuse = fail before "
            "anything loads, naming a layout that fits; warn = run anyway, the estimate in the run info's notes and "
            "the log. The estimate comes from CPU measurements, not yet from a chip.", _choice("refuse", "warn")),
    Setting("TPU_DIFFUSERS_PIPELINE_KIND", "classic or modular", "classic",
            "Which diffusers pipelines run a model whose family has both: classic = its DiffusionPipeline classes; "
            "modular = the family's diffusers modular blocks (ModularPipeline), on the same loaded components. A "
            "family with only modular blocks always runs modular, one without any always classic. Read when a model "
            "loads (a loaded model keeps its kind until it is unloaded).", _choice("classic", "modular")),
    Setting("TPU_DIFFUSERS_XLA_OPTIMIZATION_LEVEL", "O0, O1, O2 or O3", None,
            "TorchTPU's XLA optimisation level (O0 compiles fastest), instead of TorchTPU's default. Read when "
            "ComfyUI starts.", _xla_level),
)}


def get(name: str):
    """The variable's value, checked, or its default when unset; a bad value raises SettingError."""
    setting = SETTINGS[name]
    text = os.environ.get(name, "").strip()
    if not text:
        return setting.default
    try:
        return setting.parse(text)
    except ValueError as e:
        shown = "(value not shown: it is a secret)" if setting.secret else f"is {text!r}"
        raise SettingError(f"environment variable {name} {shown}, which cannot be used: {str(e).rstrip('.')}. "
                           f"{setting.meaning} Fix or unset it (default: {setting.default_text}).") from None


def markdown_table() -> str:
    """The table README.md shows, written from SETTINGS so the two cannot drift apart."""
    rows = ["| variable | value | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{s.name}` | {s.kind} | {s.default_text} | {s.meaning} |" for s in SETTINGS.values()]
    return "\n".join(rows)

