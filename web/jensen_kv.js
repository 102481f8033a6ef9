// Jensen KV web extension: shows what the KV cache will cost, and what it did cost.
//
// - On "Quantize KV Cache": a live line with the effective bits of the key / value cache and the
//   compression against BF16, a warning line, and a memory planner (video size, chunking, model
//   dimensions -> projected peak cache size at BF16 and at the chosen setting).
// - On the chunked AR samplers and on KV Cache Report (core's SamplerARVideo path): the report of the
//   last run (cache MiB, seconds per chunk).
// - "Follow the workflow" reads the pack's sampler, or core's path: SamplerCustom(Advanced) with
//   SamplerARVideo (its frames per block are the chunk), the guider's cfg, EmptyARVideoLatent, and
//   an AR Cache Window on the MODEL path (window, sink).
//
// Every number comes from the server (routes/ui.py, which calls jensen_core); this file only
// collects inputs, asks /jensen_kv/spec and /jensen_kv/plan, and displays the answers. There is
// deliberately no copy of the formula here.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const QUANT_NODE = "JensenKVQuantizeKVCache";
// the pack's own Chunked AR samplers; a model family's own sampler is the server's to
// name: /jensen_kv/options "samplers" (its node id -> its family, the planner fields read from its widgets and
// those it fixes, the fields of its own the plan takes)
const SAMPLER_NODES = new Set(["JensenKVChunkedARSampler", "JensenKVChunkedARSamplerSimple"]);
// ComfyUI's own samplers that run SamplerARVideo (v0.27+): followed for the planner
const CORE_SAMPLER_NODES = new Set(["SamplerCustomAdvanced", "SamplerCustom"]);
// nodes that show a run's report: the samplers above, KV Cache Report, and any node with a report output
const REPORT_NODES = new Set([...SAMPLER_NODES, "JensenKVCacheReport"]);
const REPORT_TYPE = "JENSEN_KV_REPORT";
const WINDOW_NODE = "JensenKVARCacheWindow";
const PANEL = "jensen_kv_panel";
const REPORT = "jensen_kv_report";
const STATE_KEY = "jensen_kv_planner";
const SPEC_WIDGETS = ["key_bits", "value_bits", "group_size", "rotation", "scale_format",
  "method", "qvg_stages", "qvg_centroids", "qvg_iters"];
// precision by age: only the plan takes them (each held chunk at its own bits)
const TIER_WIDGETS = ["recent_chunks_bits", "recent_chunks", "sink_bits", "recent_chunks_key_bits"];
// precision by head: only the plan takes them too (the promoted heads' keys at head_bits)
const HEAD_WIDGETS = ["head_bits", "head_fraction"];
// planner fields that "follow the workflow" reads from the latent and sampler nodes
const FOLLOWED = ["width", "height", "frames", "batch", "chunk_frames", "window_chunks", "sink_chunks", "cfg_branches"];
const PLANNER_FIELDS = ["preset", "width", "height", "frames", "batch", "chunk_frames", "window_chunks", "sink_chunks", "cfg_branches", "ranks"];
const POLL_MS = 300;
const BITS_TITLE = "Stored bits per cached element, scales and zero-points included (bits + (scale + zero bits) / group size; "
  + "QVG adds its cluster ids and BF16 centroids per chunk), and how much smaller that is than a BF16 cache. "
  + "Computed by the server (jensen_core).";

const FIELD_INFO = {
  preset: ["model", "Model whose attention the cache holds; presets fill layers, heads and head_dim."],
  layers: ["layers", "Transformer blocks (each caches its own keys and values)."],
  heads: ["heads", "Attention heads per block."],
  head_dim: ["head dim", "Channels per head; the group size must divide it."],
  width: ["width", "Video width in pixels (a whole number of the model's patches: the plan says when it is not)."],
  height: ["height", "Video height in pixels (a whole number of the model's patches: the plan says when it is not)."],
  frames: ["frames", "Video frames (the model's VAE takes frames in steps: the plan says how many latent frames)."],
  batch: ["batch", "Videos sampled at once (latent batch size)."],
  chunk_frames: ["chunk", "Latent frames per chunk (the sampler's chunk_frames)."],
  window_chunks: ["window", "Finished chunks kept in the cache; 0 keeps them all (the sampler's window_chunks)."],
  sink_chunks: ["sink", "First chunks kept for good with a window: the attention sink (the sampler's sink_chunks)."],
  cfg_branches: ["cfg branches", "1 when cfg is 1; 2 when cfg > 1 (cond and uncond keys are both cached)."],
  ranks: ["ranks", "GPUs sharing every layer's heads (Raylight's Ulysses degree); the bytes are then one GPU's. 1 without Raylight."],
};

// ------------------------------------------------------------------------------------------ server
let optionsPromise = null;
function getOptions() {
  if (!optionsPromise) {
    optionsPromise = getJSON("/jensen_kv/options").catch((err) => {
      optionsPromise = null; // retry on the next refresh
      throw err;
    });
  }
  return optionsPromise;
}

async function getJSON(path, params) {
  const given = Object.entries(params ?? {}).filter(([, v]) => v != null && v !== "");
  const query = given.length ? "?" + new URLSearchParams(given).toString() : "";
  const res = await api.fetchApi(path + query);
  let body = null;
  try {
    body = await res.json();
  } catch (_) {
    /* not JSON: handled below */
  }
  if (!res.ok) {
    const err = new Error(body?.error ?? `${path} answered HTTP ${res.status}`);
    err.param = body?.param;
    throw err;
  }
  return body;
}

// ------------------------------------------------------------------------------------------ helpers
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

