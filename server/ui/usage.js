// Usage: tokens per key per UTC day over the last 30 days, from GET /admin/usage
// (group_by=key,day): a line per key (the five heaviest; the rest as "others") and a table of
// totals. Redrawn every 30 s: the ledger writes usage within a second of a request's end.
import { call, poller } from "./api.js";
import { lineChart } from "./chart.js";
import { clearError, el, showError } from "./dom.js";

const REFRESH_MS = 30000;
const DAYS = 30;
const SHOWN = 5;
const CLASSES = ["", "second", "third", "fourth", "fifth", "others"];

export function setup() {}

export const { start, stop } = poller(refresh, REFRESH_MS);

function dayStart(date) {
  return Date.parse(`${date}T00:00:00Z`) / 1000;
}

async function refresh() {
  const since = new Date(Date.now() - (DAYS - 1) * 86400000).toISOString().slice(0, 10);
  let body;
  try {
    body = await call("admin", `/admin/usage?group_by=key,day&since=${since}`);
  } catch (error) {
    showError(`Cannot read usage: ${error.message}`);
    return;
  }
  clearError();
  draw(body.data, since);
}

function draw(rows, since) {
  const figure = document.getElementById("usage-chart");
  const table = document.getElementById("usage-keys");
  if (!rows.length) {
    figure.replaceChildren(el("p", { class: "hint", text: `No usage since ${since}.` }));
    table.replaceChildren();
    return;
  }
  const totals = new Map();
  for (const row of rows) {
    const t = totals.get(row.key_id) || { requests: 0, prompt: 0, completion: 0 };
    t.requests += row.requests;
    t.prompt += row.prompt_tokens;
    t.completion += row.completion_tokens;
    totals.set(row.key_id, t);
  }
  const keys = [...totals.keys()].sort((a, b) => totals.get(b).prompt + totals.get(b).completion - (totals.get(a).prompt + totals.get(a).completion));
  const shown = keys.slice(0, SHOWN);
  const days = [...new Set(rows.map((r) => r.day))].sort();
  const times = days.map(dayStart);
  const index = new Map(days.map((d, i) => [d, i]));
  const lineOf = (name, cls) => ({ name, cls, values: days.map(() => 0) });
  const lines = shown.map((key, i) => lineOf(key, CLASSES[i]));
  const others = lineOf("others", "others");
  for (const row of rows) {
    const i = shown.indexOf(row.key_id);
    (i >= 0 ? lines[i] : others).values[index.get(row.day)] += row.total_tokens;
  }
  if (keys.length > SHOWN) lines.push(others);
  const legend = el("p", { class: "legend" }, ...lines.map((l) => el("span", { class: `key ${l.cls}`, text: l.name })));
  figure.replaceChildren(
    el("figcaption", { text: "Tokens per day (prompt + completion)" }),
    lineChart("Tokens per day by key", times, lines, "", "days"),
    legend,
  );
  table.replaceChildren(
    ...keys.map((key) => {
      const t = totals.get(key);
      return el(
        "tr",
        { "data-key": key },
        el("td", { text: key }),
        el("td", { text: String(t.requests) }),
        el("td", { text: String(t.prompt) }),
        el("td", { text: String(t.completion) }),
        el("td", { text: String(t.prompt + t.completion) }),
      );
    }),
  );
}
