"""Tell the page what actually ran, so web/tpu_diffusers.js can show it on our nodes."""

from server import PromptServer

RUN_INFO_EVENT = "tpu_diffusers.run_info"


def send_run_info(node_id: str, info: dict) -> None:
    """Device, mode that ran, compile status of one Sampler run, to the client that queued it."""
    server = PromptServer.instance
    server.send_sync(RUN_INFO_EVENT, {"node": node_id, "info": info}, server.client_id)