const fmt = (x, d) => x.toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: d });
// sizes as MiB (KiB below 1 MiB, where MiB would round to 0.00x)
const bytesText = (bytes) => (bytes == null ? "–"
  : bytes < 2 ** 20 ? `${fmt(bytes / 2 ** 10, 1)} KiB`
    : bytes < 2 ** 30 ? `${fmt(bytes / 2 ** 20, 1)} MiB` : `${fmt(bytes / 2 ** 30, 2)} GiB`);
const num = (x, d = 2) => (x == null ? "–" : Number(x).toLocaleString("en-US", { maximumFractionDigits: d }));
const widgetValue = (node, name) => node?.widgets?.find((w) => w.name === name)?.value;

function injectStyle() {
  if (document.getElementById("jensen-kv-style")) return;
  const css = `
  .jkv-panel { font: 11px/1.35 sans-serif; color: var(--fg-color, #ddd); width: 100%; height: 100%;
               overflow: hidden auto; box-sizing: border-box; padding: 2px 4px; }
  .jkv-line { white-space: normal; }
  .jkv-bits { font-weight: 600; }
  .jkv-warn { color: #f0b040; margin-top: 2px; }
  .jkv-warn.jkv-error, .jkv-error { color: var(--error-text, #ff6b6b); }
  .jkv-warn:empty { display: none; }
  .jkv-panel details { margin-top: 3px; }
  .jkv-panel summary { cursor: pointer; }
  .jkv-grid { display: grid; grid-template-columns: repeat(3, auto minmax(0, 1fr)); gap: 2px 4px; margin: 3px 0; align-items: center; }
  .jkv-grid label { opacity: 0.8; text-align: right; white-space: nowrap; }
  .jkv-grid .jkv-wide { grid-column: 2 / -1; }
  .jkv-grid input, .jkv-grid select { width: 100%; min-width: 0; box-sizing: border-box; font-size: 11px;
               background: var(--comfy-input-bg, #222); color: var(--input-text, #ddd);
               border: 1px solid var(--border-color, #555); border-radius: 3px; padding: 0 2px; }
  .jkv-grid input:disabled { opacity: 0.6; }
  .jkv-table td { padding: 0 6px 0 0; }
  .jkv-table td:first-child { opacity: 0.8; }
  .jkv-num { font-variant-numeric: tabular-nums; }
  .jkv-report { font: 11px/1.35 sans-serif; color: var(--fg-color, #ddd); white-space: pre-wrap; padding: 2px 4px;
               width: 100%; height: 100%; overflow: hidden auto; box-sizing: border-box; }
  `;
  document.head.append(el("style", { id: "jensen-kv-style", text: css }));
}

function addPanelWidget(node, name, element, estimateHeight) {
  // stop the canvas from treating typing in our inputs as shortcuts (e.g. Delete removes the node)
  for (const type of ["keydown", "keyup", "keypress"]) element.addEventListener(type, (e) => e.stopPropagation());
  const margin = 4;
  const widget = node.addDOMWidget(name, name, element, {
    serialize: false,
    hideOnZoom: true,
    margin,
    // measured once the element is on the page (content + the panel's padding + the widget's
    // margins), estimated before (the canvas mounts DOM widgets only while they are visible)
    // (only once it has the node's width: a freshly mounted element may be narrow, its text tall)
    getMinHeight: () => {
      const laidOut = element.isConnected && element.clientWidth >= 0.6 * node.size[0];
      const h = laidOut ? element.firstElementChild?.scrollHeight ?? 0 : 0;
      return h > 0 ? h + 6 + 2 * margin : estimateHeight();
    },
  });
  widget.serialize = false; // keep widgets_values of saved workflows free of display-only widgets
  return widget;
}

function fitNode(node) {
  const size = node.computeSize();
  node.setSize([Math.max(node.size[0], size[0]), size[1]]);
  node.setDirtyCanvas?.(true, true);
}

// ------------------------------------------------------------------------------- graph following
function downstreamSampler(node, familySamplers) {
  // the pack's sampler, a family's own (familySamplers: the server's), or core's SamplerCustom(Advanced) (through
  // guiders); AR Cache Window nodes on the way
  const seen = new Set([node.id]);
  const windows = [];
  let frontier = [node];
  for (let depth = 0; depth < 8 && frontier.length; depth++) {
    const next = [];
    for (const n of frontier) {
      for (let slot = 0; slot < (n.outputs?.length ?? 0); slot++) {
        for (const m of n.getOutputNodes(slot) ?? []) {
          if (seen.has(m.id)) continue;
          seen.add(m.id);
          if (m.type === WINDOW_NODE) windows.push(m);
          if (SAMPLER_NODES.has(m.type) || CORE_SAMPLER_NODES.has(m.type) || familySamplers?.[m.type]) {
            return { sampler: m, windows };
          }
          next.push(m);
        }
      }
    }
    frontier = next;
  }
  return { sampler: null, windows };
}

function inputNode(node, name) {
  const slot = node?.inputs?.findIndex((i) => i.name === name) ?? -1;
  return slot >= 0 ? node.getInputNode(slot) : null;
}

function upstreamWindow(node) {
  // an AR Cache Window before Quantize KV Cache on the MODEL path
  let n = inputNode(node, "model");
  for (let depth = 0; n && depth < 8; depth++) {
    if (n.type === WINDOW_NODE) return n;
    n = inputNode(n, "model");
  }
  return null;
}

function upstreamLatent(sampler) {
  let n = inputNode(sampler, "latent") ?? inputNode(sampler, "latent_image");
  // walk through pass-through nodes (reroutes, latent batch tools, ARVideoI2V) until a node states the size
  for (let depth = 0; n && depth < 6; depth++) {
    if (widgetValue(n, "width") != null && widgetValue(n, "height") != null) return n;
    const idx = n.inputs?.findIndex((i) => i.type === "LATENT" || i.type === "*") ?? -1;
    n = idx >= 0 ? n.getInputNode(idx) : null;
  }
  return null;
}

