// Building DOM nodes. Text always goes in through textContent (never innerHTML): model names,
// aliases, errors and generated text are data, not markup.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

export function setText(node, text) {
  node.textContent = text;
}

// Refill a <select> with ids, keeping the current choice when it is still there.
export function fillSelect(select, ids) {
  const current = select.value;
  select.replaceChildren(...ids.map((id) => el("option", { value: id, text: id })));
  if (ids.includes(current)) select.value = current;
}

const banner = () => document.getElementById("banner");

export function showError(message) {
  banner().textContent = message;
  banner().hidden = false;
}

export function clearError() {
  banner().hidden = true;
  banner().textContent = "";
}
