// The language-model page: the controls, the progress bar and the chat view. All GPU work
// runs in llm_worker.js, so the page stays responsive while a model loads or answers.

const $ = (sel) => document.querySelector(sel);
const worker = new Worker("/static/llm_worker.js", { type: "module" });
const pending = new Map();
let nextId = 1;
let serverModel = null;
const messages = [];

// One request to the worker: resolves with its "done" answer, rejects with its error;
// `onEvent` gets its progress and text messages.
function ask(type, payload = {}, onEvent = () => {}) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject, onEvent });
    worker.postMessage({ id, type, ...payload });
  });
}

worker.onmessage = (event) => {
  const msg = event.data;
  if (msg.type === "lost") return lose(msg.message);
  if (msg.type === "gpu-error") return status(msg.message, "error");
  const entry = pending.get(msg.id);
  if (!entry) return undefined;
  if (msg.type === "done") { pending.delete(msg.id); entry.resolve(msg); }
  else if (msg.type === "error") { pending.delete(msg.id); entry.reject(new Error(msg.message)); }
  else entry.onEvent(msg);
  return undefined;
};
worker.onerror = (e) => fail(`the model's worker failed: ${e.message}`);

function status(text, state) {
  const box = $("#llm-status");
  if (box.dataset.state === "lost") return;  // what follows a loss says less
  box.textContent = text;
  box.dataset.state = state;
}

function fail(message) {
  status(message, "error");
  for (const [, entry] of pending) entry.reject(new Error(message));
  pending.clear();
}

// The device is gone: say so and what to do, and offer nothing that would need it.
function lose(message) {
  fail(message);
  $("#llm-status").dataset.state = "lost";
  setChat(false);
  for (const control of document.querySelectorAll("#llm-server, #llm-file, #llm-url-load")) control.disabled = true;
}

function progress(msg) {
  const bar = $("#llm-progress");
  const text = $("#llm-progress-text");
  const mb = (n) => `${(n / 1e6).toFixed(1)} MB`;
  if (msg.stage === "download" || msg.stage === "cached") bar.dataset.source = msg.stage;
  if (msg.stage === "download") {
    bar.max = msg.total || msg.done;
    bar.value = msg.done;
    text.textContent = `downloading ${mb(msg.done)}${msg.total ? ` of ${mb(msg.total)}` : ""}`;
  } else if (msg.stage === "upload") {
    bar.max = msg.total;
    bar.value = msg.done;
    text.textContent = `uploading weights to the GPU: ${mb(msg.done)} of ${mb(msg.total)}`;
  } else if (msg.stage === "cached") {
    bar.max = 1;
    bar.value = 1;
    text.textContent = "read from the browser's cache";
  } else if (msg.stage === "plan") {
    text.textContent = "the server records the model's plan...";
  } else if (msg.message) {
    text.textContent = msg.message;
  }
}

async function load(source) {
  status(`loading ${source.name || source.url || "the model"}...`, "loading");
  setChat(false);
  try {
    const m = await ask("load", { source }, progress);
    $("#llm-progress-text").textContent = "the weights are on the GPU";
    status(`${m.name}: ${m.architecture}, ${m.layers} layers, vocabulary ${m.vocab.toLocaleString("en-US")}, ` +
      `context ${m.context.toLocaleString("en-US")} in the page; ${m.dispatchesPerToken} dispatches a token`, "ready");
    messages.length = 0;
    $("#llm-chat").replaceChildren();
    setChat(true);
    return m;
  } catch (e) {
    status(e.message, "error");
    throw e;
  }
}

function setChat(on) {
  $("#llm-input").disabled = !on;
  $("#llm-send").disabled = !on;
}

function bubble(role, text) {
  const node = document.createElement("div");
  node.className = `msg ${role}`;
  node.textContent = text;
  $("#llm-chat").append(node);
  return node;
}

async function send(text, maxTokens = 64) {
  messages.push({ role: "user", content: text });
  bubble("user", text);
  const answer = bubble("assistant", "...");
  answer.dataset.state = "running";
  setChat(false);
  const speed = (m) => `prefill ${m.prefillTokensPerSecond.toFixed(1)} tokens/s, decode ${m.decodeTokensPerSecond.toFixed(1)} tokens/s`;
  try {
    const done = await ask("chat", { messages, maxTokens }, (m) => {
      if (m.type === "text") { answer.textContent = m.text; $("#llm-speed").textContent = `${m.tokens} tokens; ${speed(m)}`; }
    });
    answer.textContent = done.text;
    answer.dataset.state = "done";
    $("#llm-speed").textContent = `${done.tokens.length} tokens; ${speed(done)}`;
    messages.push({ role: "assistant", content: done.text });
    return done;
  } catch (e) {
    answer.dataset.state = "error";
    answer.textContent = `error: ${e.message}`;
    throw e;
  } finally {
    setChat(true);
  }
}

async function start() {
  const info = await fetch("/api/info").then((r) => r.json());
  const params = new URLSearchParams(location.search);
  try {
    const opened = await ask("open", { session: info.session, declineSubgroups: params.get("subgroups") === "0" });
    $("#llm-gpu").textContent = `WebGPU: ${opened.adapter}; kernels use ${opened.features.join(", ") || "no optional features"}`;
    $("#llm-gpu").dataset.state = "ok";
  } catch (e) {
    $("#llm-gpu").textContent = e.message;
    $("#llm-gpu").dataset.state = "missing";
    status("no model can run without WebGPU", "error");
    return;
  }
  const llm = await fetch("/api/llm/info").then((r) => r.json());
  serverModel = llm.server_model;
  const button = $("#llm-server");
  if (serverModel) {
    button.disabled = false;
    button.textContent = `load the server's model (${serverModel.name}, ${(serverModel.size / 1e6).toFixed(0)} MB)`;
    button.onclick = () => load({ kind: "url", ...serverModel }).catch(() => {});
  } else {
    button.textContent = "the server has no model";
  }
  $("#llm-file").onchange = (e) => {
    const file = e.target.files[0];
    if (file) load({ kind: "file", file, name: file.name }).catch(() => {});
  };
  const drop = $("#llm-drop");
  drop.ondragover = (e) => { e.preventDefault(); drop.classList.add("over"); };
  drop.ondragleave = () => drop.classList.remove("over");
  drop.ondrop = (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    const file = e.dataTransfer.files[0];
    if (file) load({ kind: "file", file, name: file.name }).catch(() => {});
  };
  $("#llm-url-load").onclick = () => load({ kind: "url", url: $("#llm-url").value }).catch(() => {});
  $("#llm-form").onsubmit = (e) => {
    e.preventDefault();
    const text = $("#llm-input").value.trim();
    if (text) { $("#llm-input").value = ""; send(text).catch(() => {}); }
  };
  status("no model loaded", "idle");
  document.body.dataset.ready = "1";
}

// For tests and scripts: load a model, run greedy tokens after ids, chat.
window.pxvmLlm = {
  loadServer: () => load({ kind: "url", ...serverModel }),
  loadUrl: (url) => load({ kind: "url", url }),
  generate: (ids, n) => ask("generate", { ids, n }),
  send,
};

start();