function upstreamLoader(node) {
  // the node that loads the MODEL this one takes (walking through the MODEL inputs: Quantize KV Cache, Jensen, ...)
  let n = inputNode(node, "model");
  for (let depth = 0; n && depth < 8; depth++) {
    if (widgetValue(n, "model_name") != null || widgetValue(n, "unet_name") != null) return n;
    n = inputNode(n, "model");
  }
  return null;
}

function loaderFile(fields, loader) {
  // the plan reads the dimensions of the loader's file from its header (routes/ui.py model_of_file): one
  // safetensors file in models/diffusion_models (a MAGI-1 shard folder or a GGUF file keeps the preset)
  const file = widgetValue(loader, "unet_name") ?? widgetValue(loader, "model_name");
  if (file != null && String(file).toLowerCase().endsWith(".safetensors")) fields.model_file = String(file);
  return file;
}

function presetOfFile(options, fileName) {
  // the preset whose model files the loader names (the bundled tiny AR model), else none
  const file = String(fileName ?? "").split(/[\\/]/).pop();
  return Object.entries(options?.presets ?? {}).find(([, p]) => (p.files ?? []).includes(file)) ?? [];
}

function familyPreset(options, family, fileName, current) {
  // a preset of the family: the one whose size ("24B") the loader's file name carries, else the one chosen
  // already, else the family's first
  const presets = Object.entries(options?.presets ?? {}).filter(([, p]) => p.family === family);
  const file = String(fileName ?? "").toLowerCase();
  const bySize = presets.find(([, p]) => file.includes(String(p.label).split(" ").pop().toLowerCase()));
  return bySize ?? presets.find(([name]) => name === current) ?? presets[0] ?? [];
}

function fromWorkflow(node) {
  const found = {};
  const fields = {};  // the family sampler's own inputs the plan takes (a family's sampler inputs that decide its window 0)
  const options = node.jensenKv?.options;
  const { sampler, windows } = downstreamSampler(node, options?.samplers);
  if (!sampler) return { found, fields, sampler: null };
  // the node that shows the measured report: the pack's sampler itself, or a KV Cache Report after core's
  let reporter = sampler;
  const family = options?.samplers?.[sampler.type];
  if (CORE_SAMPLER_NODES.has(sampler.type)) {
    // core's AR path: chunk = SamplerARVideo's block, window and sink from AR Cache Window, cfg from the guider
    const arSampler = inputNode(sampler, "sampler");
    const block = arSampler?.type === "SamplerARVideo" ? widgetValue(arSampler, "num_frame_per_block") : null;
    if (block != null) found.chunk_frames = block;
    const win = windows[0] ?? upstreamWindow(node);
    found.window_chunks = win ? (widgetValue(win, "window_chunks") ?? 0) : 0;
    found.sink_chunks = win ? (widgetValue(win, "sink_chunks") ?? 0) : 0;
    const guider = inputNode(sampler, "guider");
    const cfg = widgetValue(guider ?? sampler, "cfg");
    found.cfg_branches = cfg != null && Number(cfg) > 1 ? 2 : 1;
    const loader = upstreamLoader(node);  // core's sampler takes the MODEL through its guider: start at this node
    const [name, p] = presetOfFile(options, loaderFile(fields, loader));
    if (p) Object.assign(found, { preset: name, layers: p.layers, heads: p.heads, head_dim: p.head_dim });
    for (let slot = 0; slot < (sampler.outputs?.length ?? 0); slot++) {
      const r = (sampler.getOutputNodes(slot) ?? []).find((m) => m.type === "JensenKVCacheReport");
      if (r) { reporter = r; break; }
    }
  } else if (family) {
    // a family's own sampler: the family's preset (the one whose size the loader's file names), its chunk, and a
    // context the sampler rebuilds before every chunk (window = its chunks, no sink); the planner fields on the
    // sampler's widgets, those it fixes, and its own fields the plan takes
    const loader = upstreamLoader(sampler);
    const current = node.properties?.[STATE_KEY]?.preset;
    const file = loaderFile(fields, loader);
    const [name, p] = familyPreset(options, family.family, file, current);
    if (p) Object.assign(found, { preset: name, layers: p.layers, heads: p.heads, head_dim: p.head_dim, chunk_frames: p.chunk_frames });
    if (p?.context_frames) Object.assign(found, { window_chunks: p.context_frames / p.chunk_frames, sink_chunks: 0 });
    for (const f of family.inputs) {
      const v = widgetValue(sampler, f);
      if (v != null) found[f] = v;
    }
    Object.assign(found, family.fixed);
    for (const f of family.fields) {
      const v = widgetValue(sampler, f);
      if (v != null) fields[f] = String(v);
    }
    if (family.inputs.includes("frames")) return { found, fields, sampler };  // the video is on the sampler
  } else {
    // the plain Wan sampler: the preset of the loader's file where one names it (the bundled tiny model)
    const loader = upstreamLoader(sampler);
    const [name, p] = presetOfFile(options, loaderFile(fields, loader));
    if (p) Object.assign(found, { preset: name, layers: p.layers, heads: p.heads, head_dim: p.head_dim });
    for (const name of ["chunk_frames", "window_chunks", "sink_chunks"]) {
      const v = widgetValue(sampler, name);
      if (v != null) found[name] = v;
    }
    const cfg = widgetValue(sampler, "cfg");
    if (cfg != null) found.cfg_branches = Number(cfg) > 1 ? 2 : 1;
  }
  const latent = upstreamLatent(sampler);
  if (latent) {
    for (const [field, name] of [["width", "width"], ["height", "height"], ["frames", "length"], ["batch", "batch_size"]]) {
      const v = widgetValue(latent, name);
      if (v != null) found[field] = v;
    }
  }
  return { found, fields, sampler: reporter };
}

