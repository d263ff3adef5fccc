// Playground: a streamed chat (TTFT and tokens/s measured in the page), an embeddings try-out and
// a rerank try-out, through /v1 with the API key from the header.
import { call, sse } from "./api.js";
import { el, fillSelect, setText, showError, clearError } from "./dom.js";

let history = []; // the conversation so far, as OpenAI messages
let controller = null; // aborts the stream in flight
let vision = new Set(); // the models that read images (`vision: true` in /v1/models)

export function setup() {
  document.getElementById("chat-form").addEventListener("submit", send);
  document.getElementById("chat-stop").addEventListener("click", () => controller && controller.abort());
  document.getElementById("chat-clear").addEventListener("click", () => {
    history = [];
    document.getElementById("transcript").replaceChildren();
    setText(document.getElementById("chat-stats"), "");
  });
  document.getElementById("chat-model").addEventListener("change", showImagePicker);
  document.getElementById("embed-form").addEventListener("submit", embed);
  document.getElementById("rerank-form").addEventListener("submit", rerank);
}

// Rerank answers on embedding models (by cosine) and cross-encoders, never on a chat model.
const RERANKS = new Set(["embed", "rerank"]);

export async function start() {
  try {
    const list = await call("api", "/v1/models");
    const ids = list.data.map((m) => m.id);
    fillSelect(document.getElementById("chat-model"), ids);
    vision = new Set(list.data.filter((m) => m.vision).map((m) => m.id));
    showImagePicker();
    fillSelect(document.getElementById("embed-model"), ids);
    fillSelect(document.getElementById("rerank-model"), list.data.filter((m) => RERANKS.has(m.task)).map((m) => m.id));
    clearError();
  } catch (error) {
    showError(`Cannot list models: ${error.message}`);
  }
}

export function stop() {}

// The image picker shows for a model that reads images only; switching away drops the choice.
function showImagePicker() {
  const sees = vision.has(document.getElementById("chat-model").value);
  document.getElementById("chat-image-row").hidden = !sees;
  if (!sees) document.getElementById("chat-image").value = "";
}

// The picked file as a data: URL, which the gateway reads like any client's (docs/vision.md).
function dataUrl(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

function turn(role, text) {
  const body = el("div", { class: "text", text });
  const node = el("div", { class: `turn ${role}` }, el("span", { class: "role", text: role }), body);
  document.getElementById("transcript").append(node);
  return body;
}

async function send(event) {
  event.preventDefault();
  const form = event.target;
  const f = new FormData(form);
  const message = String(f.get("message") || "");
  const system = String(f.get("system") || "").trim();
  const picker = document.getElementById("chat-image");
  const file = !document.getElementById("chat-image-row").hidden && picker.files && picker.files[0];
  const content = file
    ? [{ type: "image_url", image_url: { url: await dataUrl(file) } }, { type: "text", text: message }]
    : message;
  const messages = [...(system ? [{ role: "system", content: system }] : []), ...history, { role: "user", content }];
  const body = {
    model: String(f.get("model")),
    messages,
    temperature: Number(f.get("temperature")),
    max_tokens: Number(f.get("max_tokens")),
    stream: true,
    stream_options: { include_usage: true },
  };
  turn("user", file ? `[${file.name}] ${message}` : message);
  const answer = turn("assistant", "");
  answer.classList.add("streaming");
  const stats = document.getElementById("chat-stats");
  const sendButton = document.getElementById("chat-send");
  const stopButton = document.getElementById("chat-stop");
  sendButton.disabled = true;
  stopButton.disabled = false;
  controller = new AbortController();
  const started = performance.now();
  let first = null;
  let text = "";
  let tokens = null;
  let chunks = 0;
  setText(stats, "waiting for the first token…");
  try {
    const response = await call("api", "/v1/chat/completions", { method: "POST", body, raw: true, signal: controller.signal });
    for await (const chunk of sse(response)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      const piece = chunk.choices && chunk.choices[0] && chunk.choices[0].delta.content;
      if (!piece) continue;
      if (first === null) first = performance.now();
      chunks += 1;
      text += piece;
      answer.textContent = text; // text, never markup
    }
    history.push({ role: "user", content }, { role: "assistant", content: text });
    form.elements.message.value = "";
    picker.value = "";
  } catch (error) {
    if (error.name !== "AbortError") {
      answer.classList.add("error");
      answer.textContent = text ? `${text}\n[${error.message}]` : error.message;
    }
  } finally {
    answer.classList.remove("streaming");
    sendButton.disabled = false;
    stopButton.disabled = true;
    controller = null;
  }
  const end = performance.now();
  const ttft = first === null ? null : first - started;
  const count = tokens ?? chunks;
  const rate = first !== null && end > first && count > 1 ? ((count - 1) * 1000) / (end - first) : null;
  setText(
    stats,
    `TTFT ${ttft === null ? "–" : `${ttft.toFixed(0)} ms`} · ${count} tokens · ${rate === null ? "–" : `${rate.toFixed(1)} tokens/s`}`,
  );
}

async function embed(event) {
  event.preventDefault();
  const f = new FormData(event.target);
  const out = document.getElementById("embed-result");
  out.classList.remove("error");
  setText(out, "embedding…");
  try {
    const result = await call("api", "/v1/embeddings", {
      method: "POST",
      body: { model: String(f.get("model")), input: String(f.get("input")) },
    });
    const vector = result.data[0].embedding;
    const norm = Math.sqrt(vector.reduce((s, v) => s + v * v, 0));
    setText(
      out,
      `${vector.length} dimensions · norm ${norm.toFixed(3)} · ${result.usage.prompt_tokens} tokens\n` +
        `[${vector.slice(0, 8).map((v) => v.toFixed(4)).join(", ")}${vector.length > 8 ? ", …" : ""}]`,
    );
  } catch (error) {
    out.classList.add("error");
    setText(out, error.message);
  }
}

async function rerank(event) {
  event.preventDefault();
  const f = new FormData(event.target);
  const out = document.getElementById("rerank-result");
  const documents = String(f.get("documents")).split("\n").map((d) => d.trim()).filter(Boolean);
  const topN = String(f.get("top_n") || "").trim();
  const body = { model: String(f.get("model")), query: String(f.get("query")), documents };
  if (topN) body.top_n = Number(topN);
  out.replaceChildren(el("p", { class: "hint", text: "reranking…" }));
  try {
    const result = await call("api", "/v1/rerank", { method: "POST", body });
    const head = el("tr", {}, ...["#", "index", "score", "document"].map((h) => el("th", { text: h })));
    const rows = result.results.map((r, rank) =>
      el(
        "tr",
        {},
        el("td", { text: rank + 1 }),
        el("td", { class: "index", text: r.index }),
        el("td", { class: "score", text: r.relevance_score.toFixed(4) }),
        el("td", { class: "document", text: r.document ? r.document.text : documents[r.index] }),
      ),
    );
    out.replaceChildren(el("table", { class: "ranking" }, el("thead", {}, head), el("tbody", {}, ...rows)));
  } catch (error) {
    out.replaceChildren(el("p", { class: "error", text: error.message }));
  }
}
