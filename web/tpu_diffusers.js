// TPU Diffusers in the ComfyUI page: after each run, show on the Sampler and on the nodes of
// ours feeding its `pipeline` input what actually ran (device, mode, load and compile time),
// so a user sees at a glance whether e.g. fused eager fell back or a compile was reused.
// The facts come through ComfyUI's own channel: the Sampler's `ui` output (`tpu_run_info`),
// which the page hands to the node's onExecuted, also for a Sampler inside a subgraph; the File
// Loader's (`tpu_file_status`: its files' quantized formats and whether they stay quantized) stays
// under the run's lines.
import { app } from "../../scripts/app.js";

const CATEGORY = "TPU Diffusers";
const ourTypes = new Set(); // node types of this pack, learnt from their definitions
const LINE_HEIGHT = 14;

const seconds = (value) => `${Number(value).toFixed(1)}s`;

/** Two short lines from a run's info: what ran and how long it took, then the compile outcome. */
function statusText(info) {
  const mode = info.mode.split(" (")[0]; // "compiled (backend inductor)" -> "compiled"
  const facts = [info.device, mode];
  if (info.placement === "model_cpu_offload") facts.push("offload");
  facts.push(info.loaded ? `loaded ${seconds(info.load_seconds)}` : "already loaded");
  facts.push(`sampled ${seconds(info.sample_seconds)}`);
  if (info.peak_device_memory_mb != null) facts.push(`peak ${(info.peak_device_memory_mb / 1024).toFixed(1)} GB`);
  const lines = [facts.join(" · ")];
  if (info.compiled_now === true) lines.push(`compiled now ${seconds(info.compile_seconds)}`);
  else if (info.compiled_now === false) lines.push("compile reused");
  // The detail in brackets: the TorchTPU eager mode, or why fused eager ran as strict eager.
  else if (mode !== info.mode) lines.push(info.mode.slice(mode.length + 2, -1));
  if (info.compiled_now != null) lines.push(cacheLine(info));
  return lines.join("\n");
}

/** Where compiled graphs persist (a process setting) and this run's cache hits, so a user sees
 *  whether a restart reused them. A long path keeps its last three parts, which name it. */
function cacheLine(info) {
  const cache = info.compile_cache ?? {};
  const folder = (info.device === "tpu" && cache.tpu_tier3) || cache.inductor || "?";
  const lookups = info.compile_cache_lookups ?? {};
  const hits = (lookups.fxgraph_hits ?? 0) + (lookups.tpu_hits ?? 0);
  const misses = (lookups.fxgraph_misses ?? 0) + (lookups.tpu_misses ?? 0);
  const parts = folder.split("/");
  const shown = parts.length > 4 ? `…/${parts.slice(-3).join("/")}` : folder;
  return `cache ${shown} · ${hits} hit(s), ${misses} miss(es)`;
}

/** The Sampler and every node of ours up its `pipeline` input chain (Compile, Mesh, Mode, Loader). */
function pipelineChain(sampler) {
  const chain = [];
  const seen = new Set();
  for (let node = sampler; node && ourTypes.has(node.type) && !seen.has(node.id);) {
    chain.push(node);
    seen.add(node.id);
    const slot = node.inputs?.findIndex((input) => input.name === "pipeline") ?? -1;
    node = slot >= 0 ? node.getInputNode(slot) : null;
  }
  return chain;
}

/** The status on the Sampler that ran and on every node of ours feeding it. */
function showRunInfo(sampler, info) {
  const text = statusText(info);
  for (const node of pipelineChain(sampler)) {
    node.tpuStatus = node.tpuFileStatus ? `${text}\n${node.tpuFileStatus}` : text;
  }
  app.canvas.setDirty(true, true);
}

/** Cut a line to the node's width, with an ellipsis, so the status never spills sideways. */
function fit(ctx, line, width) {
  if (ctx.measureText(line).width <= width) return line;
  while (line.length > 1 && ctx.measureText(`${line}…`).width > width) line = line.slice(0, -1);
  return `${line}…`;
}

/** Below the node's bottom edge: clear of its widgets and of the title's badges. */
function drawStatus(node, ctx) {
  ctx.save();
  ctx.font = "12px sans-serif";
  ctx.fillStyle = "#7fd6a6";
  ctx.textAlign = "left";
  ctx.textBaseline = "top";
  node.tpuStatus.split("\n").forEach((line, i) => {
    ctx.fillText(fit(ctx, line, node.size[0] - 8), 4, node.size[1] + 6 + i * LINE_HEIGHT);
  });
  ctx.restore();
}

app.registerExtension({
  name: "tpu_diffusers.status",
  beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.category !== CATEGORY) return;
    ourTypes.add(nodeData.name);
    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (output, ...rest) {
      onExecuted?.call(this, output, ...rest);
      const info = output?.tpu_run_info?.[0]; // the Samplers' run info
      if (info) showRunInfo(this, info);
      const files = output?.tpu_file_status; // the File Loader's: each file's quantized formats
      if (files) {
        this.tpuFileStatus = files.join("\n");
        this.tpuStatus = this.tpuFileStatus;
        app.canvas.setDirty(true, true);
      }
    };
    const onDrawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx, ...rest) {
      onDrawForeground?.call(this, ctx, ...rest);
      if (this.tpuStatus && !this.flags?.collapsed) drawStatus(this, ctx);
    };
  },
});