// ----------------------------------------------------------------------------- quantize node panel
const quantNodes = new Set();

function plannerState(node, defaults) {
  const props = (node.properties ??= {});
  const s = (props[STATE_KEY] ??= {});
  for (const [k, v] of Object.entries(defaults)) if (s[k] == null) s[k] = v;
  s.follow ??= true;
  s.open ??= true;
  return s;
}

function buildQuantPanel(node) {
  const ui = { inputs: {} };
  ui.bits = el("div", { class: "jkv-line jkv-bits jkv-num", "data-jkv": "bits",
    title: BITS_TITLE,
    text: "…" });
  ui.warn = el("div", { class: "jkv-line jkv-warn", "data-jkv": "warnings" });
  ui.summary = el("summary", { "data-jkv": "planner-summary",
    title: "Projected peak size of the KV cache over a whole run: every layer and CFG branch, keys and values." }, "Memory planner");
  const grid = el("div", { class: "jkv-grid" });
  ui.preset = el("select", { "data-jkv": "preset", class: "jkv-wide", title: FIELD_INFO.preset[1] });
  grid.append(el("label", { text: FIELD_INFO.preset[0], title: FIELD_INFO.preset[1] }), ui.preset);
  for (const name of ["layers", "heads", "head_dim", "width", "height", "frames", "batch", "chunk_frames", "window_chunks", "sink_chunks", "cfg_branches", "ranks"]) {
    const input = el("input", { type: "number", step: "1", "data-jkv": `in-${name}`, title: FIELD_INFO[name][1] });
    ui.inputs[name] = input;
    grid.append(el("label", { text: FIELD_INFO[name][0], title: FIELD_INFO[name][1] }), input);
  }
  ui.follow = el("input", { type: "checkbox", "data-jkv": "follow" });
  const followLabel = el("label", { class: "jkv-line",
    title: "Read width, height, frames and batch from the latent node, and chunk, window and cfg from the sampler this model feeds." },
    ui.follow, " follow the workflow (latent size, chunk, window, cfg)");
  ui.result = el("table", { class: "jkv-table jkv-num", "data-jkv": "plan" });
  ui.measured = el("div", { class: "jkv-line jkv-num", "data-jkv": "measured" });
  ui.details = el("details", { open: "" }, ui.summary, grid, followLabel, ui.result, ui.measured);
  const content = el("div", {}, ui.bits, ui.warn, ui.details);
  ui.root = el("div", { class: "jkv-panel" }, content);
  return ui;
}

function attachQuantPanel(node) {
  injectStyle();
  const ui = buildQuantPanel(node);
  node.jensenKv = { ui, key: null, busy: false, plan: null, spec: null, error: null, options: null };
  addPanelWidget(node, PANEL, ui.root, () => (ui.details.open ? 330 : 70));
  node.setSize([Math.max(node.size[0], 340), node.size[1]]);
  quantNodes.add(node);

  const edited = (name, value) => {
    const s = node.properties?.[STATE_KEY];
    if (!s) return;
    s[name] = value;
    if (["layers", "heads", "head_dim"].includes(name)) s.preset = "custom";
    schedule(node);
  };
  for (const [name, input] of Object.entries(ui.inputs)) {
    input.addEventListener("change", () => edited(name, input.value === "" ? null : Number(input.value)));
  }
  ui.preset.addEventListener("change", () => {
    const s = node.properties?.[STATE_KEY];
    const p = node.jensenKv.options?.presets?.[ui.preset.value];
    if (!s) return;
    s.preset = ui.preset.value;
    if (p) Object.assign(s, { layers: p.layers, heads: p.heads, head_dim: p.head_dim });
    schedule(node);
  });
  ui.follow.addEventListener("change", () => edited("follow", ui.follow.checked));
  ui.details.addEventListener("toggle", () => {
    const s = node.properties?.[STATE_KEY];
    if (s) s.open = ui.details.open;
    requestAnimationFrame(() => fitNode(node));
  });
  // react at once to the node's own widgets (the poll below catches everything else)
  for (const w of node.widgets ?? []) {
    if (!SPEC_WIDGETS.includes(w.name)) continue;
    const cb = w.callback;
    w.callback = function (...args) {
      const r = cb?.apply(this, args);
      schedule(node);
      return r;
    };
  }
  schedule(node);
}

function requestFor(node, state) {
  const spec = {};
  for (const name of SPEC_WIDGETS) {
    const v = widgetValue(node, name);
    if (v != null) spec[name] = String(v);
  }
  const { found, fields, sampler } = state.follow ? fromWorkflow(node) : { found: {}, fields: {}, sampler: null };
  const values = { ...state, ...found };
  const plan = { ...spec, preset: values.preset, ...fields };
  for (const name of [...TIER_WIDGETS, ...HEAD_WIDGETS]) {
    const v = widgetValue(node, name);
    if (v != null) plan[name] = String(v);
  }
  for (const name of ["layers", "heads", "head_dim", "ranks", ...FOLLOWED]) {
    if (values[name] != null && values[name] !== "") plan[name] = String(values[name]);
  }
  const report = sampler?.jensenKvReport ?? null;
  return { spec: { ...spec, head_dim: plan.head_dim }, plan, found, sampler, report, values };
}

function schedule(node) {
  // the poll loop compares the request with the last one; make the next tick see a change
  if (node.jensenKv) node.jensenKv.key = null;
  queueMicrotask(() => refresh(node));
}

