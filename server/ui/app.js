// The console's shell: tabs, the key fields, and starting/stopping the page that is shown.
import { getKey, setKey } from "./api.js";
import * as batches from "./batches.js";
import { clearError } from "./dom.js";
import * as metrics from "./metrics.js";
import * as models from "./models.js";
import * as playground from "./playground.js";
import * as usage from "./usage.js";

const pages = { models, metrics, usage, playground, batches };
let current = null;

function show(name) {
  if (!pages[name]) name = "models";
  if (current) pages[current].stop();
  current = name;
  for (const section of document.querySelectorAll(".page")) section.hidden = section.id !== `page-${name}`;
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.page === name);
  clearError();
  pages[name].start();
}

function setupKeys() {
  const admin = document.getElementById("admin-key");
  const api = document.getElementById("api-key");
  admin.value = getKey("admin");
  api.value = getKey("api");
  document.getElementById("keys").addEventListener("submit", (event) => {
    event.preventDefault();
    setKey("admin", admin.value.trim());
    setKey("api", api.value.trim());
    show(current); // reload the page's data with the new keys
  });
  document.getElementById("forget-keys").addEventListener("click", () => {
    admin.value = api.value = "";
    setKey("admin", "");
    setKey("api", "");
    show(current);
  });
}

setupKeys();
models.setup();
metrics.setup();
usage.setup();
playground.setup();
batches.setup();
for (const tab of document.querySelectorAll(".tab")) {
  tab.addEventListener("click", () => {
    location.hash = tab.dataset.page;
  });
}
window.addEventListener("hashchange", () => show(location.hash.slice(1)));
show(location.hash.slice(1));
