// Models: every deployment with its state and replicas, refreshed every 2 s; deploy, scale and
// undeploy through /admin.
import { call, poller } from "./api.js";
import { clearError, el, setText, showError } from "./dom.js";

const REFRESH_MS = 2000;
const cards = new Map(); // deployment name -> its card's nodes, kept across refreshes

export function setup() {
  document.getElementById("deploy-form").addEventListener("submit", deploy);
}

export const { start, stop } = poller(refresh, REFRESH_MS);

async function refresh() {
  let list;
  try {
    list = await call("admin", "/admin/deployments");
  } catch (error) {
    showError(`Cannot list deployments: ${error.message}`);
    return;
  }
  clearError();
  const names = new Set(list.data.map((d) => d.name));
  for (const [name, card] of cards) {
    if (!names.has(name)) {
      card.root.remove();
      cards.delete(name);
    }
  }
  const container = document.getElementById("deployments");
  for (const status of list.data) {
    let card = cards.get(status.name);
    if (!card) {
      card = makeCard(status.name);
      cards.set(status.name, card);
      container.append(card.root);
    }
    update(card, status);
  }
  document.getElementById("no-deployments").hidden = list.data.length > 0;
}

function makeCard(name) {
  const card = {
    title: el("h3", { text: name }),
    aliases: el("span", { class: "aliases" }),
    state: el("span", { class: "state" }),
    counts: el("span", { class: "counts" }),
    about: el("span", { class: "about" }),
    download: el("div", { class: "download" }),
    error: el("p", { class: "error" }),
    replicas: el("tbody"),
    scale: el("input", { type: "number", min: "1", max: "64", value: "1", "aria-label": "replicas" }),
    result: el("span", { class: "result" }),
  };
  const table = el(
    "table",
    { class: "replicas" },
    el("thead", {}, el("tr", {}, ...["replica", "node", "state", "since", "download", "error"].map((h) => el("th", { text: h })))),
    card.replicas,
  );
  const actions = el(
    "div",
    { class: "actions" },
    el("label", {}, "Replicas ", card.scale),
    el("button", { type: "button", class: "scale", onclick: () => scale(name, card) }, "Scale"),
    el("button", { type: "button", class: "undeploy danger", onclick: () => undeploy(name, card) }, "Undeploy"),
    card.result,
  );
  card.root = el(
    "article",
    { class: "deployment", "data-name": name },
    el("div", { class: "head" }, card.title, card.state, card.counts, card.aliases),
    card.about,
    card.download,
    card.error,
    table,
    actions,
  );
  card.scale.dataset.touched = "";
  card.scale.addEventListener("input", () => (card.scale.dataset.touched = "1"));
  return card;
}

function update(card, status) {
  const spec = status.spec;
  setText(card.state, status.updating ? `${status.state} (updating)` : status.state);
  card.state.dataset.state = status.state;
  setText(card.counts, `${status.ready}/${status.desired} ready · ${status.restarts} restarts`);
  setText(card.aliases, spec.aliases.length ? `aliases: ${spec.aliases.join(", ")}` : "");
  setText(card.about, `${spec.backend} · ${spec.task} · ${spec.num_cpus} CPU${spec.num_gpus ? ` · ${spec.num_gpus} GPU` : ""}`);
  // While a replica downloads its Hub weights, the deployment's least advanced download.
  const downloading = status.state === "downloading" && status.download;
  card.download.replaceChildren(...(downloading ? downloadBar(status.download) : []));
  card.download.hidden = !downloading;
  setText(card.error, status.error || "");
  card.error.hidden = !status.error;
  if (!card.scale.dataset.touched) card.scale.value = String(status.desired);
  card.replicas.replaceChildren(
    ...status.replicas.map((r) =>
      el(
        "tr",
        { "data-state": r.state },
        el("td", { text: r.id }),
        el("td", { text: r.node_id ? r.node_id.slice(0, 12) : "–", title: r.node_id || "" }),
        el("td", { class: "state", "data-state": r.state, text: r.state }),
        el("td", { text: new Date(r.since * 1000).toLocaleTimeString() }),
        el("td", { class: "download" }, ...(r.download ? downloadBar(r.download) : [])),
        el("td", { class: "error", text: r.error || "" }),
      ),
    ),
  );
}

// A download's bar and its words: bytes done / total and the rate (docs/model-sources.md).
function downloadBar(d) {
  const total = Math.max(d.bytes_total, 1);
  const bar = el("progress", { max: String(total), value: String(Math.min(d.bytes_done, total)) });
  let words = `${bytes(d.bytes_done)} / ${bytes(d.bytes_total)}`;
  if (d.cached) words = `${bytes(d.bytes_total)} · from the node's cache`;
  else if (d.done) words += " · done";
  else words += ` · ${bytes(d.bytes_per_s)}/s`;
  return [bar, el("span", { class: "words", text: words, title: `${d.hub}:${d.repo}@${d.revision}` })];
}

function bytes(n) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000;
    i += 1;
  }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

async function scale(name, card) {
  const replicas = Number(card.scale.value);
  setText(card.result, "scaling…");
  try {
    await call("admin", `/admin/deployments/${encodeURIComponent(name)}`, { method: "PATCH", body: { replicas } });
    card.scale.dataset.touched = "";
    setText(card.result, `asked for ${replicas}`);
    refresh();
  } catch (error) {
    setText(card.result, error.message);
  }
}

async function undeploy(name, card) {
  setText(card.result, "draining…");
  try {
    const result = await call("admin", `/admin/deployments/${encodeURIComponent(name)}?timeout=30`, {
      method: "DELETE",
    });
    setText(document.getElementById("deploy-result"), `${result.name} undeployed (${result.drained ? "drained" : "requests cut short"} in ${result.seconds.toFixed(1)} s)`);
    refresh();
  } catch (error) {
    setText(card.result, error.message);
  }
}

// The form becomes a ModelConfig (protocol/config.py); the gateway validates it and says what is wrong.
function specFrom(form) {
  const f = new FormData(form);
  const text = (k) => String(f.get(k) || "").trim();
  const spec = {
    name: text("name"),
    backend: text("backend"),
    task: text("task"),
    replicas: Number(text("replicas") || 1),
    num_cpus: Number(text("num_cpus") || 1),
  };
  const aliases = text("aliases").split(",").map((a) => a.trim()).filter(Boolean);
  if (aliases.length) spec.aliases = aliases;
  if (text("path")) spec.source = { path: text("path") };
  else if (text("package")) spec.source = { package: text("package"), file: text("file") };
  if (text("engine")) spec.engine = JSON.parse(text("engine"));
  return spec;
}

async function deploy(event) {
  event.preventDefault();
  const out = document.getElementById("deploy-result");
  out.classList.remove("error");
  let spec;
  try {
    spec = specFrom(event.target);
  } catch (error) {
    out.classList.add("error");
    setText(out, `Engine options are not JSON: ${error.message}`);
    return;
  }
  setText(out, `deploying ${spec.name}…`);
  try {
    const status = await call("admin", "/admin/deployments", { method: "POST", body: spec });
    setText(out, `${status.name} accepted: ${status.state}`);
    refresh();
  } catch (error) {
    out.classList.add("error");
    setText(out, error.message);
  }
}