async function refresh(node) {
  const st = node.jensenKv;
  if (!st || st.busy) return;
  let options;
  try {
    options = st.options ?? (st.options = await getOptions());
  } catch (err) {
    renderError(node, `planner unavailable: ${err.message}`);
    return;
  }
  const defaults = Object.fromEntries(PLANNER_FIELDS.map((k) => [k, options.defaults[k]]));
  const state = plannerState(node, { ...defaults, ...presetDims(options, options.defaults.preset) });
  const req = requestFor(node, state);
  // remember what the workflow says, so unticking "follow" starts from the values shown
  Object.assign(state, req.found);
  const key = keyOf(req);
  if (key === st.key) return;
  st.key = key;
  st.busy = true;
  try {
    const [spec, plan] = await Promise.allSettled([getJSON("/jensen_kv/spec", req.spec), getJSON("/jensen_kv/plan", req.plan)]);
    st.spec = spec.status === "fulfilled" ? spec.value : null;
    st.plan = plan.status === "fulfilled" ? plan.value : null;
    st.error = [...new Set([spec, plan].filter((r) => r.status === "rejected").map((r) => r.reason.message))];
    render(node, options, state, req);
  } finally {
    st.busy = false;
  }
  // inputs may have changed while the request was in flight
  if (requestKey(node) !== st.key) schedule(node);
}

function requestKey(node) {
  const st = node.jensenKv;
  const state = node.properties?.[STATE_KEY];
  if (!st?.options || !state) return null;
  return keyOf(requestFor(node, state));
}

// what a refresh depends on: the two queries and the last measured report
const keyOf = (req) => JSON.stringify([req.spec, req.plan, req.report?.cache_bytes ?? null]);

function presetDims(options, name) {
  const p = options.presets?.[name];
  return p ? { layers: p.layers, heads: p.heads, head_dim: p.head_dim } : {};
}

function renderError(node, message) {
  const ui = node.jensenKv.ui;
  ui.bits.textContent = "–";
  ui.warn.className = "jkv-line jkv-warn jkv-error";
  ui.warn.textContent = message;
}

