// Metrics: per model, the last minutes of requests/s, tokens/s, TTFT p50/p95, running/waiting
// and replicas ready, from GET /admin/metrics; redrawn every 5 s.
import { call, poller } from "./api.js";
import { lineChart } from "./chart.js";
import { clearError, el, fillSelect, showError } from "./dom.js";

const REFRESH_MS = 5000;
let last = null;

const CHARTS = [
  { title: "Requests / s", lines: [{ key: "requests_per_s", name: "requests/s" }] },
  { title: "Generated tokens / s", lines: [{ key: "tokens_per_s", name: "tokens/s" }] },
  {
    title: "Time to first token",
    unit: " ms",
    scale: 1000,
    lines: [
      { key: "ttft_p50_s", name: "p50" },
      { key: "ttft_p95_s", name: "p95", cls: "second" },
    ],
  },
  {
    title: "Requests in flight",
    lines: [
      { key: "running", name: "running" },
      { key: "waiting", name: "waiting", cls: "second" },
    ],
  },
  { title: "Replicas ready", lines: [{ key: "replicas_ready", name: "ready" }] },
];

export function setup() {
  document.getElementById("metrics-model").addEventListener("change", draw);
}

export const { start, stop } = poller(refresh, REFRESH_MS);

async function refresh() {
  try {
    last = await call("admin", "/admin/metrics");
  } catch (error) {
    showError(`Cannot read metrics: ${error.message}`);
    return;
  }
  clearError();
  fillSelect(document.getElementById("metrics-model"), Object.keys(last.models).sort());
  draw();
}

function draw() {
  const charts = document.getElementById("charts");
  const series = last && last.models[document.getElementById("metrics-model").value];
  if (!series) {
    charts.replaceChildren(el("p", { class: "hint", text: "No samples yet: the first arrive 10 s after the gateway starts." }));
    return;
  }
  charts.replaceChildren(
    ...CHARTS.map((chart) => {
      const scale = chart.scale || 1;
      const lines = chart.lines.map((l) => ({
        name: l.name,
        cls: l.cls,
        values: series[l.key].map((v) => (v === null ? null : v * scale)),
      }));
      const legend = el("p", { class: "legend" }, ...lines.map((l) => el("span", { class: `key ${l.cls || ""}`, text: l.name })));
      return el("figure", { class: "card" }, el("figcaption", { text: chart.title }), lineChart(chart.title, series.t, lines, chart.unit || ""), legend);
    }),
  );
}
