// A small SVG line chart: one or two series over time, a zero-based y axis with its top value,
// and the time span on the x axis. No library.

const NS = "http://www.w3.org/2000/svg";
const W = 320;
const H = 120;
const PAD = { left: 58, right: 8, top: 8, bottom: 18 };

function svg(tag, attrs = {}) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function label(x, y, text, anchor = "start") {
  const node = svg("text", { x, y, "text-anchor": anchor, class: "tick" });
  node.textContent = text;
  return node;
}

export function format(value) {
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) >= 100) return value.toFixed(0);
  if (Math.abs(value) >= 1) return value.toFixed(1);
  return value.toPrecision(2);
}

// times: Unix seconds; lines: [{name, values (null = no data), cls}]; unit appended to the top value;
// span: how the x axis names the time it covers ("minutes", or "days" for daily points).
export function lineChart(title, times, lines, unit = "", span = "minutes") {
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "aria-label": title });
  const numbers = lines.flatMap((l) => l.values.filter((v) => v !== null));
  const top = Math.max(1e-9, ...numbers) * 1.1;
  const t0 = times.length ? times[0] : 0;
  const t1 = times.length ? times[times.length - 1] : 1;
  const x = (t) => PAD.left + ((t - t0) / Math.max(t1 - t0, 1)) * (W - PAD.left - PAD.right);
  const y = (v) => H - PAD.bottom - (v / top) * (H - PAD.top - PAD.bottom);
  root.append(
    svg("line", { x1: PAD.left, y1: y(0), x2: W - PAD.right, y2: y(0), class: "axis" }),
    svg("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: y(0), class: "axis" }),
    label(PAD.left - 4, PAD.top + 8, `${format(numbers.length ? Math.max(...numbers) : 0)}${unit}`, "end"),
    label(PAD.left - 4, y(0), "0", "end"),
  );
  if (times.length > 1 && span === "days") {
    const days = Math.round((t1 - t0) / 86400);
    root.append(label(PAD.left, H - 4, `${days} days`), label(W - PAD.right, H - 4, "today", "end"));
  } else if (times.length > 1) {
    const minutes = (t1 - t0) / 60;
    root.append(label(PAD.left, H - 4, `−${minutes.toFixed(minutes < 2 ? 1 : 0)} min`), label(W - PAD.right, H - 4, "now", "end"));
  }
  for (const line of lines) {
    // A gap (null) breaks the line rather than drawing it down to zero.
    let d = "";
    let pen = false;
    line.values.forEach((v, i) => {
      if (v === null) {
        pen = false;
        return;
      }
      d += `${pen ? "L" : "M"}${x(times[i]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    if (d) root.append(svg("path", { d, class: `series ${line.cls || ""}` }));
    // A point with no neighbour draws no line: mark it with a dot.
    line.values.forEach((v, i) => {
      const alone = (j) => j < 0 || j >= line.values.length || line.values[j] === null;
      if (v !== null && alone(i - 1) && alone(i + 1)) {
        root.append(svg("circle", { cx: x(times[i]).toFixed(1), cy: y(v).toFixed(1), r: 2, class: `dot ${line.cls || ""}` }));
      }
    });
  }
  return root;
}