function render(node, options, state, req) {
  const { ui, plan, error } = node.jensenKv;
  // live line: the plan's spec summary is exact at the run's head_dim and tokens per chunk (QVG's
  // centroids depend on them); the bare spec answer stands in until the plan arrives
  const spec = plan?.spec ?? node.jensenKv.spec;
  if (spec) {
    // QVG: the K per chunk (what auto picks for the chosen resolution and chunk length) once the plan knows the chunk
    const qvgK = (s) => (s.centroids == null ? (s.auto_centroids ? " K auto" : "") : ` K=${s.centroids}${s.auto_centroids ? " (auto)" : ""}`);
    const qvg = (s) => (s.method === "qvg" ? ` QVG${qvgK(s)}${s.exact ? "" : "+"}` : "");
    const side = (s) => (s.quantized ? `${num(s.effective_bits, 3)} bits${qvg(s)}` : "BF16");
    // a setting that cannot run (the server sends no compression, or the plan says so) gets no ratio
    const impossible = spec.compression == null || (plan != null && !plan.runnable);
    ui.bits.textContent = impossible
      ? `K ${side(spec.key)} · V ${side(spec.value)} → cannot run: see the warning below`
      : plan?.tiers
        ? `K ${side(spec.key)} · V ${side(spec.value)}, tiers ${plan.tiers} → ${num(plan.effective_bits, 3)} bits on average, `
          + `${num(plan.compression, 2)}× smaller than BF16`
        : plan?.head_bits && plan.runnable
          ? `K ${num(plan.effective_bits_k, 3)} bits (${plan.promoted_heads} head(s) per layer at ${plan.head_bits.split("@")[1]}) · `
            + `V ${side(spec.value)} → ${num(plan.compression, 2)}× smaller than BF16`
        : `K ${side(spec.key)} · V ${side(spec.value)} → ${num(spec.compression, 2)}× smaller than BF16`;
    ui.bits.title = [BITS_TITLE, ...new Set([spec.key.note, spec.value.note].filter(Boolean))].join("\n");
    ui.bits.dataset.effectiveBits = spec.effective_bits;
    ui.bits.dataset.compression = spec.compression ?? "";
  } else {
    ui.bits.textContent = "–";
  }
  // warnings: errors (the run would stop) first, then warnings
  const errors = [...(error ?? []), ...(plan?.errors ?? spec?.errors ?? [])];
  const warnings = plan?.warnings ?? [];
  ui.warn.className = "jkv-line jkv-warn" + (errors.length ? " jkv-error" : "");
  ui.warn.textContent = [...errors, ...warnings].map((m) => `⚠ ${m}`).join("\n");
  ui.warn.style.whiteSpace = "pre-wrap";

  // planner inputs (do not overwrite what the user is typing)
  if (!ui.preset.options.length) {
    for (const [name, p] of Object.entries(options.presets)) ui.preset.append(el("option", { value: name, text: p.label }));
    ui.preset.append(el("option", { value: options.custom_preset, text: "custom" }));
  }
  const shownPreset = plan?.model?.preset ?? state.preset;
  if (document.activeElement !== ui.preset) ui.preset.value = shownPreset;
  const fromFile = plan?.model?.source ? plan.model : null;  // the loader's file, read from its header
  for (const [name, input] of Object.entries(ui.inputs)) {
    const range = options.ranges?.[name];
    if (range) { input.min = range.min; input.max = range.max; }
    const ofFile = fromFile != null && ["layers", "heads", "head_dim"].includes(name);
    const followed = ofFile || (state.follow && req.found[name] != null);
    input.disabled = followed;
    input.title = FIELD_INFO[name][1] + (ofFile ? ` (read from ${fromFile.source})`
      : followed ? " (from the workflow; untick 'follow' to edit)" : "");
    if (document.activeElement !== input) input.value = (ofFile ? fromFile[name] : req.values[name]) ?? "";
  }
  ui.follow.checked = !!state.follow;
  if (ui.details.open !== !!state.open) ui.details.open = !!state.open;

  // planner results
  ui.result.replaceChildren();
  if (plan) {
    const row = (label, value, attrs = {}) => ui.result.append(el("tr", {}, el("td", { text: label }), el("td", { ...attrs, text: value })));
    const v = plan.video;
    row("latent", `${plan.latent_frames} frames × ${v.latent_height}×${v.latent_width} → ${num(plan.tokens_per_latent_frame, 0)} tokens/frame`);
    row("chunks", `${plan.chunks} of ${plan.chunk_frames}; peak ${plan.cached_chunks_peak} cached (${num(plan.cached_tokens_peak, 0)} tokens)`);
    const m = plan.model ?? {};
    if (m.source) {
      // the dimensions of the model the loader reads, not a preset's
      row("model", `${m.label}: ${m.layers} layers × ${m.heads} heads × ${m.head_dim}, read from ${m.source}`,
        { "data-jkv": "model-file", "data-layers": m.layers, "data-heads": m.heads, "data-head-dim": m.head_dim });
    }
    if (m.file_note) {
      // the loader's file could not be read (not downloaded yet, a GGUF, another model): the preset stands in
      row("model", `the preset's dimensions (${m.file_note})`, { "data-jkv": "model-file-note" });
    }
    if ((m.streams ?? 1) > 1 || m.context_frames) {
      // a model whose blocks keep several K/V streams, or whose recipe rebuilds a context before every chunk
      row("model", `${m.layers} blocks × ${m.streams} attention streams = ${m.cache_layers} cached layers`
        + (m.context_frames ? `; context rebuilt before every chunk from up to ${m.context_frames} latent frames` : ""),
      { "data-jkv": "streams", "data-streams": m.streams ?? 1, "data-context": m.context_frames ?? 0 });
    }
    if (m.kv_heads != null && m.kv_heads < m.heads) {
      // grouped-query attention (fewer K/V heads than query heads): the cache holds the K/V heads only
      row("K/V heads", `${m.kv_heads} of ${m.heads} (grouped-query)`,
        { "data-jkv": "kv-heads", "data-kv-heads": m.kv_heads,
          title: "Grouped-query attention: several query heads share one K/V head, and the cache holds the K/V heads only." });
    }
    row("BF16 cache", `${bytesText(plan.bf16_bytes)}`, { "data-jkv": "bf16", "data-bytes": plan.bf16_bytes });
    row("this setting", plan.runnable ? `${bytesText(plan.quantized_bytes)} (${num(plan.effective_bits, 3)} bits)` : "cannot run: see the warning above",
      { "data-jkv": "quant", "data-bytes": plan.quantized_bytes ?? "", class: plan.runnable ? "" : "jkv-error" });
    if (plan.runnable) row("saves", `${bytesText(plan.saved_bytes)} (${num(plan.bytes_ratio, 2)}× smaller)`, { "data-jkv": "saved" });
    if (plan.runnable && plan.ranks > 1) {
      // sequence parallelism: the rows above are one rank's (heads / ranks of every token)
      row("all ranks", `${bytesText(plan.quantized_bytes_all_ranks)} on ${plan.ranks} GPUs (BF16 ${bytesText(plan.bf16_bytes_all_ranks)}); the rows above are per GPU`,
        { "data-jkv": "all-ranks", "data-bytes": plan.quantized_bytes_all_ranks });
    }
    if (plan.runnable && plan.tiers) {
      // each held chunk at its own bits, oldest first (sink first): what the peak holds
      const bits = (list) => list.map((b) => (b ? b : "full")).join(" ");
      row("age tiers", `${plan.tiers}: keys ${bits(plan.chunk_bits_k)} · values ${bits(plan.chunk_bits_v)} bits (oldest first)`,
        { "data-jkv": "tiers", "data-bits": num(plan.effective_bits, 3) });
    }
    if (plan.runnable && plan.head_bits) {
      // precision by head: how many K/V heads of each layer keep their keys at the head bits
      row("precision by head", `keys of ${plan.promoted_heads} K/V head(s) per layer at ${plan.head_bits.split("@")[1]} bits `
        + `(those with the largest predicted bias) → keys ${num(plan.effective_bits_k, 3)} bits on average`,
        { "data-jkv": "head-bits", "data-bits": num(plan.effective_bits_k, 3) });
    }
    if (plan.runnable && plan.state_file_bytes != null && !m.context_frames) {  // a rebuilt context saves no cache
      row("cache file", `${bytesText(plan.state_file_bytes)} (Save KV Cache, to continue later)`,
        { "data-jkv": "state-file", "data-bytes": plan.state_file_bytes });
    }
    ui.summary.textContent = plan.runnable
      ? `Memory planner: ${bytesText(plan.quantized_bytes)} (BF16 ${bytesText(plan.bf16_bytes)})`
      : "Memory planner: cannot run (see warning)";
  } else {
    ui.summary.textContent = "Memory planner";
  }
  const r = req.report;
  ui.measured.textContent = r
    ? `last run (sampler): ${bytesText(r.cache_bytes)} measured, BF16 ${bytesText(r.bf16_bytes)}`
    : "";
  if (r) ui.measured.dataset.bytes = r.cache_bytes;
  const why = r && plan?.runnable ? mismatch(r, plan, req.plan) : null;
  if (why != null) {
    ui.measured.dataset.agrees = why.length ? "false" : "true";
    ui.measured.textContent += why.length
      ? ` — not the plan's ${bytesText(plan.quantized_bytes)}: ${why.join("; ")}`
      : " — as planned, to the byte";
  } else {
    delete ui.measured.dataset.agrees;
  }
  requestAnimationFrame(() => fitNode(node));
}

