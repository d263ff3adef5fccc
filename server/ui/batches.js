// Batches: the API key's batches (GET /v1/batches, newest first) with a progress bar each,
// refreshed every 2 s; cancel one. Like every /v1 call, it shows the batches of the API key typed
// above (or all of an open gateway's).
import { call, poller } from "./api.js";
import { clearError, el, showError } from "./dom.js";

const REFRESH_MS = 2000;
const FINAL = new Set(["completed", "failed", "expired", "cancelled"]);

export function setup() {}

export const { start, stop } = poller(refresh, REFRESH_MS);

async function refresh() {
  let list;
  try {
    list = await call("api", "/v1/batches?limit=100");
  } catch (error) {
    showError(`Cannot list batches: ${error.message}`);
    return;
  }
  clearError();
  document.getElementById("batches").replaceChildren(...list.data.map(row));
  document.getElementById("no-batches").hidden = list.data.length > 0;
}

function row(batch) {
  const counts = batch.request_counts || { total: 0, completed: 0, failed: 0 };
  const done = counts.completed + counts.failed;
  const bar = el("progress", { max: String(Math.max(counts.total, 1)), value: String(done) });
  const created = new Date(batch.created_at * 1000).toLocaleString();
  const files = [batch.output_file_id, batch.error_file_id].filter(Boolean).join(", ");
  const cancel = el("button", {
    type: "button",
    class: "danger",
    text: "Cancel",
    onclick: async () => {
      cancel.disabled = true;
      try {
        await call("api", `/v1/batches/${encodeURIComponent(batch.id)}/cancel`, { method: "POST" });
        await refresh();
      } catch (error) {
        showError(`Cannot cancel ${batch.id}: ${error.message}`);
      }
    },
  });
  cancel.hidden = FINAL.has(batch.status) || batch.status === "cancelling";
  return el(
    "tr",
    {},
    el("td", { text: batch.id }),
    el("td", { text: created }),
    el("td", { text: batch.endpoint }),
    el("td", { class: "state", "data-state": batch.status, text: batch.status }),
    el("td", {}, bar, ` ${done}/${counts.total} (${counts.failed} failed)`),
    el("td", { class: "about", text: files }),
    el("td", {}, cancel),
  );
}