function mismatch(report, plan, asked) {
  // why a measured run and the plan differ: the settings the run reports that the plan took otherwise
  // (an empty list: they agree; the bytes differ only if nothing here explains it)
  if (report.cache_bytes === plan.quantized_bytes) return [];
  const m = plan.model ?? {};
  const why = [];
  const dims = (o) => `${o.layers} layers × ${o.heads} heads × ${o.head_dim}`;
  if (report.layers != null && (report.layers !== m.layers || report.heads !== m.heads || report.head_dim !== m.head_dim)) {
    why.push(`the run's model has ${dims(report)}, the plan ${dims(m)} (pick its preset or type them)`);
  }
  const pairs = [["chunk_frames", "chunk"], ["window_chunks", "window"], ["sink_chunks", "sink"], ["cfg_branches", "cfg branches"]];
  for (const [k, label] of pairs) {
    const planned = plan[k] ?? asked?.[k];
    if (report[k] != null && planned != null && Number(report[k]) !== Number(planned)) {
      why.push(`${label} ${report[k]} in the run, ${planned} in the plan`);
    }
  }
  if (report.key_bits != null && asked?.key_bits != null && String(report.key_bits) !== String(asked.key_bits)) {
    why.push(`the run's keys were ${report.key_bits === "off" ? "not quantized" : `INT${report.key_bits}`} (an older run, or another Quantize node)`);
  }
  if (!why.length) why.push("the video size or the precision differ (rerun after a change)");
  return why;
}

// ----------------------------------------------------------------------------------- sampler report
function attachReport(node) {
  injectStyle();
  const box = el("div", { class: "jkv-report", "data-jkv": "report",
    title: "What the KV cache cost in the last run of this node (measured by the sampler)." },
  el("div", { text: "KV cache report: run the workflow to see what the cache cost." }));
  addPanelWidget(node, REPORT, box, () => (node.jensenKvReport ? 96 + 16 * ((node.jensenKvReport.prompts?.length > 1 ? 1 : 0) + (node.jensenKvReport.state_file_bytes ? 1 : 0)) : 30));
  node.jensenKvReportBox = box;
}

function chunkNote(report) {
  // a first or last chunk shorter than chunk_frames, as the server's report lists them (chunk_lengths)
  const lens = report.chunk_lengths ?? [];
  const notes = [];
  if (lens.length > 1 && lens[0] !== report.chunk_frames) notes.push(`the first of ${lens[0]}`);
  if (lens.length > 1 && lens[lens.length - 1] !== report.chunk_frames) notes.push(`the last of ${lens[lens.length - 1]}`);
  return notes.length ? ` (${notes.join(", ")})` : "";
}

function showReport(node, report) {
  node.jensenKvReport = report;
  const box = node.jensenKvReportBox;
  if (!box) return;
  const spc = report.seconds_per_chunk ?? [];
  const total = spc.reduce((a, b) => a + b, 0);
  const bits = (b) => (b === "off" || b == null ? "BF16" : `INT${b}`);
  const quant = report.key_bits === "off" && report.value_bits === "off"
    ? "full precision"
    : `K ${bits(report.key_bits)} / V ${bits(report.value_bits)}, g${report.group_size}, ${report.rotation}`
      + (report.method === "qvg"
        ? `, QVG S=${report.qvg_stages} K=${report.qvg_centroids || `auto (${report.qvg_centroids_used ?? "?"})`}`
        : "");
  const corr = report.correction && report.correction !== "off" ? `, Jensen ${report.correction} ×${num(report.strength, 2)}` : "";
  const lines = [
    `KV cache ${bytesText(report.cache_bytes)} (BF16 ${bytesText(report.bf16_bytes)}) · ${num(report.effective_bits, 3)} bits`,
    `${quant}${corr}`,
    `${report.chunks} chunks × ${report.chunk_frames} latent frames${chunkNote(report)}, window ${report.window_chunks || "all"}${report.sink_chunks ? ` + sink ${report.sink_chunks}` : ""} · ${report.layers} layers × ${report.heads} heads${report.kv_heads != null && report.kv_heads < report.heads ? ` (${report.kv_heads} K/V)` : ""} × ${report.head_dim}, ${report.cfg_branches} cfg branch${report.cfg_branches > 1 ? "es" : ""}`,
  ];
  // the pack's sampler times each chunk; on core's sampler (KV Cache Report) core runs the loop
  if (spc.length) lines.push(`s/chunk: ${spc.map((s) => fmt(s, 2)).join(" ")} (total ${fmt(total, 2)} s)`);
  else if (report.sampler) lines.push(`sampler: ${report.sampler}, ${report.model_calls ?? "?"} model calls`);
  const prompts = report.prompts ?? [];
  if (prompts.length > 1) {
    lines.push("prompts: " + prompts.map((p) => `${p.label} @ chunk ${p.start_chunk}${p.recached_chunks ? ` (re-cached ${p.recached_chunks})` : ""}`).join(" · "));
  }
  // MAGI-1: which variant ran, and what said so (the file's metadata, its path, or the loader's variant input)
  if (report.variant_from) lines.push(`MAGI-1 ${report.distill ? "distill" : "base"} (from the ${report.variant_from})`);
  for (const w of report.warnings ?? []) lines.push(`⚠ ${w}`);
  if (report.state_file_bytes) lines.push(`kv_cache output: ${bytesText(report.state_file_bytes)} as a file`);
  const content = el("div", { "data-jkv": "report-text", "data-cache-bytes": report.cache_bytes, "data-bf16-bytes": report.bf16_bytes }, lines.join("\n"));
  box.replaceChildren(content);
  fitNode(node);
  requestAnimationFrame(() => fitNode(node)); // again once the browser has laid the text out
  // let planners that feed this sampler show the measured bytes next to their projection
  for (const q of quantNodes) if (q.graph === node.graph) schedule(q);
}

function nodeOfLocator(id) {
  // a node locator id: "<node id>" on the root graph, "<subgraph id>:<node id>" inside a subgraph
  const parts = String(id).split(":");
  const local = Number(parts.pop());
  const graph = parts.length ? app.graph?.subgraphs?.get?.(parts.join(":")) : app.graph;
  return graph?.getNodeById?.(local) ?? null;
}

// ------------------------------------------------------------------------------------- model folders
// The pack's loaders and the ComfyUI folder each reads (models/<folder>). ComfyUI's front end (1.45+, v0.27 and 0.33)
// names a missing model's folder from its "model to node" registry (the modelToNode store: folder -> loader node and
// widget, core's loaders only) and from the workflow's model entries (properties.models); a file with no entry (one
// made by tools/convert_checkpoint.py) on a loader it does not know shows as "Unknown". Registering the loaders
// names the folder there. The store has no public API: it is reached through the app's Pinia, and nothing happens
// where it or its getCategoryForNodeType is absent (1.27, ComfyUI v0.3.64, whose dialog reads only the entries) or
// where it already knows the loader.
const LOADER_FOLDERS = [
  ["diffusion_models", "JensenKVLoadMagi1", "model_name"],
  ["vae", "JensenKVLoadMagi1VAE", "vae_name"],
  ["diffusion_models", "JensenKVLoadWorldPlay", "unet_name"],
  ["diffusion_models", "JensenKVLoadLingBot", "unet_name"],
  ["diffusion_models", "JensenKVLoadARCheckpoint", "ckpt_name"],
];
let loaderFoldersRegistered = false;

function frontEndStore(id) {
  const vueApp = (document.querySelector("#vue-app") ?? document.querySelector("[data-v-app]"))?.__vue_app__;
  return vueApp?.config?.globalProperties?.$pinia?._s?.get?.(id) ?? null;
}

function registerLoaderFolders() {
  if (loaderFoldersRegistered) return;
  try {
    const models = frontEndStore("modelToNode");
    const defs = frontEndStore("nodeDef")?.nodeDefsByName;
    // getCategoryForNodeType is what the missing-model scan asks (1.45+); 1.27's registry lacks it and its dialog
    // reads only the model entries: nothing to do there
    if (typeof models?.registerNodeProvider !== "function" || typeof models.getCategoryForNodeType !== "function"
      || !defs || !Object.keys(defs).length) return;
    loaderFoldersRegistered = true;
    for (const [folder, node, widget] of LOADER_FOLDERS) {
      const nodeDef = defs[node];
      // the registry's defaults (core's loaders) come first, so a folder's first loader stays core's
      if (nodeDef && !models.getCategoryForNodeType(node)) models.registerNodeProvider(folder, { nodeDef, key: widget });
    }
  } catch (err) {
    console.warn("jensen_kv: could not register the loaders' model folders", err);
  }
}

// ------------------------------------------------------------------------------------- registration
app.registerExtension({
  name: "jensen_kv.ui",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData?.name === QUANT_NODE) {
      const created = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function (...args) {
        const r = created?.apply(this, args);
        try {
          attachQuantPanel(this);
        } catch (err) {
          console.error("jensen_kv: could not add the planner panel", err);
        }
        return r;
      };
      const configured = nodeType.prototype.onConfigure;
      nodeType.prototype.onConfigure = function (...args) {
        const r = configured?.apply(this, args);
        schedule(this);
        return r;
      };
      const removed = nodeType.prototype.onRemoved;
      nodeType.prototype.onRemoved = function (...args) {
        quantNodes.delete(this);
        return removed?.apply(this, args);
      };
    } else if (REPORT_NODES.has(nodeData?.name) || (nodeData?.output ?? []).includes(REPORT_TYPE)) {
      const created = nodeType.prototype.onNodeCreated;
      nodeType.prototype.onNodeCreated = function (...args) {
        const r = created?.apply(this, args);
        try {
          attachReport(this);
        } catch (err) {
          console.error("jensen_kv: could not add the report panel", err);
        }
        return r;
      };
      const executed = nodeType.prototype.onExecuted;
      nodeType.prototype.onExecuted = function (output) {
        const r = executed?.apply(this, arguments);
        const report = output?.[REPORT]?.[0];
        if (report) showReport(this, report);
        return r;
      };
    }
  },
  onNodeOutputsUpdated(outputs) {
    // the front end hands back the outputs it keeps with each workflow (a tab switched back to, a job's workflow
    // reopened from the queue): the report is one of them (the sampler's ui "jensen_kv_report"), so it comes back
    // with the images instead of vanishing
    for (const [id, out] of Object.entries(outputs ?? {})) {
      const report = out?.[REPORT]?.[0];
      if (!report) continue;
      const node = nodeOfLocator(id);
      if (node?.jensenKvReportBox && node.jensenKvReport !== report) showReport(node, report);
    }
  },
  beforeConfigureGraph() {
    registerLoaderFolders(); // before the front end looks for missing models in the graph it loads
  },
  setup() {
    registerLoaderFolders();
    // one cheap loop: re-ask the server only when a node's request would change (widgets, planner
    // inputs, or - when following the workflow - the latent and sampler values)
    setInterval(() => {
      for (const node of quantNodes) {
        if (!node.graph) { quantNodes.delete(node); continue; }
        const st = node.jensenKv;
        if (st && !st.busy && requestKey(node) !== st.key) refresh(node);
      }
    }, POLL_MS);
  },
});
